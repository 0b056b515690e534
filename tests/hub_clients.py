"""Point the real `huggingface_hub` and `kernels` clients of this test process (and its children) at a Hub URL.

huggingface_hub copies HF_ENDPOINT, HF_HOME and friends into `huggingface_hub.constants` once at import, and kernels
0.17.2 keeps its own `CACHE_DIR` copies, so setting the environment alone reaches only child processes. This
patches both, isolates every cache and token file under `home`, and returns the environment for children.
Shared by the hub, publish, integration and matrix tests (importable because pytest puts tests/ on sys.path).
`running_hub` is the one embedded-Hub fixture body: the hub, publish and loader folders' `hub` fixtures differ only in
their trusted org and whether this process's clients are pointed at it.
"""

import contextlib
import importlib
import os
import sys
from pathlib import Path

# Variables that would send clients elsewhere, authenticate them, or switch them offline.
_UNSET = (
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "LOCAL_KERNELS", "KERNELS_CACHE",
    # kernels 0.17.2 builds an illegal empty User-Agent when telemetry is off (hub-protocol.md §6).
    "HF_HUB_DISABLE_TELEMETRY", "DISABLE_TELEMETRY", "DO_NOT_TRACK",
)


def point_clients_at(url: str, home: Path, monkeypatch) -> dict:
    """Send huggingface_hub, kernels and winattn to `url` with every cache under `home`; return the child env."""
    from huggingface_hub import constants

    home.mkdir(parents=True, exist_ok=True)
    cache = str(home / "hub")
    for var in _UNSET:
        monkeypatch.delenv(var, raising=False)
    for var, value in {
        "HF_ENDPOINT": url,
        "HF_HOME": str(home),
        "HF_HUB_CACHE": cache,
        "HF_TOKEN_PATH": str(home / "token"),
        "WINATTN_CACHE": str(home / "winattn"),
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_XET": "1",
        "PYTHONUNBUFFERED": "1",
    }.items():
        monkeypatch.setenv(var, value)
    for name, value in {
        "ENDPOINT": url,
        "HUGGINGFACE_CO_URL_TEMPLATE": url + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HOME": str(home),
        "HF_HUB_CACHE": cache,
        "HUGGINGFACE_HUB_CACHE": cache,
        "HF_ASSETS_CACHE": str(home / "assets"),
        "HF_XET_CACHE": str(home / "xet"),
        "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
        "AGENT_HARNESSES_PATH": str(home / ".agent_harnesses.json"),
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_PROGRESS_BARS": True,
        "HF_HUB_DISABLE_TELEMETRY": False,
    }.items():
        monkeypatch.setattr(constants, name, value, raising=False)
    for name in ("kernels.hf_hub", "kernels.install", "kernels.locking", "kernels.resolver", "kernels.cli.download"):
        # The CLI module (it needs sigstore's cryptography) only when something already imported it in-process.
        module = sys.modules.get(name) if name.startswith("kernels.cli") else importlib.import_module(name)
        if module is not None and hasattr(module, "CACHE_DIR"):
            monkeypatch.setattr(module, "CACHE_DIR", cache)
    return dict(os.environ)


@contextlib.contextmanager
def running_hub(store: Path, *, token: str, trusted_orgs, home: Path = None, monkeypatch=None):
    """A `winattn.hub.HubServer` on 127.0.0.1 over `store`; with `home`, this process's clients point at it and
    `server.env` is the environment for child processes."""
    from winattn.hub import HubServer

    with HubServer(store, tokens=[token], trusted_orgs=list(trusted_orgs)) as server:
        if home is not None:
            server.env = point_clients_at(server.url, home, monkeypatch)
        yield server
