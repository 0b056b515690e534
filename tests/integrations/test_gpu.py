"""The integrations on a CUDA GPU with the CUDA variant (marked `gpu`: skipped on machines without CUDA).

Same setup as the CPU integration tests: `built_variant` (WINATTN_VARIANT_DIR on the GPU machine, the cu130 build) is
published to the embedded Hub (`hub_repo`) and every selection loads it through `winattn.load`. Here the models run
on "cuda" in bfloat16 / float16, the dtypes the CUDA kernels take.

Accuracy rule (FlashAttention style, as tests/gpu/_helpers.py): the same low-precision model is run with the kernel
and with the framework's own attention, and both are compared with a float32 run of that model (weights and inputs
are the low-precision ones, widened, so only the arithmetic differs):

    max |ours - ref32| <= 2 * max |native_lowp - ref32| + 2 * eps(dtype) * max |ref32|

Swin's relative-position-table gradients (a reduction over every window) are checked by relative L2 error.
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from . import _models

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
NAME = "window_attn_hub"
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32

needs_fastvideo = pytest.mark.skipif(
    importlib.util.find_spec("fastvideo") is None,
    reason="FastVideo is not installed (not available on the GPU machine): FastVideo cases skipped")


# ----------------------------------------------------------------------------------------------------------------
# Helpers


@pytest.fixture(autouse=True)
def _ieee_fp32():
    """The float32 references are real float32: no TF32 in matmuls or convolutions (Swin's patch embedding)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _to(obj, dtype=None):
    """`obj` (tensors in dicts / lists / tuples) on DEVICE; floating-point tensors cast to `dtype` when given."""
    if isinstance(obj, torch.Tensor):
        if dtype is not None and obj.is_floating_point():
            return obj.to(device=DEVICE, dtype=dtype)
        return obj.to(device=DEVICE)
    if isinstance(obj, dict):
        return {k: _to(v, dtype) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(v, dtype) for v in obj)
    return obj


def _fa_close(name, got, lowp, ref, dtype):
    """FlashAttention's rule: err(ours) <= 2 * err(native in the same dtype) + two quanta of the dtype."""
    g, n, r = (t.detach().double() for t in (got, lowp, ref))
    assert g.shape == r.shape, f"{name}: shape {tuple(g.shape)} != {tuple(r.shape)}"
    assert torch.isfinite(r).all(), f"{name}: the float32 reference is not finite"
    assert torch.isfinite(g).all(), f"{name}: non-finite values"
    err = (g - r).abs().max().item()
    base = (n - r).abs().max().item()
    quanta = 2 * torch.finfo(dtype).eps * max(r.abs().max().item(), 1e-3)
    assert err <= 2 * base + quanta, f"{name}: max err {err:.3e} > 2 * {base:.3e} (native) + {quanta:.3e}"
    return err, base


def _rel_l2(got, ref) -> float:
    g, r = got.detach().double(), ref.detach().double()
    return (g - r).norm().item() / max(r.norm().item(), 1e-30)


def _expect_device_variant(module, built_variant, repo_id):
    """The module is the verified device build published from `built_variant`, not the reference."""
    from winattn.integrations import kernel_device_type

    info = module.__winattn_info__
    assert info.repo_id == repo_id and info.source == "hub", info
    assert not getattr(module, "IS_REFERENCE", False)
    assert info.variant == built_variant.name, f"loaded {info.variant}, published {built_variant.name}"
    assert kernel_device_type(module) == DEVICE
    smoke = info.check("smoke-test")
    assert smoke is not None and smoke.passed and f"on {DEVICE}" in smoke.detail, smoke
    if DEVICE == "cuda":
        assert "-cu" in info.variant, info.variant
        arch = info.check("arch")
        assert arch is not None and arch.status == "pass", arch  # this GPU's capability is in the variant's archs
    return info


class _Recorder:
    """Stands in for the loaded kernel module: records device, dtype and mask keywords of each `attention` call."""

    def __init__(self, module):
        self._module = module
        self.calls = []

    def attention(self, q, k, v, **kwargs):
        self.calls.append((q.device.type, q.dtype, {n for n in ("bias", "mask", "key_padding_mask") if n in kwargs}))
        return self._module.attention(q, k, v, **kwargs)

    def __getattr__(self, name):
        return getattr(self._module, name)


# ----------------------------------------------------------------------------------------------------------------
# diffusers


@pytest.fixture
def dispatch_calls(wd, ad, monkeypatch):
    """Every call of the window_attn_hub backend function made by diffusers' dispatcher: (keyword arguments, out)."""
    member = ad.AttentionBackendName(NAME)
    fn = ad._AttentionBackendRegistry._backends[member]
    calls = []

    def recording(**kwargs):
        out = fn(**kwargs)
        calls.append(({n: t.detach() if isinstance(t, torch.Tensor) else t for n, t in kwargs.items()},
                      (out[0] if isinstance(out, tuple) else out).detach()))
        return out

    monkeypatch.setitem(ad._AttentionBackendRegistry._backends, member, recording)
    return calls


def _check_attention_calls(ad, calls, dtype, what):
    """Each attention call the model made: the kernel's output vs diffusers' `native` backend on the very same
    q/k/v/mask, in `dtype` and in float32 (FA rule). This sees masks and their mapping without the dilution of the
    rest of the model."""
    assert calls
    native = ad.AttentionBackendName.NATIVE
    for i, (kw, out) in enumerate(calls):
        args = {n: kw[n] for n in ("attn_mask", "is_causal", "scale", "enable_gqa") if n in kw}
        lowp = ad.dispatch_attention_fn(kw["query"], kw["key"], kw["value"], backend=native, **args)
        mask = args.get("attn_mask")
        if mask is not None and mask.is_floating_point():
            args["attn_mask"] = mask.float()
        ref = ad.dispatch_attention_fn(*(kw[n].float() for n in ("query", "key", "value")), backend=native, **args)
        _fa_close(f"{what} attention call {i}", out, lowp, ref, dtype)


def _flux_d64(seed: int = 0):
    """Tiny Flux with head dim 64 (a real Flux head dim), an 8x8 latent with positions, and a text padding mask."""
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(seed)
    model = FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                   attention_head_dim=64, num_attention_heads=2, joint_attention_dim=32,
                                   pooled_projection_dim=32, axes_dims_rope=(16, 24, 24))
    rows, cols = torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij")
    img_ids = torch.stack([torch.zeros(64), rows.flatten(), cols.flatten()], dim=-1)
    mask = torch.ones(2, 1, 1, 64 + 16, dtype=torch.bool)
    mask[1, ..., 11:16] = False  # padding text tokens of sample 1 (text comes first in Flux's joint sequence)
    inputs = dict(hidden_states=torch.randn(2, 64, 4), encoder_hidden_states=torch.randn(2, 16, 32),
                  pooled_projections=torch.randn(2, 32), timestep=torch.ones(2), img_ids=img_ids,
                  txt_ids=torch.zeros(16, 3), joint_attention_kwargs={"attention_mask": mask})
    return model, inputs


MODELS = dict(_models.MODELS, flux_d64=_flux_d64)
MASK_KINDS = {"qwenimage": {"key_padding_mask"}, "flux_masked": {"key_padding_mask"}, "flux_d64": {"key_padding_mask"},
              "hunyuan_video": {"key_padding_mask"}, "ltx_video": {"bias"}}


def _loud_padding(inputs, factor=20.0):
    """Give the padded text tokens large embeddings, so that a padding mask the kernel did not apply shows in the
    output (with the tiny random models a few ignored keys would otherwise hide in bf16 rounding)."""
    text = inputs.get("encoder_hidden_states")
    keep = None
    for key in ("encoder_hidden_states_mask", "encoder_attention_mask"):  # QwenImage; LTX-Video, HunyuanVideo
        if key in inputs:
            keep = inputs[key].bool()
    mask = (inputs.get("joint_attention_kwargs") or {}).get("attention_mask")
    if mask is not None:  # Flux: [B, 1, 1, text + image], text first
        keep = mask[:, 0, 0, :text.shape[1]]
    if keep is not None:
        assert not keep.all(), "the model's inputs have padding"
        inputs["encoder_hidden_states"] = torch.where(keep[..., None], text, text * factor)
    return inputs


def _lowp_and_ref(name, dtype):
    """(model, inputs) in `dtype` on DEVICE and the float32 copy of exactly those weights and inputs."""
    model, inputs = MODELS[name]()
    inputs = _loud_padding(inputs)
    lowp = model.to(device=DEVICE, dtype=dtype).eval()
    inputs_lp = _to(inputs, dtype)
    ref = copy.deepcopy(lowp).float()
    return lowp, inputs_lp, ref, _to(inputs_lp, FP32)


def test_diffusers_selection_loads_the_device_variant(wd, ad, load_calls, hub_repo, built_variant):
    model, inputs, _, _ = _lowp_and_ref("flux", BF16)
    model.set_attention_backend(NAME)
    assert len(load_calls) == 1 and load_calls[0][0][0] == hub_repo.repo_id
    info = _expect_device_variant(wd._BACKENDS[NAME].module, built_variant, hub_repo.repo_id)
    assert load_calls[0][1]["trust_remote_code"] is False and info.trust
    # the scoped selection uses the same (cached) verified module
    with ad.attention_backend(NAME):
        assert ad._AttentionBackendRegistry._active_backend == NAME
    assert wd._BACKENDS[NAME].module.__winattn_info__ is info and len(load_calls) == 1


def test_diffusers_context_manager_selection_on_device(wd, ad, load_calls, hub_repo, built_variant):
    model, inputs, ref, inputs_ref = _lowp_and_ref("flux", BF16)
    with torch.no_grad():
        native = _models.output(model(**inputs))
        expected = _models.output(ref(**inputs_ref))
    with ad.attention_backend(NAME):
        assert len(load_calls) == 1
        _expect_device_variant(wd._BACKENDS[NAME].module, built_variant, hub_repo.repo_id)
        spy = wd._BACKENDS[NAME].module = _Recorder(wd._BACKENDS[NAME].module)
        with torch.no_grad():
            out = _models.output(model(**inputs))
    assert spy.calls and all(c[:2] == (DEVICE, BF16) for c in spy.calls)
    _fa_close("flux out", out, native, expected, BF16)


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", ["flux", "flux_d64", "flux_masked", "qwenimage", "ltx_video", "wan",
                                  "hunyuan_video"])
def test_diffusers_model_matches_native(wd, ad, dispatch_calls, name, dtype):
    """Each tiny transformer with window_attn_hub vs `native`, both in `dtype` on the GPU, against float32 native
    (model output, and every attention call on its own inputs); masks reach the kernel in the same slots as on CPU
    (QwenImage/HunyuanVideo/Flux bool key padding, LTX-Video float bias)."""
    model, inputs, ref, inputs_ref = _lowp_and_ref(name, dtype)
    with torch.no_grad():
        native = _models.output(model(**inputs))
        expected = _models.output(ref(**inputs_ref))
    model.set_attention_backend(NAME)
    spy = wd._BACKENDS[NAME].module = _Recorder(wd._BACKENDS[NAME].module)
    with torch.no_grad():
        out = _models.output(model(**inputs))
    assert spy.calls, "the model's attention reached the kernel"
    assert {c[:2] for c in spy.calls} == {(DEVICE, dtype)}
    assert set().union(*(c[2] for c in spy.calls)) == MASK_KINDS.get(name, set())
    assert out.dtype == dtype
    _fa_close(f"{name} out", out, native, expected, dtype)
    assert len(dispatch_calls) == len(spy.calls)
    _check_attention_calls(ad, dispatch_calls, dtype, name)


@pytest.mark.parametrize("name", ["flux_masked", "flux_d64", "ltx_video"])
def test_diffusers_training_step_gradients(wd, name):
    """One bf16 training step: every parameter gradient with the kernel's backward vs `native`, against float32."""
    model, inputs, ref, inputs_ref = _lowp_and_ref(name, BF16)
    ours = copy.deepcopy(model)
    ours.set_attention_backend(NAME)
    grads = {}
    for key, m, x in (("native", model, inputs), ("ours", ours, inputs), ("ref", ref, inputs_ref)):
        m.train()
        m.zero_grad()
        out = _models.output(m(**x))
        out.float().square().mean().backward()
        grads[key] = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    assert grads["ours"].keys() == grads["native"].keys() == grads["ref"].keys() and grads["ref"]
    attn = [n for n in grads["ref"] if n.endswith("to_q.weight")]
    assert attn and all(grads["ours"][n].abs().sum() > 0 for n in attn), "gradients flow through the kernel"
    for n in grads["ref"]:
        _fa_close(f"{name} d{n}", grads["ours"][n], grads["native"][n], grads["ref"][n], BF16)


def test_diffusers_fp32_on_cuda_is_refused_not_run_elsewhere(wd, ad, hub_repo, built_variant):
    """A float32 model on the GPU: selection loads the CUDA build (no silent reference fallback), and the forward
    raises a clear error (the CUDA kernels take fp16/bf16) instead of computing anything; with diffusers'
    constraint checks on, the backend's dtype constraint says so first. An explicit fallback="reference" does not
    change that: it only applies when no variant fits the machine."""
    if DEVICE != "cuda":
        pytest.skip("float32 is a CUDA-only restriction")
    model, inputs = _models.flux()
    model, inputs = model.to(DEVICE), _to(inputs)
    model.set_attention_backend(NAME)
    _expect_device_variant(wd._BACKENDS[NAME].module, built_variant, hub_repo.repo_id)
    with torch.no_grad(), pytest.raises(ValueError, match="CUDA kernels take float16 or bfloat16.*got float32"):
        model(**inputs)
    ad._AttentionBackendRegistry._checks_enabled = True
    with torch.no_grad(), pytest.raises(ValueError, match=r"cuda build.*float16.*bfloat16.*got torch\.float32"):
        model(**inputs)
    ad._AttentionBackendRegistry._checks_enabled = False

    wd.register("window_attn_hub_fb", fallback="reference")
    twin, _ = _models.flux()
    twin = twin.to(DEVICE)
    twin.set_attention_backend("window_attn_hub_fb")
    assert wd._BACKENDS["window_attn_hub_fb"].module.__winattn_info__.source == "hub"
    with torch.no_grad(), pytest.raises(ValueError, match="CUDA kernels take float16 or bfloat16"):
        twin(**inputs)


# ----------------------------------------------------------------------------------------------------------------
# timm Swin


class _SwinCalls(list):
    """(device, dtype) of every `window_attention` call of the kernel layer; `.inputs` keeps their arguments."""

    def __init__(self):
        super().__init__()
        self.inputs = []


@pytest.fixture
def swin_calls(hub_repo, monkeypatch):
    """Records every `window_attention` call inside the loaded kernel's layers module (what timm's blocks run)."""
    import sys

    from winattn.integrations.timm import VerifiedLayerRepository

    layer = VerifiedLayerRepository().load()
    layers = sys.modules[layer.__module__]
    calls = _SwinCalls()
    real = layers.window_attention

    def recording(q, k, v, **kwargs):
        calls.append((q.device.type, q.dtype))
        calls.inputs.append((q.detach(), k.detach(), v.detach(),
                             {n: t.detach() if isinstance(t, torch.Tensor) else t for n, t in kwargs.items()}))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(layers, "window_attention", recording)
    calls.real = real
    return calls


@pytest.mark.parametrize("how", ["autocast-bf16", "bf16", "fp16"])
def test_timm_swin_inference_matches_timm(swin_calls, hub_repo, built_variant, how):
    from winattn.integrations.timm import Mode, VerifiedLayerRepository, kernelize_swin

    from .test_timm import tiny_swin

    _expect_device_variant(VerifiedLayerRepository().load_module(), built_variant, hub_repo.repo_id)
    dtype = FP16 if how == "fp16" else BF16
    base = tiny_swin().eval().to(DEVICE)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    amp = how.startswith("autocast")
    if amp:  # float32 weights and input, bf16 compute
        model, ref, x_lp = base, base, x
    else:  # the whole model in `dtype`; the reference is the same weights widened
        model = copy.deepcopy(base).to(dtype)
        ref, x_lp = copy.deepcopy(model).float(), x.to(dtype)
        x = x_lp.float()
    ours = kernelize_swin(copy.deepcopy(model), mode=Mode.INFERENCE)
    with torch.no_grad():
        expected = ref(x)
        with torch.autocast(device_type=DEVICE, dtype=dtype, enabled=amp):
            native = model(x_lp)
            got = ours(x_lp)
    assert len(swin_calls) == 4 and set(swin_calls) == {(DEVICE, dtype)}
    _fa_close(f"swin {how} out", got, native, expected, dtype)


def test_timm_swin_training_gradients_autocast(swin_calls, hub_repo):
    """One training step under bf16 autocast (float32 weights, as in real training), kernelized vs timm's own
    forward under the same autocast, both against float32: logits and every parameter gradient by the FA rule; the
    relative-position bias tables' gradients (the kernel's on-chip dTable) by relative L2 error, <= 1e-2 or within
    2x of timm's own bf16 error (end to end, bf16 rounding of the whole block dominates). Then the kernel alone on
    the exact (strided, bf16) q/k/v, table, index and shift mask the blocks passed it: dTable vs float64 reference
    by relative L2 <= 1e-2."""
    from winattn.integrations.timm import Mode, VerifiedLayerRepository, kernelize_swin

    from .test_timm import tiny_swin

    model = tiny_swin(seed=1, drop_path_rate=0.0).train().to(DEVICE)  # no stochastic depth: same graph each run
    ours = kernelize_swin(copy.deepcopy(model), mode=Mode.TRAINING)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 32, 32, generator=g).to(DEVICE)
    target = torch.tensor([3, 7], device=DEVICE)
    outs, grads = {}, {}
    for key, m, amp in (("native", model, True), ("ours", ours, True), ("ref", copy.deepcopy(model), False)):
        m.zero_grad()
        with torch.autocast(device_type=DEVICE, dtype=BF16, enabled=amp):
            logits = m(x)
        torch.nn.functional.cross_entropy(logits.float(), target).backward()
        outs[key] = logits.detach()
        grads[key] = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    assert len(swin_calls) == 4 and set(swin_calls) == {(DEVICE, BF16)}
    _fa_close("swin logits", outs["ours"], outs["native"], outs["ref"], BF16)
    tables = [n for n in grads["ref"] if n.endswith("relative_position_bias_table")]
    assert len(tables) == 4 and grads["ours"].keys() == grads["native"].keys() == grads["ref"].keys()
    for n in tables:
        assert grads["ours"][n].dtype == FP32 and grads["ours"][n].abs().sum() > 0
        rel, rel_native = _rel_l2(grads["ours"][n], grads["ref"][n]), _rel_l2(grads["native"][n], grads["ref"][n])
        assert rel <= max(1e-2, 2 * rel_native), \
            f"d{n}: relative L2 error {rel:.3e} > max(1e-2, 2 * {rel_native:.3e} (timm under autocast))"
    for n in grads["ref"]:
        _fa_close(f"swin d{n}", grads["ours"][n], grads["native"][n], grads["ref"][n], BF16)

    reference = VerifiedLayerRepository().load_module().reference
    masked = 0
    for i, (q, k, v, kw) in enumerate(swin_calls.inputs):
        assert q.dtype == BF16 and kw["rel_pos_table"].dtype == FP32
        masked += kw.get("mask") is not None
        table = kw["rel_pos_table"].clone().requires_grad_(True)
        table64 = kw["rel_pos_table"].double().requires_grad_(True)
        mask = kw.get("mask")
        out = swin_calls.real(q, k, v, rel_pos_table=table, rel_pos_index=kw["rel_pos_index"], mask=mask,
                              scale=kw.get("scale"))
        out64 = reference.window_attention(q.double(), k.double(), v.double(), rel_pos_table=table64,
                                           rel_pos_index=kw["rel_pos_index"],
                                           mask=None if mask is None else mask.double(), scale=kw.get("scale"))
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(i)).to(DEVICE, BF16)
        out.backward(dout)
        out64.backward(dout.double())
        rel = _rel_l2(table.grad, table64.grad)
        assert rel <= 1e-2, f"block {i}: dTable relative L2 error {rel:.3e} > 1e-2 on the block's own inputs"
    assert masked == 1, "the shifted block (stage 1) passed its shift mask"


def test_timm_swin_fp32_on_cuda_is_refused(hub_repo):
    if DEVICE != "cuda":
        pytest.skip("float32 is a CUDA-only restriction")
    from winattn.integrations.timm import Mode, kernelize_swin

    from .test_timm import tiny_swin

    model = kernelize_swin(tiny_swin().eval().to(DEVICE), mode=Mode.INFERENCE)
    with torch.no_grad(), pytest.raises(ValueError, match="CUDA kernels take float16 or bfloat16.*got float32"):
        model(torch.randn(1, 3, 32, 32, device=DEVICE))


# ----------------------------------------------------------------------------------------------------------------
# timm BEiT / vit_relpos (kernelize_relpos)

# test_timm_relpos.tiny(name, **kwargs) configs, and the kernel calls their 2 blocks make per forward
RELPOS_GPU_CASES = {
    "beit_table": ("beit_base_patch16_224", dict(), [("attention", (1, 4, 17, 17))]),
    "beit_table_and_shared": ("beit_base_patch16_224", dict(use_shared_rel_pos_bias=True),
                              [("attention", (1, 4, 17, 17))]),
    "beit_shared": ("beit_base_patch16_224", dict(use_rel_pos_bias=False, use_shared_rel_pos_bias=True),
                    [("attention", (4, 17, 17))]),
    "relpos_bias_cls": ("vit_relpos_base_patch16_224", dict(rel_pos_type="bias", class_token=True),
                        [("attention", (1, 4, 17, 17))]),
    "relpos_mlp": ("vit_relpos_base_patch16_224", dict(), [("attention", (1, 4, 16, 16))]),
    "srelpos": ("vit_srelpos_small_patch16_224", dict(), [("attention", (1, 4, 16, 16))]),
}


@pytest.mark.parametrize("case", list(RELPOS_GPU_CASES))
def test_timm_relpos_training_gradients_autocast(relpos_kernel_calls, hub_repo, built_variant, case):
    """One training step under bf16 autocast, kernelized vs timm under the same autocast, both against float32 (eval
    mode: RelPosMlp's dropout off): logits and every gradient by the FA rule; relative-position tables (the kernel's
    dTable for BEiT and RelPosBias, autograd through the dBias for the shared bias) also by relative L2 error,
    <= 1e-2 or within 2x of timm's own bf16 error."""
    from winattn.integrations.timm import Mode, VerifiedLayerRepository, kernelize_relpos

    from .test_timm_relpos import tiny

    _expect_device_variant(VerifiedLayerRepository().load_module(), built_variant, hub_repo.repo_id)
    name, kwargs, calls = RELPOS_GPU_CASES[case]
    model = tiny(name, seed=3, **kwargs).eval().to(DEVICE)
    ours = kernelize_relpos(copy.deepcopy(model), mode=Mode.TRAINING)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    target = torch.tensor([3, 7], device=DEVICE)
    outs, grads = {}, {}
    for key, m, amp in (("native", model, True), ("ours", ours, True), ("ref", copy.deepcopy(model), False)):
        m.zero_grad()
        with torch.autocast(device_type=DEVICE, dtype=BF16, enabled=amp):
            logits = m(x)
        torch.nn.functional.cross_entropy(logits.float(), target).backward()
        outs[key] = logits.detach()
        grads[key] = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    assert relpos_kernel_calls == calls * 2
    _fa_close(f"{case} logits", outs["ours"], outs["native"], outs["ref"], BF16)
    assert grads["ours"].keys() == grads["native"].keys() == grads["ref"].keys()
    tables = [n for n in grads["ref"] if n.endswith("relative_position_bias_table")]
    assert bool(tables) == ("mlp" not in case and case != "srelpos")
    for n in tables:
        assert grads["ours"][n].dtype == FP32 and grads["ours"][n].abs().sum() > 0
        rel, rel_native = _rel_l2(grads["ours"][n], grads["ref"][n]), _rel_l2(grads["native"][n], grads["ref"][n])
        assert rel <= max(1e-2, 2 * rel_native), \
            f"d{n}: relative L2 error {rel:.3e} > max(1e-2, 2 * {rel_native:.3e} (timm under autocast))"
    for n in grads["ref"]:
        _fa_close(f"{case} d{n}", grads["ours"][n], grads["native"][n], grads["ref"][n], BF16)


# ----------------------------------------------------------------------------------------------------------------
# FastVideo (only where it is installed)


@pytest.fixture
def wf(hub_repo, monkeypatch):
    import winattn.integrations.fastvideo as wf
    from fastvideo.attention import selector

    monkeypatch.delenv("FASTVIDEO_ATTENTION_BACKEND", raising=False)
    wf.register(propagate=False)
    wf.unload()
    selector._cached_get_attn_backend.cache_clear()
    yield wf
    selector._cached_get_attn_backend.cache_clear()
    wf.unload()


def _fv_inputs(dtype, B=2, S=40, H=4, Hkv=2, D=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, H, D, generator=g)
    k, v = torch.randn(B, S, Hkv, D, generator=g), torch.randn(B, S, Hkv, D, generator=g)
    pad = torch.ones(B, S, dtype=torch.long)
    pad[1, 25:] = 0
    masks = {None: None, "int_key_padding": pad, "bool_key_padding": pad.bool(),
             "float_key_padding": torch.where(pad.bool(), 0.0, -1e4),
             "bool_3d": (torch.rand(B, S, S, generator=g) > 0.3) | torch.eye(S, dtype=torch.bool),
             "float_4d": torch.randn(B, H, S, S, generator=g)}
    return [t.to(DEVICE, dtype) for t in (q, k, v)], {n: _to(m, dtype) for n, m in masks.items()}


@needs_fastvideo
@pytest.mark.parametrize("mask_kind, causal", [(None, False), (None, True), ("int_key_padding", False),
                                               ("bool_key_padding", False), ("float_key_padding", False),
                                               ("bool_3d", False), ("float_4d", False)])
def test_fastvideo_impl_matches_sdpa_impl(wf, mask_kind, causal):
    """WindowAttnHubImpl vs FastVideo's SDPAImpl, both in bf16 on the device (GQA 4/2 heads, head dim 64), against
    SDPAImpl in float32 on the same rounded inputs, with each mask form FastVideo passes, and causal."""
    from fastvideo.attention.backends.sdpa import SDPAImpl, SDPAMetadata

    from winattn.integrations import kernel_device_type

    H, Hkv, D = 4, 2, 64
    (q, k, v), masks = _fv_inputs(BF16)
    q32, k32, v32 = q.float(), k.float(), v.float()  # the same rounded inputs

    def meta(m):
        return None if m is None else SDPAMetadata(current_timestep=0, attn_mask=m)

    args = dict(num_heads=H, head_size=D, softmax_scale=0.1, num_kv_heads=Hkv, causal=causal)
    ours = wf.WindowAttnHubImpl(**args)
    assert ours.kernel.__winattn_info__.source == "hub" and kernel_device_type(ours.kernel) == DEVICE
    ref = SDPAImpl(**args)
    out = ours.forward(q, k, v, meta(masks[mask_kind]))
    native = ref.forward(q, k, v, meta(masks[mask_kind]))
    mask32 = masks[mask_kind].float() if mask_kind and masks[mask_kind].is_floating_point() else masks[mask_kind]
    expected = ref.forward(q32, k32, v32, meta(mask32))
    assert out.dtype == BF16 and out.device.type == DEVICE
    _fa_close(f"fastvideo {mask_kind} causal={causal}", out, native, expected, BF16)


@needs_fastvideo
def test_fastvideo_layer_selection_on_device(wf, monkeypatch, hub_repo, built_variant):
    """FASTVIDEO_ATTENTION_BACKEND=WINDOW_ATTN_HUB with a bf16 compute dtype selects the device build for a layer
    with a hard-coded (FLASH_ATTN, TORCH_SDPA) tuple, and its forward matches torch SDPA; a float32 compute dtype
    on CUDA is refused while the layer is built (no fallback to another FastVideo backend)."""
    from fastvideo.attention import selector
    from fastvideo.attention.layer import LocalAttention
    from fastvideo.forward_context import set_forward_context
    from fastvideo.platforms import AttentionBackendEnum as E

    monkeypatch.setenv("FASTVIDEO_ATTENTION_BACKEND", "WINDOW_ATTN_HUB")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(BF16)
    try:
        layer = LocalAttention(num_heads=2, head_size=64, supported_attention_backends=(E.FLASH_ATTN, E.TORCH_SDPA))
    finally:
        torch.set_default_dtype(previous)
    assert isinstance(layer.attn_impl, wf.WindowAttnHubImpl)
    _expect_device_variant(layer.attn_impl.kernel, built_variant, hub_repo.repo_id)
    (q, k, v), _ = _fv_inputs(BF16, H=2, Hkv=2)
    with set_forward_context(current_timestep=0, attn_metadata=None):
        out = layer(q, k, v)

    def sdpa(*t):
        return torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2) for x in t)).transpose(1, 2)

    _fa_close("fastvideo layer", out, sdpa(q, k, v), sdpa(q.float(), k.float(), v.float()), BF16)
    if DEVICE == "cuda":
        selector._cached_get_attn_backend.cache_clear()
        with pytest.raises(ValueError, match=r"compute dtype torch\.float32 is not supported by the cuda build"):
            LocalAttention(num_heads=2, head_size=64, supported_attention_backends=(E.FLASH_ATTN, E.TORCH_SDPA))
