"""diffusers 0.42.x `window_attn_hub` backend: registration, selection-time loading, trust, masks, parity with
`native` on tiny random-weight transformers, gradients, torch.compile.

Every kernel here is the real CPU build, published to the embedded Hub (`hub_repo`) and loaded by `winattn.load`.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from . import _models

NAME = "window_attn_hub"


class KernelSpy:
    """Stands in for the loaded kernel module: records the keyword arguments of each `attention` call."""

    def __init__(self, module):
        self._module = module
        self.calls = []

    def attention(self, q, k, v, **kwargs):
        self.calls.append(kwargs)
        return self._module.attention(q, k, v, **kwargs)

    def __getattr__(self, name):
        return getattr(self._module, name)


@pytest.fixture
def spy_kernel(wd):
    """Selects the backend, then wraps its kernel module in a KernelSpy."""

    def install(name=NAME):
        backend = wd._BACKENDS[name]
        wd.load_backend(name)
        spy = KernelSpy(backend.module)
        backend.module = spy
        return spy

    return install


def _qkv(B=2, Sq=6, Sk=6, H=2, D=16, dtype=torch.float32, requires_grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Sq, H, D, generator=g, dtype=dtype)
    k = torch.randn(B, Sk, H, D, generator=g, dtype=dtype)
    v = torch.randn(B, Sk, H, D, generator=g, dtype=dtype)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def _sdpa(q, k, v, mask=None, is_causal=False, scale=None):
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, is_causal=is_causal, scale=scale)
    return out.transpose(1, 2)


# ----------------------------------------------------------------------------------------------------------------
# Registration


def test_register_adds_a_complete_enum_member(wd, ad):
    Name = ad.AttentionBackendName
    member = wd.register()
    assert member is Name(NAME) is Name["WINDOW_ATTN_HUB"] is Name.WINDOW_ATTN_HUB
    assert "WINDOW_ATTN_HUB" in Name.__members__ and member in list(Name)
    assert member == NAME and hash(member) == hash(NAME) and member.value == NAME
    assert pickle.loads(pickle.dumps(member)) is member
    assert copy.deepcopy(member) is member
    assert copy.deepcopy({"backend": member})["backend"] is member
    assert wd.register() is member  # idempotent


def test_backend_has_explicit_parameters_constraints_and_context_parallel(wd, ad):
    member = ad.AttentionBackendName(NAME)
    registry = ad._AttentionBackendRegistry
    assert registry._supported_arg_names[member] == {
        "query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa", "return_lse",
        "_parallel_config"}
    assert registry._is_context_parallel_available(member)
    constraints = registry._constraints[member]
    assert ad._check_device in constraints and ad._check_shape in constraints
    assert len(constraints) >= 4  # + dtype/device of the loaded build, head dim, dropout


def test_masks_under_ring_attention_are_refused_not_misapplied(wd, ad, load_calls):
    """diffusers' ring attention passes the local mask shard with every rotated K/V chunk: refuse masks there
    (a 2-GPU run applied them to the wrong keys) rather than return wrong attention."""
    from types import SimpleNamespace

    wd.register()
    wd.load_backend()
    fn = ad._AttentionBackendRegistry._backends[ad.AttentionBackendName(NAME)]
    q = torch.randn(1, 8, 2, 16)
    ring = SimpleNamespace(context_parallel_config=SimpleNamespace(ring_degree=2, ulysses_degree=1))
    with pytest.raises(ValueError, match="ring attention"):
        fn(q, q, q, attn_mask=torch.ones(1, 8, dtype=torch.bool), _parallel_config=ring)


def test_register_refuses_a_trust_keyword_and_diffusers_own_names(wd):
    with pytest.raises(TypeError, match="DIFFUSERS_TRUST_REMOTE_KERNELS"):
        wd.register("window_attn_x", trust_remote_code=True)
    with pytest.raises(ValueError, match="diffusers' own"):
        wd.register("native")
    with pytest.raises(ValueError, match="lower-case"):
        wd.register("Window_Attn")


# ----------------------------------------------------------------------------------------------------------------
# Selection-time loading


def test_set_attention_backend_fetches_and_verifies_at_selection(wd, load_calls, hub_repo):
    model, inputs = _models.flux()
    with torch.no_grad():
        native = _models.output(model(**inputs))
    assert load_calls == []
    model.set_attention_backend(NAME)
    assert len(load_calls) == 1, "the kernel is loaded when the backend is selected"
    assert load_calls[0][0][0] == hub_repo.repo_id and load_calls[0][1]["version"] == 1
    assert load_calls[0][1]["trust_remote_code"] is False
    module = wd._BACKENDS[NAME].module
    info = module.__winattn_info__
    assert info.repo_id == hub_repo.repo_id and info.source == "hub" and info.variant.endswith("cpu-x86_64-linux")
    with torch.no_grad():
        out = _models.output(model(**inputs))
    assert len(load_calls) == 1, "nothing is loaded at the first call"
    torch.testing.assert_close(out, native, atol=1e-5, rtol=1e-5)


def test_attention_backend_context_manager_selects_and_restores(wd, ad, load_calls):
    model, inputs = _models.flux()
    with torch.no_grad():
        native = _models.output(model(**inputs))
    before = ad._AttentionBackendRegistry._active_backend
    with ad.attention_backend(NAME):
        assert len(load_calls) == 1
        assert ad._AttentionBackendRegistry._active_backend == NAME
        with torch.no_grad():
            out = _models.output(model(**inputs))
    assert ad._AttentionBackendRegistry._active_backend == before
    torch.testing.assert_close(out, native, atol=1e-5, rtol=1e-5)


def test_per_module_set_attention_backend_loads_the_kernel(wd, load_calls, spy_kernel):
    """diffusers' AttentionModuleMixin.set_attention_backend never downloads for *_hub backends (diffusers#13284);
    for window_attn_hub it fetches and verifies the kernel like the model-level call."""
    from diffusers.models.attention import AttentionModuleMixin

    model, inputs = _models.flux()
    with torch.no_grad():
        native = _models.output(model(**inputs))
    attention_modules = [m for m in model.modules() if isinstance(m, AttentionModuleMixin)]
    attention_modules[0].set_attention_backend(NAME)
    assert len(load_calls) == 1
    assert attention_modules[0].processor._attention_backend == NAME
    assert attention_modules[1].processor._attention_backend is None
    spy = spy_kernel()
    with torch.no_grad():
        out = _models.output(model(**inputs))
    assert len(spy.calls) == 1  # only the module that selected it
    torch.testing.assert_close(out, native, atol=1e-5, rtol=1e-5)


def test_backend_does_not_leak_to_a_second_model(wd, ad, spy_kernel):
    model_a, inputs = _models.flux(seed=0)
    model_b, _ = _models.flux(seed=1)
    before = ad._AttentionBackendRegistry._active_backend
    model_a.set_attention_backend(NAME)
    assert ad._AttentionBackendRegistry._active_backend == before, "the process-wide default is unchanged"
    spy = spy_kernel()
    with torch.no_grad():
        model_b(**inputs)
    assert spy.calls == [], "a model that did not select the backend does not run it"
    with torch.no_grad():
        model_a(**inputs)
    assert len(spy.calls) == 2


def test_diffusers_own_backends_do_leak_globally(wd, ad):
    """Documents diffusers 0.42's behaviour (docs/integrations.md): set_attention_backend of its own backends also
    sets the process-wide default, and reset_attention_backend does not restore it (diffusers#14249)."""
    model_a, _ = _models.flux(seed=0)
    model_a.set_attention_backend("_native_math")
    assert ad._AttentionBackendRegistry._active_backend == "_native_math"
    model_a.reset_attention_backend()
    assert ad._AttentionBackendRegistry._active_backend == "_native_math"


def test_unsupported_head_dim_fails_at_selection(wd, load_calls):
    model, _ = _models.wan(head_dim=12)
    with pytest.raises(ValueError, match="head dim 12 is not supported"):
        model.set_attention_backend(NAME)
    assert load_calls == [], "the model is checked before anything is downloaded"
    assert all(getattr(getattr(m, "processor", None), "_attention_backend", None) is None for m in model.modules())


def test_missing_version_fails_at_selection(wd, ad):
    from winattn.errors import KernelNotFoundError

    wd.register("window_attn_v7", version=7)
    model, _ = _models.flux()
    with pytest.raises(KernelNotFoundError) as e:
        model.set_attention_backend("window_attn_v7")
    assert "window_attn_v7" in "".join(getattr(e.value, "__notes__", []))


def test_hub_down_fails_at_selection_once_with_a_short_traceback(wd, ad, caplog):
    """The loader's message reaches the caller once (raised, not also logged), without the client's chained frames,
    with a note naming the backend."""
    import logging
    import socket
    import traceback

    from winattn.errors import DownloadError

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{sock.getsockname()[1]}"
    wd.register("window_attn_down", endpoint=down)
    model, _ = _models.flux()
    with caplog.at_level(logging.INFO), pytest.raises(DownloadError) as e:
        model.set_attention_backend("window_attn_down")
    assert "Connection refused" not in caplog.text
    shown = "".join(traceback.format_exception(e.value))
    # no chained exception and no frame of the HTTP client (that chain was 90 lines): the caller's frames, the
    # loader's own and the message
    frames = [ln for ln in shown.splitlines() if ln.lstrip().startswith("File ")]
    assert "direct cause" not in shown and "During handling" not in shown, shown
    assert not [f for f in frames if "httpx" in f or "huggingface_hub" in f], shown
    assert shown.count("Connection refused") == 1 and len(frames) <= 12, shown
    assert "window_attn_down" in "".join(e.value.__notes__) and "--endpoint" not in shown


def test_no_variant_for_this_machine_fails_at_selection_with_the_reasons(wd, ad, hub_repo):
    from winattn.errors import KernelNotFoundError

    from .conftest import GPU_ONLY_VARIANT

    wd.register("window_attn_gpu_only", repo_id=hub_repo.gpu_only_repo_id)
    with pytest.raises(KernelNotFoundError, match=GPU_ONLY_VARIANT) as e:
        with ad.attention_backend("window_attn_gpu_only"):
            pass
    assert "cpu" in str(e.value)
    assert wd._BACKENDS["window_attn_gpu_only"].module is None


def test_reference_fallback_is_an_explicit_choice(wd, ad, hub_repo):
    wd.register("window_attn_gpu_only_ref", repo_id=hub_repo.gpu_only_repo_id, fallback="reference")
    model, inputs = _models.flux_masked()
    with torch.no_grad():
        native = _models.output(model(**inputs))
    model.set_attention_backend("window_attn_gpu_only_ref")
    assert wd._BACKENDS["window_attn_gpu_only_ref"].module.__winattn_info__.source == "reference"
    with torch.no_grad():
        torch.testing.assert_close(_models.output(model(**inputs)), native, atol=1e-5, rtol=1e-5)


def test_dispatch_without_selection_explains_how_to_select(wd, ad):
    q, k, v = _qkv()
    with pytest.raises(RuntimeError, match="set_attention_backend"):
        ad.dispatch_attention_fn(q, k, v, backend=ad.AttentionBackendName(NAME))


# ----------------------------------------------------------------------------------------------------------------
# Trust: exactly like diffusers' *_hub backends


@pytest.mark.parametrize(
    "repo, env, allowed",
    [
        ("trusted", {}, True),
        ("trusted", {"DIFFUSERS_DISABLE_REMOTE_CODE": "1"}, True),
        ("untrusted", {}, False),
        ("untrusted", {"DIFFUSERS_TRUST_REMOTE_KERNELS": "true"}, True),
        ("untrusted", {"DIFFUSERS_TRUST_REMOTE_KERNELS": "1", "DIFFUSERS_DISABLE_REMOTE_CODE": "yes"}, False),
        ("untrusted", {"DIFFUSERS_DISABLE_REMOTE_CODE": "1"}, False),
    ],
)
def test_trust_environment_variables(wd, ad, hub_repo, monkeypatch, repo, env, allowed):
    from winattn.errors import UntrustedKernelError

    repo_id = hub_repo.repo_id if repo == "trusted" else hub_repo.untrusted_repo_id
    wd.register("window_attn_trust", repo_id=repo_id)
    wd.unload("window_attn_trust")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    model, inputs = _models.flux()
    if allowed:
        model.set_attention_backend("window_attn_trust")
        with torch.no_grad():
            model(**inputs)
        return
    with pytest.raises(UntrustedKernelError, match="DIFFUSERS_TRUST_REMOTE_KERNELS=true") as e:
        model.set_attention_backend("window_attn_trust")
    if "DIFFUSERS_DISABLE_REMOTE_CODE" in env:
        assert "DIFFUSERS_DISABLE_REMOTE_CODE is set and overrides" in str(e.value)
    assert "trust_remote_code" not in str(e.value)  # register() refuses it: the message must not suggest it
    assert wd._BACKENDS["window_attn_trust"].module is None


# ----------------------------------------------------------------------------------------------------------------
# Real transformers: same outputs as `native`


@pytest.mark.parametrize("name", ["flux", "flux_masked", "qwenimage", "ltx_video", "wan", "hunyuan_video"])
def test_model_matches_native(wd, spy_kernel, name):
    model, inputs = _models.MODELS[name]()
    with torch.no_grad():
        native = _models.output(model(**inputs))
    model.set_attention_backend(NAME)
    spy = spy_kernel()
    with torch.no_grad():
        out = _models.output(model(**inputs))
    assert spy.calls, "the model's attention reached the kernel"
    torch.testing.assert_close(out, native, atol=1e-5, rtol=1e-5)
    kinds = {k for call in spy.calls for k in ("bias", "mask", "key_padding_mask") if k in call}
    expected = {"qwenimage": {"key_padding_mask"}, "flux_masked": {"key_padding_mask"},
                "hunyuan_video": {"key_padding_mask"}, "ltx_video": {"bias"}}.get(name, set())
    assert kinds == expected


@pytest.mark.parametrize("name", ["flux_masked", "ltx_video"])
def test_training_step_gradients_match_native(wd, name):
    model, inputs = _models.MODELS[name]()
    twin = copy.deepcopy(model)
    twin.set_attention_backend(NAME)
    grads = []
    for m in (model, twin):
        m.train()
        m.zero_grad()
        out = _models.output(m(**inputs))
        (out.float().square().mean()).backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], atol=2e-5, rtol=1e-4, msg=n)


def test_model_deepcopy_keeps_the_member(wd, ad):
    model, _ = _models.flux()
    model.set_attention_backend(NAME)
    twin = copy.deepcopy(model)
    backends = {getattr(getattr(m, "processor", None), "_attention_backend", None) for m in twin.modules()} - {None}
    assert backends == {ad.AttentionBackendName(NAME)}
    assert next(iter(backends)) is ad.AttentionBackendName(NAME)


# ----------------------------------------------------------------------------------------------------------------
# Masks, LSE, causal, dropout at the dispatcher


def _dispatch(ad, q, k, v, **kwargs):
    return ad.dispatch_attention_fn(q, k, v, backend=ad.AttentionBackendName(NAME), **kwargs)


@pytest.mark.parametrize(
    "case",
    ["bool_key_padding_2d", "float_key_padding_2d", "bool_b11s", "float_b11s", "bool_sq_sk", "float_sq_sk",
     "bool_b_sq_sk", "float_b_h_sq_sk", "bool_b_h_sq_sk"],
)
def test_masks_map_to_the_kernel_without_materializing(wd, ad, spy_kernel, case):
    B, S, H, D = 2, 6, 2, 16
    q, k, v = _qkv(B, S, S, H, D)
    g = torch.Generator().manual_seed(1)
    keep = torch.ones(B, S, dtype=torch.bool)
    keep[1, 4:] = False
    full = torch.rand(B, H, S, S, generator=g) > 0.3
    full[..., 0] = True  # no fully masked row
    additive = torch.randn(B, H, S, S, generator=g)
    masks = {
        "bool_key_padding_2d": (keep, keep[:, None, None, :], "key_padding_mask"),
        "float_key_padding_2d": (torch.where(keep, 0.0, -1e4), torch.where(keep, 0.0, -1e4)[:, None, None], "bias"),
        "bool_b11s": (keep[:, None, None, :], keep[:, None, None, :], "key_padding_mask"),
        "float_b11s": (additive[:, :1, :1], additive[:, :1, :1], "bias"),
        "bool_sq_sk": (full[0, 0], full[0, 0], "mask"),
        "float_sq_sk": (additive[0, 0], additive[0, 0], "bias"),
        "bool_b_sq_sk": (full[:, 0], full[:, :1], "mask"),
        "float_b_h_sq_sk": (additive, additive, "bias"),
        "bool_b_h_sq_sk": (full, full, "mask"),
    }
    attn_mask, sdpa_mask, slot = masks[case]
    spy = spy_kernel()
    out = _dispatch(ad, q, k, v, attn_mask=attn_mask)
    torch.testing.assert_close(out, _sdpa(q, k, v, sdpa_mask), atol=1e-5, rtol=1e-5)
    (call,) = spy.calls
    passed = call[slot]
    assert passed.data_ptr() == attn_mask.data_ptr(), "the mask reaches the kernel as a view, not a copy"
    assert passed.numel() == attn_mask.numel(), "nothing was expanded"
    assert {"bias", "mask", "key_padding_mask"} & set(call) == {slot}


def test_return_lse_is_b_sq_h(wd, ad):
    q, k, v = _qkv(2, 5, 7, 2, 16)
    wd.load_backend()
    fn = ad._AttentionBackendRegistry._backends[ad.AttentionBackendName(NAME)]
    out, lse = fn(query=q, key=k, value=v, return_lse=True)
    assert lse.shape == (2, 5, 2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / 4.0
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1).permute(0, 2, 1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, _sdpa(q, k, v), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sq, sk", [(6, 6), (8, 5), (4, 9)])
def test_is_causal_follows_sdpa_top_left_alignment(wd, ad, sq, sk):
    q, k, v = _qkv(1, sq, sk, 2, 8)
    wd.load_backend()
    out = _dispatch(ad, q, k, v, is_causal=True)
    torch.testing.assert_close(out, _sdpa(q, k, v, is_causal=True), atol=1e-5, rtol=1e-5)


def test_scale_and_gqa(wd, ad):
    q, _, _ = _qkv(1, 5, 5, 4, 16)
    _, k, v = _qkv(1, 5, 5, 2, 16, seed=3)
    wd.load_backend()
    out = _dispatch(ad, q, k, v, scale=0.3, enable_gqa=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                           scale=0.3, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_dropout_is_refused(wd, ad):
    q, k, v = _qkv()
    wd.load_backend()
    with pytest.raises(ValueError, match="dropout"):
        _dispatch(ad, q, k, v, dropout_p=0.1)


def test_constraints_run_with_diffusers_attn_checks(wd, ad):
    wd.load_backend()
    ad._AttentionBackendRegistry._checks_enabled = True
    q, k, v = _qkv()
    _dispatch(ad, q, k, v)
    with pytest.raises(ValueError, match="float64"):
        _dispatch(ad, *(t.double() for t in (q, k, v)))
    with pytest.raises(ValueError, match="head dim 12"):
        _dispatch(ad, *_qkv(D=12))
    with pytest.raises(ValueError, match="dropout"):
        _dispatch(ad, q, k, v, dropout_p=0.5)
    with pytest.raises(ValueError, match="key's sequence length"):
        _dispatch(ad, q, k, v, attn_mask=torch.ones(2, 5, dtype=torch.bool))


@pytest.mark.parametrize("which", ["compiled", "reference"])
def test_context_parallel_backward_gives_each_key_chunk_its_share(wd, which):
    """The CP backward op recomputes one key chunk against the *global* out/lse (what ring attention passes): the
    chunks' dq add up to the full dq and their dk/dv are the full dk/dv slices. Checked for the compiled `bwd` op and
    for the PyTorch formulas used with the reference module."""
    from winattn.reference_kernel import load_reference

    module = wd.load_backend() if which == "compiled" else load_reference()
    q, k, v = _qkv(1, 6, 8, 2, 16, requires_grad=True)
    keep = torch.ones(1, 8, dtype=torch.bool)
    keep[0, 6:] = False
    out = _sdpa(q, k, v, keep[:, None, None, :])
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    out.backward(grad_out)
    with torch.no_grad():
        full_out, lse = module.attention(q, k, v, key_padding_mask=keep, return_lse=True)
        dq = torch.zeros_like(q)
        for part in (slice(0, 4), slice(4, 8)):
            dq_i, dk_i, dv_i = wd.attention_backward(module, grad_out, q, k[:, part], v[:, part], full_out, lse,
                                                     key_padding_mask=keep[:, part])
            dq += dq_i
            torch.testing.assert_close(dk_i, k.grad[:, part], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(dv_i, v.grad[:, part], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dq, q.grad, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# torch.compile


def test_torch_compile_fullgraph_on_the_dispatch_path(wd, ad):
    wd.load_backend()
    member = ad.AttentionBackendName(NAME)
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[1, 3:] = False

    def f(q, k, v, mask):
        return ad.dispatch_attention_fn(q, k, v, attn_mask=mask, backend=member)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    grads = []
    for fn in (f, compiled):
        q, k, v = _qkv(requires_grad=True)
        out = fn(q, k, v, keep)
        out.square().sum().backward()
        grads.append((out.detach(), q.grad, k.grad, v.grad))
    for eager, comp in zip(*grads):
        torch.testing.assert_close(comp, eager, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_torch_compile_fullgraph_on_a_model(wd):
    torch._dynamo.reset()
    model, inputs = _models.flux()
    with torch.no_grad():
        native = _models.output(model(**inputs))
    model.set_attention_backend(NAME)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        out = _models.output(compiled(**inputs))
    torch.testing.assert_close(out, native, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# Arguments the backend must not ignore or mis-map (audit5)


def test_heads_differing_without_enable_gqa_are_refused(wd, ad):
    """native (torch SDPA) refuses K/V with fewer heads than Q unless enable_gqa=True; the backend ran them as GQA
    anyway, ignoring the flag."""
    q, _, _ = _qkv(1, 5, 5, 4, 16)
    _, k, v = _qkv(1, 5, 5, 2, 16, seed=3)
    wd.load_backend()
    with pytest.raises(ValueError, match="enable_gqa"):
        _dispatch(ad, q, k, v)
    fn = ad._AttentionBackendRegistry._backends[ad.AttentionBackendName(NAME)]
    with pytest.raises(ValueError, match="enable_gqa"):
        fn(query=q, key=k, value=v, enable_gqa=False)
    _dispatch(ad, q, k, v, enable_gqa=True)  # still runs with the flag


@pytest.mark.parametrize("mask", [torch.tensor(True), torch.tensor(0.5)], ids=["bool", "float"])
def test_zero_dim_mask_is_a_clear_error(wd, ad, mask):
    """A 0-D attn_mask ended in `IndexError: tuple index out of range` from inside kernel_mask_args."""
    q, k, v = _qkv()
    wd.load_backend()
    with pytest.raises(ValueError, match="attn_mask.*0-D|0-D.*attn_mask"):
        _dispatch(ad, q, k, v, attn_mask=mask)


def test_complex_mask_is_refused_not_read_as_bool(wd, ad):
    """native refuses a complex attn_mask; kernel_mask_args turned it into `mask != 0` (a bool mask) silently."""
    q, k, v = _qkv()
    wd.load_backend()
    with pytest.raises(ValueError, match="complex"):
        _dispatch(ad, q, k, v, attn_mask=torch.ones(2, 6, dtype=torch.complex64))


@pytest.mark.parametrize("arg", ["is_causal", "return_lse"])
@pytest.mark.parametrize("value", ["false", 1, None])
def test_non_bool_flags_are_refused(wd, ad, arg, value):
    """is_causal / return_lse were read by truthiness: is_causal="false" ran causal attention, return_lse="false"
    returned a tuple. torch SDPA (native) and the kernel itself take bools only."""
    q, k, v = _qkv()
    wd.load_backend()
    fn = ad._AttentionBackendRegistry._backends[ad.AttentionBackendName(NAME)]
    with pytest.raises(TypeError, match=arg):
        fn(query=q, key=k, value=v, **{arg: value})
