"""Embedded Hugging Face Hub-compatible server: publish kernels to it and load them back with the unmodified
`huggingface_hub` and `kernels` clients when the real Hub is out of reach.

`HubServer` (server.py) runs it on a background thread; `winattn hub serve` (cli.py) runs it in the foreground.
"""

from .server import HubServer

__all__ = ["HubServer"]
