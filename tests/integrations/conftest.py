"""Fixtures of the integration tests: the real CPU build published to an embedded Hub, and the clients pointed at it.

`hub_repo` is what every integration test loads through: a `winattn.hub.HubServer` on 127.0.0.1 (trusted org
"winattn", untrusted org "evil"), the CPU variant built by the session fixture `built_variant` and published with
`winattn.publish` to `winattn/window-attention` (and, for the trust tests, to `evil/window-attention`), with
HF_ENDPOINT / HF_HOME (environment for child processes, `huggingface_hub.constants` in this process, since they are
read at import) pointing at it. The server and the publication are shared by the session; each test gets a fresh
Hugging Face cache and a fresh `winattn.integrations` load cache, so every selection really runs `winattn.load`.

timm, FastVideo and (whenever torchvision is installed) diffusers import torchvision, whose cu130 wheel needs the
op-schema shim beside CPU torch: it is installed here, before anything imports them.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import hub_clients
import pytest

from winattn.integrations import install_torchvision_shim

install_torchvision_shim()

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKEN = "hf_winattn_integrations_token"
TRUSTED_ORG = "winattn"
UNTRUSTED_ORG = "evil"
REPO = "winattn/window-attention"
UNTRUSTED_REPO = "evil/window-attention"
GPU_ONLY_REPO = "winattn/window-attention-gpu-only"
GPU_ONLY_VARIANT = "torch-stable-abi210-cu130-x86_64-linux"


@dataclass
class HubRepo:
    """The published kernel: `repo_id` (trusted), `untrusted_repo_id`, `gpu_only_repo_id` (one CUDA variant, none
    for this machine), the server `url` and the `home` of this test."""

    repo_id: str
    untrusted_repo_id: str
    gpu_only_repo_id: str
    url: str
    token: str
    home: Path
    env: dict

    def __str__(self) -> str:
        return self.repo_id


@pytest.fixture(scope="session")
def published_hub(built_variant, tmp_path_factory):
    """A HubServer with the CPU build published to REPO and UNTRUSTED_REPO, and GPU_ONLY_REPO holding only a
    (fake) CUDA variant, for the whole session."""
    from huggingface_hub import CommitOperationAdd, HfApi

    from winattn.hub import HubServer
    from winattn.publish import publish

    root = tmp_path_factory.mktemp("integrations-hub")
    build_dir = root / "build"
    shutil.copytree(built_variant, build_dir / built_variant.name,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "metadata.json.sigstore"))
    srv = HubServer(root / "store", tokens=[TOKEN], trusted_orgs=[TRUSTED_ORG]).start()
    try:
        for repo in (REPO, UNTRUSTED_REPO):
            publish(repo, build_dir=build_dir, endpoint=srv.url, token=TOKEN, repo_root=REPO_ROOT)
        # Raw push (winattn publish would refuse it): the CPU build's Python files under a CUDA variant name.
        api = HfApi(endpoint=srv.url, token=TOKEN)
        api.create_repo(GPU_ONLY_REPO, repo_type="kernel", exist_ok=True)
        api.create_branch(GPU_ONLY_REPO, branch="v1", repo_type="kernel", exist_ok=True)
        ops = [CommitOperationAdd(path_in_repo=f"build/{GPU_ONLY_VARIANT}/{p.name}", path_or_fileobj=p.read_bytes())
               for p in sorted(built_variant.iterdir()) if p.is_file() and p.suffix in (".py", ".json")]
        api.create_commit(GPU_ONLY_REPO, ops, commit_message="cuda only", repo_type="kernel", revision="v1")
        yield srv
    finally:
        srv.stop()


def point_clients_at(url: str, home: Path, monkeypatch) -> dict:
    """The shared client redirection (tests/hub_clients.py), plus no diffusers trust opt-ins from the outside."""
    for key in ("DIFFUSERS_TRUST_REMOTE_KERNELS", "DIFFUSERS_DISABLE_REMOTE_CODE"):
        monkeypatch.delenv(key, raising=False)
    return hub_clients.point_clients_at(url, home, monkeypatch)


@pytest.fixture
def hub_repo(published_hub, tmp_path, monkeypatch) -> HubRepo:
    """The kernel published on a running local Hub; yields its repo id (`str(hub_repo)`) and where it lives."""
    from winattn.integrations import clear_kernel_cache

    env = point_clients_at(published_hub.url, tmp_path / "hf-home", monkeypatch)
    clear_kernel_cache()
    yield HubRepo(REPO, UNTRUSTED_REPO, GPU_ONLY_REPO, published_hub.url, TOKEN, tmp_path / "hf-home", env)
    clear_kernel_cache()


def child_env(extra: dict | None = None) -> dict:
    """This process's environment (with the Hub settings monkeypatched into it) for a child interpreter."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(extra or {})
    return env


@pytest.fixture
def load_calls(monkeypatch):
    """Records every winattn.load call (the integrations resolve `winattn.load` at call time)."""
    import winattn

    calls = []
    real = winattn.load

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(winattn, "load", spy)
    return calls


@pytest.fixture
def ad():
    from diffusers.models import attention_dispatch

    return attention_dispatch


@pytest.fixture
def wd(hub_repo, ad):
    """The diffusers integration registered with defaults and nothing loaded; restores the global backend state."""
    import winattn.integrations.diffusers as wd

    wd.register()
    wd.unload()
    previous = ad._AttentionBackendRegistry._active_backend
    checks = ad._AttentionBackendRegistry._checks_enabled
    yield wd
    ad._AttentionBackendRegistry._active_backend = previous
    ad._AttentionBackendRegistry._checks_enabled = checks
    wd.unload()


@pytest.fixture
def swin_kernel_calls(hub_repo, monkeypatch):
    """Counts `window_attention` calls inside the loaded kernel's timm layers module (True: with a mask)."""
    import sys

    from winattn.integrations.timm import VerifiedLayerRepository

    layers = sys.modules[VerifiedLayerRepository().load().__module__]
    calls = []
    real = layers.window_attention

    def counting(*args, **kwargs):
        calls.append(kwargs.get("mask") is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(layers, "window_attention", counting)
    return calls


@pytest.fixture
def relpos_kernel_calls(hub_repo, monkeypatch):
    """Records the kernel calls of the loaded kernel's layers module: ("window", table rows, index shape, has an
    extra bias) for window_attention and ("attention", bias shape or None) for attention."""
    import sys

    from winattn.integrations.timm import VerifiedLayerRepository

    layers = sys.modules[VerifiedLayerRepository(layer_name="BeitAttention").load().__module__]
    calls = []
    real_window, real_attention = layers.window_attention, layers.attention

    def window(*args, **kwargs):
        calls.append(("window", kwargs["rel_pos_table"].shape[0], tuple(kwargs["rel_pos_index"].shape),
                      kwargs.get("bias") is not None))
        return real_window(*args, **kwargs)

    def attention(*args, **kwargs):
        bias = kwargs.get("bias")
        calls.append(("attention", None if bias is None else tuple(bias.shape)))
        return real_attention(*args, **kwargs)

    monkeypatch.setattr(layers, "window_attention", window)
    monkeypatch.setattr(layers, "attention", attention)
    return calls
