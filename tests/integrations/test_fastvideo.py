"""FastVideo 0.2.1 (`--no-deps` install) `WINDOW_ATTN_HUB` backend: enum member, platform selector, layer support,
[B, S, H, D] impl with masks, hard errors instead of FastVideo's silent fallback, a real (tiny) FastVideo Wan DiT,
and registration in spawned worker processes. The kernel is the real CPU build from the embedded Hub.
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import pickle
import socket
from pathlib import Path

import pytest
import torch

fastvideo = pytest.importorskip(
    "fastvideo",
    reason="FastVideo is not installed: see requirements/fastvideo.txt (pip install --no-deps fastvideo==0.2.1)")

from fastvideo.attention import selector  # noqa: E402
from fastvideo.attention.backends.sdpa import SDPAImpl, SDPAMetadata  # noqa: E402
from fastvideo.attention.layer import LocalAttention  # noqa: E402
from fastvideo.forward_context import set_forward_context  # noqa: E402
from fastvideo.platforms import AttentionBackendEnum as E  # noqa: E402

SDPA_QUALNAME = "fastvideo.attention.backends.sdpa.SDPABackend"
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def wf(hub_repo, monkeypatch):
    """Registered with defaults (no propagation), nothing loaded, selector cache empty; FastVideo's CPU platform
    patched to serve TORCH_SDPA (it returns no backend at all on CPU, ecosystem.md §3.3)."""
    import winattn.integrations.fastvideo as wf
    from fastvideo.platforms.interface import Platform

    def cpu_sdpa(cls, selected_backend, head_size, dtype):
        return SDPA_QUALNAME if selected_backend in (None, E.TORCH_SDPA) else ""

    monkeypatch.setattr(Platform, "get_attn_backend_cls", classmethod(cpu_sdpa))
    monkeypatch.delenv("FASTVIDEO_ATTENTION_BACKEND", raising=False)
    wf.register(propagate=False)
    wf.unload()
    selector._cached_get_attn_backend.cache_clear()
    yield wf
    selector._cached_get_attn_backend.cache_clear()
    wf.register(propagate=False)
    wf.unload()


def _qkv(B=2, S=10, H=2, D=16, Hkv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, H, D, generator=g)
    k = torch.randn(B, S, Hkv or H, D, generator=g)
    v = torch.randn(B, S, Hkv or H, D, generator=g)
    return q, k, v


def _layer(backend_env, monkeypatch, head_size=16, supported=(E.FLASH_ATTN, E.TORCH_SDPA), **kwargs):
    monkeypatch.setenv("FASTVIDEO_ATTENTION_BACKEND", backend_env)
    return LocalAttention(num_heads=2, head_size=head_size, supported_attention_backends=supported, **kwargs)


# ----------------------------------------------------------------------------------------------------------------


def test_register_injects_the_enum_member(wf):
    member = wf.register(propagate=False)
    assert member is E["WINDOW_ATTN_HUB"] is E.WINDOW_ATTN_HUB is E(wf.MEMBER_VALUE)
    assert member in list(E)
    assert selector.backend_name_to_enum("WINDOW_ATTN_HUB") is member
    assert selector.coerce_attn_backend(" window_attn_hub ") is member
    assert pickle.loads(pickle.dumps(member)) is member and copy.deepcopy(member) is member
    assert wf.WindowAttnHubBackend.get_name() == member.name


def test_fastvideo_args_accept_the_backend(wf, monkeypatch):
    from fastvideo.fastvideo_args import FastVideoArgs

    args = FastVideoArgs(model_path="unused", attention_backend="window_attn_hub")
    assert args.attention_backend == "window_attn_hub"
    monkeypatch.setenv("FASTVIDEO_ATTENTION_BACKEND", "WINDOW_ATTN_HUB")  # ignored by FastVideo unless registered
    assert FastVideoArgs(model_path="unused").attention_backend == "WINDOW_ATTN_HUB"


def test_dit_classes_list_the_member(wf):
    from fastvideo.models.dits.base import BaseDiT
    from fastvideo.models.dits.wanvideo import WanTransformer3DModel
    from fastvideo.models.dits.zimage import ZImageTransformer2DModel

    assert E.WINDOW_ATTN_HUB in WanTransformer3DModel._supported_attention_backends
    assert ZImageTransformer2DModel._supported_attention_backends == (E.TORCH_SDPA, E.WINDOW_ATTN_HUB)

    class LaterDiT(BaseDiT):  # defined after register(): extended by the __init_subclass__ hook
        _fsdp_shard_conditions = []
        _compile_conditions = []
        param_names_mapping = {}
        _supported_attention_backends = (E.TORCH_SDPA,)

        def forward(self, *args, **kwargs):
            pass

    assert LaterDiT._supported_attention_backends == (E.TORCH_SDPA, E.WINDOW_ATTN_HUB)


def test_env_selection_loads_at_layer_construction_and_matches_sdpa(wf, load_calls, monkeypatch):
    layer = _layer("WINDOW_ATTN_HUB", monkeypatch)  # hard-coded (FLASH_ATTN, TORCH_SDPA), like Wan cross-attention
    assert isinstance(layer.attn_impl, wf.WindowAttnHubImpl) and layer.backend is E.WINDOW_ATTN_HUB
    assert len(load_calls) == 1, "the kernel is fetched and verified when the layer selects the backend"
    assert layer.attn_impl.kernel.__winattn_info__.source == "hub"
    q, k, v = _qkv()
    with set_forward_context(current_timestep=0, attn_metadata=None):
        out = layer(q, k, v)
    assert len(load_calls) == 1
    ref = SDPAImpl(num_heads=2, head_size=16, causal=False, softmax_scale=16**-0.5).forward(q, k, v, None)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_scope_request_selects_the_backend(wf):
    with selector._component_attention_backend_scope("window_attn_hub", component="transformer"):
        layer = LocalAttention(num_heads=2, head_size=16, supported_attention_backends=(E.TORCH_SDPA,))
    assert isinstance(layer.attn_impl, wf.WindowAttnHubImpl)


def test_extend_sdpa_layers_can_be_turned_off(wf, monkeypatch):
    wf.register(propagate=False, extend_sdpa_layers=False)
    layer = _layer("WINDOW_ATTN_HUB", monkeypatch)
    assert not isinstance(layer.attn_impl, wf.WindowAttnHubImpl)  # FastVideo's own (logged) layer fallback


@pytest.mark.parametrize(
    "mask_kind",
    [None, "int_key_padding", "bool_key_padding", "float_key_padding", "short_key_padding", "bool_3d", "float_4d"],
)
def test_impl_matches_sdpa_impl_with_masks(wf, mask_kind):
    B, S, H, D = 2, 10, 4, 16
    q, k, v = _qkv(B, S, H, D, Hkv=2)  # GQA
    g = torch.Generator().manual_seed(1)
    pad = torch.ones(B, S, dtype=torch.long)
    pad[1, 6:] = 0
    masks = {
        None: None,
        "int_key_padding": pad,
        "bool_key_padding": pad.bool(),
        "float_key_padding": torch.where(pad.bool(), 0.0, -1e4),
        "short_key_padding": pad[:, 3:],  # front-padded as "attend"
        "bool_3d": (torch.rand(B, S, S, generator=g) > 0.3) | torch.eye(S, dtype=torch.bool),
        "float_4d": torch.randn(B, H, S, S, generator=g),
    }
    metadata = None if mask_kind is None else SDPAMetadata(current_timestep=0, attn_mask=masks[mask_kind])
    ours = wf.WindowAttnHubImpl(num_heads=H, head_size=D, softmax_scale=0.3, num_kv_heads=2)
    ref = SDPAImpl(num_heads=H, head_size=D, causal=False, softmax_scale=0.3, num_kv_heads=2)
    torch.testing.assert_close(ours.forward(q, k, v, metadata), ref.forward(q, k, v, metadata), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sq, sk", [(8, 8), (8, 5), (4, 9)])
def test_impl_causal_matches_sdpa_impl(wf, sq, sk):
    q, _, _ = _qkv(1, sq, 2, 16)
    _, k, v = _qkv(1, sk, 2, 16, seed=2)
    ours = wf.WindowAttnHubImpl(num_heads=2, head_size=16, softmax_scale=0.25, causal=True)
    ref = SDPAImpl(num_heads=2, head_size=16, causal=True, softmax_scale=0.25)
    torch.testing.assert_close(ours.forward(q, k, v, None), ref.forward(q, k, v, None), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(), (10,), (1, 2, 4, 10, 10)], ids=["0d", "1d", "5d"])
def test_impl_refuses_masks_of_other_ranks_clearly(wf, shape):
    """A 0-D mask ended in a bare IndexError (the rank was checked after the key padding read shape[-1])."""
    q, k, v = _qkv(2, 10, 4, 16)
    ours = wf.WindowAttnHubImpl(num_heads=4, head_size=16, softmax_scale=0.3)
    metadata = SDPAMetadata(current_timestep=0, attn_mask=torch.ones(shape, dtype=torch.bool))
    with pytest.raises(ValueError, match="unsupported attention mask shape"):
        ours.forward(q, k, v, metadata)


def test_impl_refuses_dropout_and_bad_head_sizes(wf):
    with pytest.raises(ValueError, match="dropout"):
        wf.WindowAttnHubImpl(num_heads=2, head_size=16, softmax_scale=0.25, dropout_p=0.1)
    with pytest.raises(ValueError, match="head dim 12"):
        wf.WindowAttnHubImpl(num_heads=2, head_size=12, softmax_scale=0.25)


def test_unsupported_head_size_is_a_hard_error_at_selection(wf, monkeypatch):
    with pytest.raises(ValueError, match="head dim 12 is not supported.*does not fall back"):
        _layer("WINDOW_ATTN_HUB", monkeypatch, head_size=12)


def test_unavailable_kernel_is_a_hard_error_not_a_fallback(wf, monkeypatch):
    from winattn.errors import KernelNotFoundError

    wf.register(version=7, propagate=False)
    with pytest.raises(KernelNotFoundError) as e:
        _layer("WINDOW_ATTN_HUB", monkeypatch)
    assert "does not fall back" in "".join(getattr(e.value, "__notes__", []))


def test_untrusted_publisher_needs_trust_remote_code(wf, hub_repo, monkeypatch):
    from winattn.errors import UntrustedKernelError

    wf.register(hub_repo.untrusted_repo_id, propagate=False)
    with pytest.raises(UntrustedKernelError):
        _layer("WINDOW_ATTN_HUB", monkeypatch)
    selector._cached_get_attn_backend.cache_clear()
    wf.register(hub_repo.untrusted_repo_id, trust_remote_code=True, propagate=False)
    layer = _layer("WINDOW_ATTN_HUB", monkeypatch)
    assert layer.attn_impl.kernel.__winattn_info__.repo_id == hub_repo.untrusted_repo_id


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def single_process_group(monkeypatch):
    """FastVideo's world/TP/SP groups for one CPU process (gloo on 127.0.0.1), torn down afterwards."""
    from fastvideo.distributed import parallel_state

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    parallel_state.maybe_init_distributed_environment_and_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    parallel_state.destroy_distributed_environment()


def test_fastvideo_wan_dit_runs_on_the_kernel(wf, single_process_group):
    """A tiny FastVideo WanTransformer3DModel (random weights): self-attention (DistributedAttention) and the
    cross-attention with a hard-coded tuple (LocalAttention) both run the kernel and match TORCH_SDPA."""
    from fastvideo.configs.models.dits.wanvideo import WanVideoArchConfig, WanVideoConfig
    from fastvideo.models.dits.wanvideo import WanTransformer3DModel

    def build(backend):
        config = WanVideoConfig(arch_config=WanVideoArchConfig(
            num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, text_dim=16, freq_dim=32,
            ffn_dim=32, num_layers=1, rope_max_seq_len=32))
        with selector._component_attention_backend_scope(backend, component="transformer"):
            return WanTransformer3DModel(config, hf_config={})

    sdpa, ours = build("TORCH_SDPA"), build("WINDOW_ATTN_HUB")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in sdpa.parameters():  # FastVideo layers start uninitialized (weights come from checkpoints)
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    ours.load_state_dict(sdpa.state_dict())
    impls = {name: type(m.attn_impl) for name, m in ours.named_modules() if hasattr(m, "attn_impl")}
    assert set(impls) == {"blocks.0.attn1", "blocks.0.attn2.attn"}
    assert set(impls.values()) == {wf.WindowAttnHubImpl}
    x, context = torch.randn(1, 4, 2, 8, 8, generator=g), torch.randn(1, 12, 16, generator=g)
    t = torch.full((1,), 500.0)
    with torch.no_grad(), set_forward_context(current_timestep=0, attn_metadata=None):
        expected, got = sdpa(x, context, t), ours(x, context, t)
    assert torch.isfinite(expected).all()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_propagate_exports_settings_and_the_boot_path(wf, monkeypatch, hub_repo):
    from winattn.integrations import FASTVIDEO_AUTOREGISTER_ENV

    monkeypatch.setenv(FASTVIDEO_AUTOREGISTER_ENV, "")
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    wf.register(version=1, endpoint=hub_repo.url)
    settings = json.loads(os.environ[FASTVIDEO_AUTOREGISTER_ENV])
    assert settings["repo_id"] == "winattn/window-attention" and settings["version"] == 1
    assert settings["load_kwargs"] == {"endpoint": hub_repo.url}
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == wf.boot_dir()
    with pytest.raises(TypeError, match="propagate=False"):
        wf.register(public_keys=[object()])


def test_autoregister_env_var_registers_once_fastvideo_is_imported(wf, monkeypatch):
    """WINATTN_FASTVIDEO_AUTOREGISTER=1 (defaults) installs the post-import hook; FastVideo being imported already,
    it registers at once. Unset, nothing is installed."""
    import sys

    from winattn.integrations import FASTVIDEO_AUTOREGISTER_ENV, install_fastvideo_autoregister

    calls = []
    monkeypatch.setattr(wf, "register", lambda *args, **kwargs: calls.append(kwargs))
    monkeypatch.delenv(FASTVIDEO_AUTOREGISTER_ENV, raising=False)
    assert install_fastvideo_autoregister() is None and calls == []
    monkeypatch.setenv(FASTVIDEO_AUTOREGISTER_ENV, "1")
    finder = install_fastvideo_autoregister()
    try:
        assert finder in sys.meta_path and calls
        assert calls[0]["repo_id"] == "winattn/window-attention" and calls[0]["propagate"] is False
        assert install_fastvideo_autoregister() is finder  # idempotent
    finally:
        sys.meta_path.remove(finder)


@pytest.mark.slow
def test_spawned_worker_registers_through_the_import_hook(wf, monkeypatch, tmp_path):
    """A multiprocessing "spawn" child (FastVideo's worker start method) that never imports winattn itself gets the
    member while unpickling its arguments, selects the backend from FASTVIDEO_ATTENTION_BACKEND and runs it."""
    from winattn.integrations import FASTVIDEO_AUTOREGISTER_ENV

    from . import _fv_child

    # Children need the torchvision op-schema shim before FastVideo imports torchvision: a test-only
    # sitecustomize behind winattn's boot directory (which runs the sitecustomize it shadows).
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    (shim_dir / "sitecustomize.py").write_text("import winattn.integrations._torchvision_shim\n")
    monkeypatch.setenv(FASTVIDEO_AUTOREGISTER_ENV, "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(shim_dir), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("FASTVIDEO_ATTENTION_BACKEND", "WINDOW_ATTN_HUB")
    member = wf.register()  # propagate=True: settings + boot directory into os.environ
    result_path = tmp_path / "result.json"
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=_fv_child.run, args=(member, str(result_path)))
    proc.start()
    proc.join(timeout=240)
    assert proc.exitcode == 0, f"worker failed (exit code {proc.exitcode})"
    result = json.loads(result_path.read_text())
    assert result["hook_registered"] and result["same_member"]
    assert result["member"] == ["WINDOW_ATTN_HUB", wf.MEMBER_VALUE]
    assert result["impl"] == "winattn.integrations.fastvideo.WindowAttnHubImpl"
    assert result["source"] == ["winattn/window-attention", "hub"]
    assert result["max_err"] < 1e-5


def test_worker_recipe_of_the_docs_registers_in_a_fresh_process(tmp_path):
    """docs/integrations.md's recipe for processes that never call register() (torchrun ranks), run as the snippet
    test runs a shell block, then a fresh Python process that imports FastVideo: it must have WINDOW_ATTN_HUB. The
    directory `$(...)` captures must be only the boot directory (FastVideo logs to stdout when imported)."""
    import subprocess
    import sys

    from docs.snippets import extract

    doc = REPO_ROOT / "docs" / "integrations.md"
    block = next(s for s in extract(doc, REPO_ROOT) if "export WINATTN_FASTVIDEO_AUTOREGISTER" in s.code)
    assert block.lang == "bash" and block.mark is None  # run by tests/docs/test_snippets.py too
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WINATTN_", "FASTVIDEO_", "PYTEST"))}
    env.update(PYTHONPATH=str(REPO_ROOT), PATH=os.pathsep.join([os.path.dirname(sys.executable), env["PATH"]]))
    check = ("import os, sys\n"
             "from fastvideo.platforms import AttentionBackendEnum as E\n"
             "assert 'WINDOW_ATTN_HUB' in E.__members__, os.environ['PYTHONPATH']\n"
             "print('registered', E.WINDOW_ATTN_HUB.value)\n")
    recipe = "\n".join(line for line in block.code.splitlines() if line.startswith("export "))  # its own check: below
    script = f"{recipe}\npython -c \"$CHECK\"\nprintf '%s' \"$PYTHONPATH\" > {tmp_path / 'pythonpath'}\n"
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=dict(env, CHECK=check),
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    assert f"registered {0x57_41_48}" in r.stdout
    from winattn.integrations._fastvideo_hook import boot_dir

    assert (tmp_path / "pythonpath").read_text().split(os.pathsep) == [boot_dir(), str(REPO_ROOT)]
