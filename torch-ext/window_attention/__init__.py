"""window-attention: fused attention with an additive bias, masks, Swin relative-position tables and dBias.

Load it with `kernels.get_kernel("winattn/window-attention", version=1)` or `winattn.load()`.
`reference` holds the pure-PyTorch implementation with the same API (low-level ops included).

Only the names in `__all__` are the kernel's API; `API_VERSION` changes when one of them changes incompatibly, and
`winattn` refuses a fetched kernel whose API_VERSION it does not speak (`winattn.load`).
"""

from . import layers, reference
from .interface import BUILD_DEVICE, attention, attention_backward, attention_forward, window_attention

API_VERSION = 1

__all__ = [
    # High-level API (with autograd)
    "attention",
    "window_attention",
    "layers",
    # Low-level ops (no autograd): out + lse forward, dq/dk/dv/dbias backward
    "attention_forward",
    "attention_backward",
    # What this build is
    "BUILD_DEVICE",
    "API_VERSION",
    # Pure-PyTorch twin of all of the above
    "reference",
]
