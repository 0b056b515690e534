"""Correctness of the compiled kernel (forward + backward) against the float64 reference.

Runs unchanged on CPU (CI) and on a GPU (`device` fixture = "cuda"; float32 cases are skipped there, the CUDA
kernels take float16/bfloat16).

Accuracy rule (the FlashAttention one): for every output and for dq/dk/dv,

    max |kernel - ref64| <= 2 * max |same - ref64| + 2 * eps(dtype) * max |ref64|

where ref64 is `kernel.reference` run in float64 on the same (rounded) inputs, `same` is the reference run on the
inputs in their own dtype (float32 for float32 inputs; the reference computes in float32 and rounds its results
to the input dtype for float16/bfloat16), and the last term is two rounding quanta of the dtype at the scale of
the result. Bias and relative-position-table gradients (reductions over many scores) are checked by relative L2
error <= 1e-2 against ref64. lse: the same rule with a floor of 1e-3 (16-bit) relative. Where a gradient is
exactly zero (dq / dk of rows that see one key; dbias broadcast over the keys) the rule's scale is 0: those are
bounded by the rounding of the output that a flash-style backward's delta = rowsum(dO * O) reads.

Inputs are fresh random tensors (never zeros). Before each kernel call the allocator is poisoned with a NaN-filled
block of the output's size, so an output element the kernel forgets to write shows up as NaN (effective with the
CUDA caching allocator; on CPU large blocks come from fresh zeroed pages, which the value checks still catch).
"""

import math

import pytest
import torch

from swin_index import beit_relative_index, swin_relative_index

pytestmark = pytest.mark.kernels_ci  # the kernel's own correctness: kernel-builder's ci-test subset (~6 s on CPU)

# --------------------------------------------------------------------------------------------------------------
# helpers

ALL_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
_DT_ID = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _skip_unsupported(device, dtype):
    if device == "cuda" and dtype == torch.float32:
        pytest.skip("the CUDA kernels take float16/bfloat16")


def _low_precision(device):
    """A half-precision dtype every backend supports (for tests that are not about dtypes)."""
    return torch.float32 if device == "cpu" else torch.bfloat16


def _rand(*shape, dtype, device, grad=True, scale=1.0):
    t = torch.randn(*shape, device=device, dtype=torch.float32) * scale
    t = t.to(dtype)
    return t.requires_grad_(grad)


def _poison(device, like_numel, dtype):
    """Leave a NaN-filled block in the allocator so a reused block exposes unwritten outputs."""
    x = torch.full((max(int(like_numel), 1),), float("nan"), dtype=dtype, device=device)
    del x


def _leaves64(tensors):
    return [None if t is None else t.detach().double().requires_grad_(t.requires_grad) for t in tensors]


def _leaves_same(tensors):
    return [None if t is None else t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]


def _grads(tensors):
    return [None if (t is None or not t.requires_grad) else t.grad for t in tensors]


def assert_fa_close(name, got, same, ref64, dtype):
    assert got.shape == ref64.shape, f"{name}: shape {tuple(got.shape)} != {tuple(ref64.shape)}"
    assert got.dtype == same.dtype, f"{name}: dtype {got.dtype} != {same.dtype}"
    got64 = got.detach().double()
    assert torch.isfinite(got64).all(), f"{name}: non-finite values"
    err = (got64 - ref64).abs().max().item()
    base = (same.detach().double() - ref64).abs().max().item()
    quanta = 2 * torch.finfo(dtype).eps * ref64.abs().max().item()
    assert err <= 2 * base + quanta, (
        f"{name} ({dtype}): max|kernel - ref64| = {err:.3e} > 2 * {base:.3e} (same-dtype reference) + {quanta:.3e}"
    )


def assert_rel_l2(name, got, ref64, tol=1e-2):
    assert got.shape == ref64.shape, f"{name}: shape {tuple(got.shape)} != {tuple(ref64.shape)}"
    got64 = got.detach().double()
    assert torch.isfinite(got64).all(), f"{name}: non-finite values"
    # A bias broadcast over the keys gets an exactly-zero gradient (softmax is shift invariant per row); the
    # floor keeps that case from dividing rounding noise by ~0.
    denom = max(ref64.norm().item(), 1e-3 * math.sqrt(ref64.numel()))
    err = (got64 - ref64).norm().item() / denom
    assert err <= tol, f"{name}: relative L2 error {err:.3e} > {tol}"


def check_attention(kernel, dtype, q, k, v, *, bias=None, return_lse=False, **kw):
    """Runs kernel / same-dtype reference / float64 reference forward + backward and compares everything."""
    inputs = [q, k, v, bias]
    _poison(q.device, q.numel() * 2, q.dtype)
    out = kernel.attention(q, k, v, bias=bias, return_lse=return_lse, **kw)
    if return_lse:
        out, lse = out
    same_in = _leaves_same(inputs)
    ref_in = _leaves64(inputs)
    same = kernel.reference.attention(*same_in[:3], bias=same_in[3], return_lse=return_lse, **kw)
    ref = kernel.reference.attention(*ref_in[:3], bias=ref_in[3], return_lse=return_lse, **kw)
    if return_lse:
        same, same_lse = same
        ref, ref_lse = ref
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), finite), "lse: -inf pattern differs from the reference"
        assert (lse[~finite] == float("-inf")).all(), "lse of a fully masked row must be -inf"
        # the FA rule with a fixed floor: a term the API rounds to q's dtype (a float16 bias on bfloat16 q) moves
        # the same-dtype reference's lse as much as the kernel's
        tol = 1e-5 if dtype == torch.float32 else 1e-3
        err = (lse[finite].double() - ref_lse[finite].double()).abs()
        base = (same_lse[finite].double() - ref_lse[finite].double()).abs().max() if finite.any() else 0.0
        allowed = 2 * base + tol * (1 + ref_lse[finite].double().abs())
        assert (err <= allowed).all(), f"lse: max error {err.max().item():.3e} past the rule (same-dtype {base:.3e})"
    assert_fa_close("out", out, same, ref.detach(), dtype)

    if not any(t is not None and t.requires_grad for t in inputs):
        return out
    g = torch.randn(out.shape, device=out.device, dtype=torch.float32).to(out.dtype)
    _poison(q.device, q.numel() * 4, q.dtype)
    out.backward(g)
    same.backward(g)
    ref.backward(g.double())
    for name, t, s, r in zip(("dq", "dk", "dv"), inputs[:3], same_in[:3], ref_in[:3]):
        if not t.requires_grad:  # (only the bias learns)
            assert t.grad is None, f"{name}: a gradient for an input that does not require one"
            continue
        if name != "dv" and r.grad.abs().max() == 0:
            _check_zero_dqk(name, t.grad, q, k, out, g, kw.get("scale"), dtype)
        else:
            assert_fa_close(name, t.grad, s.grad, r.grad, dtype)
    if bias is not None and bias.requires_grad:
        assert bias.grad.shape == bias.shape and bias.grad.dtype == bias.dtype
        if bias.shape[-1] == 1 and k.shape[1] > 1:
            _check_key_broadcast_dbias(bias.grad, ref_in[3].grad, out, g, dtype)
        else:
            assert_rel_l2("dbias", bias.grad, ref_in[3].grad)
    return out


def _check_key_broadcast_dbias(got, ref64, out, g, dtype):
    """A bias broadcast over the keys has an exactly-zero gradient (softmax is shift invariant per row): each
    entry is a sum over its rows i of sum_j dS[i, j] = 0. Flash-attention style backwards compute
    delta_i = rowsum(dO * O) from the output rounded to `dtype`, so each row contributes up to
    eps/2 * sum_d |dO_id * O_id|; the bound below is eps times that, summed like the gradient."""
    per_row = (g.double().abs() * out.detach().double().abs()).sum(-1).transpose(1, 2)[..., None]  # [B, H, Sq, 1]
    bound = per_row.sum_to_size(got.shape) * torch.finfo(dtype).eps + 1e-4
    err = (got.double() - ref64).abs()
    assert (err <= bound).all(), (
        f"dbias (key-broadcast): max error {err.max().item():.3e}, bound {bound.min().item():.3e}"
    )


def _check_zero_dqk(name, got, q, k, out, g, scale, dtype):
    """dq / dk are exactly zero when every row sees at most one key (Sk = 1, a one-key band): dS = P (dP - delta)
    with P = 1 and dP = delta. A flash-style backward takes delta = rowsum(dO * O) from the output rounded to
    `dtype`, so dS is that rounding (<= eps / 2 * sum_d |dO_id * O_id|) and dq, dk are it times |scale| |k|, |q|;
    the bound is eps times that (two quanta at the scale the rule's last term has no magnitude for)."""
    D = q.shape[-1]
    scale = abs(float(scale)) if scale is not None else D ** -0.5
    delta = (g.double().abs() * out.detach().double().abs()).sum(-1).max().item()
    other = max(q.detach().abs().max().item(), k.detach().abs().max().item())
    bound = torch.finfo(dtype).eps * scale * delta * other + 1e-6
    err = got.detach().double().abs().max().item()
    assert torch.isfinite(got).all() and err <= bound, (
        f"{name}: exact zero expected, max |{name}| = {err:.3e} > {bound:.3e}")


def _qkv(B, Sq, Sk, H, Hkv, D, dtype, device):
    return (
        _rand(B, Sq, H, D, dtype=dtype, device=device),
        _rand(B, Sk, Hkv, D, dtype=dtype, device=device),
        _rand(B, Sk, Hkv, D, dtype=dtype, device=device),
    )


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# --------------------------------------------------------------------------------------------------------------
# shapes x dtypes


SHAPES = [  # (B, Sq, Sk, H, D)
    (2, 49, 49, 3, 40),
    (1, 144, 144, 2, 72),
    (2, 33, 77, 2, 80),
    (1, 77, 33, 2, 160),
    (2, 64, 64, 2, 8),
    (1, 20, 50, 2, 256),
]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_DT_ID.get)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}_Sq{}_Sk{}_H{}_D{}".format(*s))
def test_shapes_dtypes(kernel, device, dtype, shape):
    _skip_unsupported(device, dtype)
    B, Sq, Sk, H, D = shape
    q, k, v = _qkv(B, Sq, Sk, H, H, D, dtype, device)
    bias = _rand(1, H, Sq, Sk, dtype=dtype, device=device)
    check_attention(kernel, dtype, q, k, v, bias=bias)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_DT_ID.get)
def test_no_bias_strided_inputs(kernel, device, dtype):
    """q/k/v as non-contiguous views ([B, H, S, D] storage transposed, a packed qkv slice)."""
    _skip_unsupported(device, dtype)
    B, S, H, D = 2, 70, 2, 40
    qkv = torch.randn(B, S, 3, H, D, device=device).to(dtype)
    q, k, v = (qkv[:, :, i].detach().requires_grad_() for i in range(3))
    q = torch.randn(B, H, S, D, device=device).to(dtype).transpose(1, 2).detach().requires_grad_()
    check_attention(kernel, dtype, q, k, v)


# --------------------------------------------------------------------------------------------------------------
# bias broadcasting: gradients come back reduced to the bias's own shape

B_, H_, SQ_, SK_ = 4, 3, 37, 45
BIAS_SHAPES = [
    (1, H_, SQ_, SK_),
    (B_, 1, SQ_, SK_),
    (B_, H_, 1, SK_),
    (B_, H_, SQ_, 1),
    (B_, H_, SQ_, SK_),
    (SQ_, SK_),
    (H_, 1, 1),
    (1, 1, SK_),
    (1,),
    (B_, 1, 1, 1),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_DT_ID.get)
@pytest.mark.parametrize("bias_shape", BIAS_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_bias_broadcast(kernel, device, dtype, bias_shape):
    if device == "cuda" and dtype == torch.float32:
        dtype = torch.float16
    q, k, v = _qkv(B_, SQ_, SK_, H_, H_, 32, dtype, device)
    bias = _rand(*bias_shape, dtype=dtype, device=device)
    check_attention(kernel, dtype, q, k, v, bias=bias)


def test_bias_fp32_with_low_precision_inputs(kernel, device):
    q, k, v = _qkv(2, 40, 40, 2, 2, 32, torch.bfloat16, device)
    bias = _rand(2, 1, 40, 40, dtype=torch.float32, device=device)
    check_attention(kernel, torch.bfloat16, q, k, v, bias=bias)


def test_bias_noncontiguous_view(kernel, device):
    dtype = _low_precision(device)
    q, k, v = _qkv(2, 30, 30, 2, 2, 32, dtype, device)
    base = torch.randn(2, 30, 30, device=device).to(dtype)
    bias = base.transpose(-1, -2)[:, None].detach().requires_grad_()  # [2, 1, 30, 30], stride_k != 1
    check_attention(kernel, dtype, q, k, v, bias=bias)


EXPANDED = {"batch": (1, 3, 80, 80), "heads": (2, 1, 80, 80), "rows": (2, 3, 1, 80), "heads_rows": (2, 1, 1, 80)}


@pytest.mark.parametrize("form", list(EXPANDED))
@pytest.mark.parametrize("learn", [False, True], ids=["frozen", "learnable"])
def test_expanded_bias_views(kernel, device, form, learn):
    """A bias `.expand()`-ed to [B, H, S, S] (what pipelines do to a per-head or per-item mask) has stride 0 on full
    dims; the op takes it as given (nothing copied), so every kernel must read a zero stride, and the forward path
    that stages the bias through a TMA tensor map (16-bit, 16-byte rows, here S = 80) gets zero strides in its map.
    The gradient reaches the expanded tensor's base through autograd."""
    dtype = _low_precision(device)
    B, H, S = 2, 3, 80
    q, k, v = _qkv(B, S, S, H, H, 64, dtype, device)
    base = _rand(*EXPANDED[form], dtype=dtype, device=device, grad=learn)
    bias = base.expand(B, H, S, S)
    assert 0 in bias.stride()
    out = check_attention(kernel, dtype, q, k, v, bias=bias.detach())  # (the same view: detach keeps the strides)
    if learn:  # the gradient of the base, through the expand (check_attention compares leaves' gradients)
        ref_base = base.detach().double().requires_grad_()
        ref = kernel.reference.attention(q.detach().double(), k.detach().double(), v.detach().double(),
                                         bias=ref_base.expand(B, H, S, S))
        g = torch.randn(out.shape, device=device, dtype=torch.float32).to(dtype)
        (dbase,) = torch.autograd.grad(kernel.attention(q, k, v, bias=bias), base, g)
        ref.backward(g.double())
        assert_rel_l2("dbias (base of the expanded view)", dbase, ref_base.grad)


def test_bias_without_grad(kernel, device):
    dtype = _low_precision(device)
    q, k, v = _qkv(2, 30, 30, 2, 2, 32, dtype, device)
    bias = _rand(1, 2, 30, 30, dtype=dtype, device=device, grad=False)
    check_attention(kernel, dtype, q, k, v, bias=bias)
    assert bias.grad is None


# --------------------------------------------------------------------------------------------------------------
# masks, causal, windows, GQA

MASK_SHAPES = [(2, 1, 41, 53), (41, 53), (1, 2, 1, 53), (2, 2, 41, 53), (2, 2, 41, 1), "transposed"]


@pytest.mark.parametrize("mask_shape", MASK_SHAPES, ids=lambda s: s if isinstance(s, str) else "x".join(map(str, s)))
def test_bool_mask_broadcast(kernel, device, mask_shape):
    dtype = _low_precision(device)
    q, k, v = _qkv(2, 41, 53, 2, 2, 32, dtype, device)
    if mask_shape == "transposed":  # non-contiguous view: stride(-1) != 1
        mask = (torch.rand(2, 1, 53, 41, device=device) > 0.3).transpose(-1, -2)
    else:  # (.., 1): whole rows masked out for some queries
        mask = torch.rand(mask_shape, device=device) > 0.3
    bias = _rand(1, 2, 41, 53, dtype=dtype, device=device)
    check_attention(kernel, dtype, q, k, v, bias=bias, mask=mask)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_DT_ID.get)
def test_key_padding_mask(kernel, device, dtype):
    _skip_unsupported(device, dtype)
    B, S = 3, 70
    q, k, v = _qkv(B, S, S, 2, 2, 48, dtype, device)
    lengths = torch.tensor([70, 37, 5], device=device)
    kpm = torch.arange(S, device=device)[None, :] < lengths[:, None]
    bias = _rand(B, 1, S, S, dtype=dtype, device=device)
    check_attention(kernel, dtype, q, k, v, bias=bias, key_padding_mask=kpm, return_lse=True)


BAND_CASES = [  # (Sq, Sk, causal, window)
    (40, 70, True, None),
    (70, 40, True, None),
    (64, 64, True, None),
    (130, 130, True, None),
    (64, 64, False, (8, 0)),
    (50, 90, False, (16, 4)),
    (90, 50, False, (5, 20)),
    (64, 64, False, (-1, 3)),
    (64, 64, False, (1, 0)),
    (70, 40, True, (10, -1)),
    (100, 100, True, (70, 5)),  # causal wins over a positive right window
]


@pytest.mark.parametrize("case", BAND_CASES, ids=lambda c: f"Sq{c[0]}_Sk{c[1]}_causal{int(c[2])}_w{c[3]}")
def test_causal_window(kernel, device, case):
    Sq, Sk, causal, window = case
    dtype = _low_precision(device)
    q, k, v = _qkv(2, Sq, Sk, 2, 2, 32, dtype, device)
    bias = _rand(1, 2, Sq, Sk, dtype=dtype, device=device)
    check_attention(kernel, dtype, q, k, v, bias=bias, causal=causal, window=window, return_lse=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=_DT_ID.get)
@pytest.mark.parametrize("hkv", [1, 2])
def test_gqa(kernel, device, dtype, hkv):
    _skip_unsupported(device, dtype)
    q, k, v = _qkv(2, 45, 60, 4, hkv, 40, dtype, device)
    bias = _rand(2, 1, 45, 60, dtype=dtype, device=device)  # broadcast over heads -> dbias sums the group
    check_attention(kernel, dtype, q, k, v, bias=bias, causal=True)


def test_gqa_with_everything(kernel, device):
    dtype = torch.bfloat16
    B, Sq, Sk, H = 2, 50, 66, 4
    q, k, v = _qkv(B, Sq, Sk, H, 2, 32, dtype, device)
    bias = _rand(1, H, 1, Sk, dtype=dtype, device=device)
    mask = torch.rand(B, 1, Sq, Sk, device=device) > 0.2
    kpm = torch.rand(B, Sk, device=device) > 0.1
    check_attention(kernel, dtype, q, k, v, bias=bias, mask=mask, key_padding_mask=kpm, window=(20, 10),
                    return_lse=True)


# --------------------------------------------------------------------------------------------------------------
# fully masked rows: out 0, lse -inf, zero gradients, no NaN anywhere


@pytest.mark.parametrize("how", ["mask", "key_padding", "causal_sq_gt_sk", "window"])
def test_fully_masked_rows(kernel, device, how):
    dtype = _low_precision(device)
    B, Sq, Sk, H = 2, 40, 30, 2
    q, k, v = _qkv(B, Sq, Sk, H, H, 32, dtype, device)
    bias = _rand(1, H, Sq, Sk, dtype=dtype, device=device)
    kw = {}
    dead = torch.zeros(B, H, Sq, dtype=torch.bool, device=device)
    if how == "mask":
        mask = torch.rand(B, H, Sq, Sk, device=device) > 0.2
        mask[0, 1, 3] = False
        mask[1, :, 17:20] = False
        dead[0, 1, 3] = True
        dead[1, :, 17:20] = True
        kw["mask"] = mask
    elif how == "key_padding":
        kpm = torch.ones(B, Sk, dtype=torch.bool, device=device)
        kpm[1] = False
        dead[1] = True
        kw["key_padding_mask"] = kpm
    elif how == "causal_sq_gt_sk":
        kw["causal"] = True  # bottom-right aligned: rows i < Sq - Sk see no key
        dead[:, :, : Sq - Sk] = True
    else:
        kw["window"] = (2, 0)  # -2 <= d <= 0: rows i < Sq - Sk again see nothing
        dead[:, :, : Sq - Sk] = True
    out = check_attention(kernel, dtype, q, k, v, bias=bias, return_lse=True, **kw)
    _, lse = kernel.attention(q, k, v, bias=bias, return_lse=True, **kw)
    dead_bshd = dead.transpose(1, 2)  # [B, Sq, H]
    assert (out[dead_bshd] == 0).all()
    assert (lse[dead] == float("-inf")).all()
    assert torch.isfinite(lse[~dead]).all()
    assert (q.grad[dead_bshd] == 0).all()
    assert torch.isfinite(bias.grad).all()


@pytest.mark.parametrize("with_bias", [False, True])
def test_empty_key_set(kernel, device, with_bias):
    """Sk = 0: every row sees no key (out 0, lse -inf, q gets a zero gradient), with or without a term. On Hopper
    the v1 forward runs it (v3 cannot map an empty tensor; the v2 forward that ran it without a term is retired)."""
    dtype = _low_precision(device)
    q, k, v = _qkv(2, 20, 0, 3, 3, 64, dtype, device)
    bias = _rand(1, 3, 20, 0, dtype=dtype, device=device) if with_bias else None
    out, lse = kernel.attention(q, k, v, bias=bias, return_lse=True)
    assert out.shape == q.shape and (out == 0).all() and (lse == float("-inf")).all()
    out.sum().backward()
    assert (q.grad == 0).all()


def test_everything_masked(kernel, device):
    dtype = _low_precision(device)
    q, k, v = _qkv(1, 16, 16, 2, 2, 16, dtype, device)
    bias = _rand(1, 2, 16, 16, dtype=dtype, device=device)
    mask = torch.zeros(16, 16, dtype=torch.bool, device=device)
    out, lse = kernel.attention(q, k, v, bias=bias, mask=mask, return_lse=True)
    assert (out == 0).all() and (lse == float("-inf")).all()
    out.sum().backward()
    for t in (q, k, v, bias):
        assert (t.grad == 0).all()


# --------------------------------------------------------------------------------------------------------------
# Swin window attention: relative-position table gathered in the kernel + shift mask [nW, N, N]


def swin_shift_mask(nw: int, n: int, device) -> torch.Tensor:
    """Additive [nW, N, N] mask, 0 within a region and -100 across regions (window 0 unmasked)."""
    regions = torch.randint(0, 3, (nw, n), device=device)
    regions[0] = 0
    return torch.where(regions[:, :, None] == regions[:, None, :], 0.0, -100.0)


def check_window_attention(kernel, dtype, q, k, v, table, index, mask=None, bias=None):
    inputs = [q, k, v, table, bias]
    out = kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index, mask=mask, bias=bias)
    same_in, ref_in = _leaves_same(inputs), _leaves64(inputs)
    same = kernel.reference.window_attention(*same_in[:3], rel_pos_table=same_in[3], rel_pos_index=index,
                                             mask=mask, bias=same_in[4])
    ref = kernel.reference.window_attention(*ref_in[:3], rel_pos_table=ref_in[3], rel_pos_index=index,
                                            mask=None if mask is None else mask.double(), bias=ref_in[4])
    assert_fa_close("out", out, same, ref.detach(), dtype)
    g = torch.randn(out.shape, device=out.device).to(dtype)
    out.backward(g)
    same.backward(g)
    ref.backward(g.double())
    for name, t, s, r in zip(("dq", "dk", "dv"), inputs[:3], same_in[:3], ref_in[:3]):
        assert_fa_close(name, t.grad, s.grad, r.grad, dtype)
    assert table.grad.shape == table.shape and table.grad.dtype == table.dtype
    assert_rel_l2("dtable", table.grad, ref_in[3].grad)
    if bias is not None:
        assert_rel_l2("dbias", bias.grad, ref_in[4].grad)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_DT_ID.get)
@pytest.mark.parametrize("shifted", [False, True], ids=["plain", "shifted"])
def test_window_attention(kernel, device, dtype, shifted):
    _skip_unsupported(device, dtype)
    ws, nw, B, H, D = 7, 4, 2, 3, 32
    N = ws * ws
    q, k, v = _qkv(B * nw, N, N, H, H, D, dtype, device)
    table = _rand((2 * ws - 1) ** 2, H, dtype=torch.float32, device=device, scale=0.5)
    index = swin_relative_index(ws, device)
    mask = swin_shift_mask(nw, N, device) if shifted else None
    check_window_attention(kernel, dtype, q, k, v, table, index, mask=mask)


def test_window_attention_extra_bias(kernel, device):
    dtype = _low_precision(device)
    ws, nw, B, H = 7, 2, 2, 2
    N = ws * ws
    q, k, v = _qkv(B * nw, N, N, H, H, 40, dtype, device)
    table = _rand((2 * ws - 1) ** 2, H, dtype=torch.float32, device=device)
    bias = _rand(H, N, N, dtype=dtype, device=device)
    check_window_attention(kernel, dtype, q, k, v, table, swin_relative_index(ws, device),
                           mask=swin_shift_mask(nw, N, device), bias=bias)


def test_window_attention_144(kernel, device):
    """12x12 windows (N = 144), one window per image."""
    dtype = torch.bfloat16
    ws, H = 12, 2
    N = ws * ws
    q, k, v = _qkv(2, N, N, H, H, 32, dtype, device)
    table = _rand((2 * ws - 1) ** 2, H, dtype=torch.float32, device=device)
    check_window_attention(kernel, dtype, q, k, v, table, swin_relative_index(ws, device))


@pytest.mark.parametrize("ws", [4, 14], ids=["N17", "N197"])
def test_window_attention_beit_table(kernel, device, ws):
    """BEiT's table: (2W-1)^2 + 3 rows (class-token entries), index [N, N] with N = W^2 + 1 (odd; 197 for BEiT-B/16
    at 224 px), one 'window' per image; the flat [N * N] index (timm's RelPosBias) gives the same result."""
    dtype = _low_precision(device)
    H, N = 2, ws * ws + 1
    q, k, v = _qkv(2, N, N, H, H, 32, dtype, device)
    table = _rand((2 * ws - 1) ** 2 + 3, H, dtype=torch.float32, device=device, scale=0.5)
    index = beit_relative_index(ws, device)
    check_window_attention(kernel, dtype, q, k, v, table, index)
    flat = index.flatten()
    with torch.no_grad():
        torch.testing.assert_close(kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=flat),
                                   kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index),
                                   rtol=0, atol=0)


# --------------------------------------------------------------------------------------------------------------
# determinism


def test_deterministic(kernel, device):
    dtype = _low_precision(device)
    B, S, H = 4, 70, 4
    q0, k0, v0 = (torch.randn(B, S, H, 32, device=device).to(dtype) for _ in range(3))
    bias0 = torch.randn(1, 1, S, S, device=device).to(dtype)  # broadcast over batch and heads: reduced dbias
    table0 = torch.randn(2 * S - 1, H, device=device)
    index = (torch.arange(S)[:, None] - torch.arange(S)[None, :] + S - 1).to(device)

    def run():
        q, k, v, bias = (t.clone().requires_grad_() for t in (q0, k0, v0, bias0))
        out = kernel.attention(q, k, v, bias=bias, causal=True, deterministic=True)
        out.backward(torch.ones_like(out))
        table = table0.clone().requires_grad_()
        out2 = kernel.window_attention(q.detach(), k.detach(), v.detach(), rel_pos_table=table, rel_pos_index=index)
        out2.backward(torch.ones_like(out2))
        return [out, q.grad, k.grad, v.grad, bias.grad, out2, table.grad]

    first, second = run(), run()
    for a, b in zip(first, second):
        assert torch.equal(a, b)


# --------------------------------------------------------------------------------------------------------------
# lse


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=_DT_ID.get)
def test_return_lse(kernel, device, dtype):
    _skip_unsupported(device, dtype)
    q, k, v = _qkv(2, 50, 60, 2, 2, 64, dtype, device)
    bias = _rand(2, 2, 50, 60, dtype=dtype, device=device)
    check_attention(kernel, dtype, q, k, v, bias=bias, return_lse=True)


def test_scale(kernel, device):
    dtype = _low_precision(device)
    q, k, v = _qkv(1, 30, 30, 2, 2, 32, dtype, device)
    check_attention(kernel, dtype, q, k, v, scale=0.37)


# --------------------------------------------------------------------------------------------------------------
# torch.library / torch.compile integration


def test_opcheck(kernel, device):
    dtype = _low_precision(device)
    q, k, v = _qkv(2, 24, 24, 2, 2, 16, dtype, device)
    bias = _rand(1, 2, 24, 24, dtype=dtype, device=device)
    mask = torch.rand(24, 24, device=device)[None, None] > 0.2
    args = (q, k, v, bias, mask, None, None, None, 0.25, False, -1, -1, False)
    torch.library.opcheck(kernel._ops.ops.fwd, args)
    table = _rand(47, 2, dtype=torch.float32, device=device)
    index = torch.randint(0, 47, (24, 24), device=device)
    args = (q, k, v, None, None, None, table, index, 0.25, True, -1, -1, True)
    torch.library.opcheck(kernel._ops.ops.fwd, args)


def test_torch_compile_fullgraph(kernel, device):
    dtype = _low_precision(device)
    q, k, v = _qkv(2, 40, 40, 2, 2, 32, dtype, device)
    bias = _rand(1, 2, 40, 40, dtype=dtype, device=device)

    def f(q, k, v, bias):
        return kernel.attention(q, k, v, bias=bias * 2.0, causal=True).float().square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    leaves_c = _leaves_same([q, k, v, bias])
    loss_c = compiled(*leaves_c)
    loss_c.backward()
    loss_e = f(q, k, v, bias)
    loss_e.backward()
    torch.testing.assert_close(loss_c, loss_e)
    for a, b in zip(leaves_c, (q, k, v, bias)):
        torch.testing.assert_close(a.grad, b.grad)


# --------------------------------------------------------------------------------------------------------------
# bad inputs: a clear ValueError/RuntimeError, never a crash

ERRORS = (ValueError, RuntimeError)


def _bad_cases(device):
    dtype = _low_precision(device)
    other = torch.float16 if dtype != torch.float16 else torch.bfloat16

    def t(*shape, dt=dtype, dev=device):
        return torch.randn(*shape, device=dev).to(dt)

    q, k, v = t(2, 16, 4, 32), t(2, 16, 4, 32), t(2, 16, 4, 32)
    return {
        "k_on_meta": (lambda a: a.attention(q, torch.empty(2, 16, 4, 32, device="meta", dtype=dtype), v), "device"),
        "dtype_mismatch": (lambda a: a.attention(q, k.to(other), v), "dtype"),
        "int_dtype": (lambda a: a.attention(q.long(), k.long(), v.long()), "dtype"),
        "head_dim_12": (lambda a: a.attention(t(2, 16, 4, 12), t(2, 16, 4, 12), t(2, 16, 4, 12)), "head dim"),
        "head_dim_264": (lambda a: a.attention(t(2, 16, 4, 264), t(2, 16, 4, 264), t(2, 16, 4, 264)), "head dim"),
        "three_dim_q": (lambda a: a.attention(q[0], k[0], v[0]), "4-D"),
        "bias_not_broadcastable": (lambda a: a.attention(q, k, v, bias=t(5, 16, 16)), "broadcast"),
        "bias_5d": (lambda a: a.attention(q, k, v, bias=t(1, 1, 4, 16, 16)), "at most 4"),
        "float_mask": (lambda a: a.attention(q, k, v, mask=t(16, 16)), "bool"),
        "mask_not_broadcastable": (
            lambda a: a.attention(q, k, v, mask=torch.ones(3, 16, 16, dtype=torch.bool, device=device)), "broadcast"),
        "batch_mismatch": (lambda a: a.attention(q, t(3, 16, 4, 32), t(3, 16, 4, 32)), "batch"),
        "kv_len_mismatch": (lambda a: a.attention(q, k, t(2, 15, 4, 32)), "sequence"),
        "heads_not_multiple": (lambda a: a.attention(q, t(2, 16, 3, 32), t(2, 16, 3, 32)), "multiple"),
        "kpm_wrong_shape": (
            lambda a: a.attention(q, k, v, key_padding_mask=torch.ones(2, 15, dtype=torch.bool, device=device)),
            "key_padding_mask"),
        "kpm_float": (lambda a: a.attention(q, k, v, key_padding_mask=t(2, 16)), "key_padding_mask"),
        "bad_window": (lambda a: a.attention(q, k, v, window=(-3, 2)), "window"),
        "window_attention_q_ne_k": (lambda a: a.window_attention(q, t(2, 15, 4, 32), t(2, 15, 4, 32)), "equal"),
        "table_without_index": (
            lambda a: a.window_attention(q, k, v, rel_pos_table=t(31, 4, dt=torch.float32)), "together"),
        "index_wrong_shape": (
            lambda a: a.window_attention(q, k, v, rel_pos_table=t(31, 4, dt=torch.float32),
                                         rel_pos_index=torch.zeros(16, 15, dtype=torch.long, device=device)),
            "rel_pos_index"),
        "flat_index_wrong_length": (
            lambda a: a.window_attention(q, k, v, rel_pos_table=t(31, 4, dt=torch.float32),
                                         rel_pos_index=torch.zeros(16 * 15, dtype=torch.long, device=device)),
            "rel_pos_index"),
        "shift_mask_wrong_count": (lambda a: a.window_attention(q, k, v, mask=t(3, 16, 16)), "divide"),
    }


_BAD_NAMES = list(_bad_cases("cpu").keys())


@pytest.mark.parametrize("name", _BAD_NAMES)
def test_bad_inputs_raise(kernel, device, name):
    fn, words = _bad_cases(device)[name]
    with pytest.raises(ERRORS) as info:
        fn(kernel)
    assert words.lower() in str(info.value).lower(), f"unclear message: {info.value}"


def test_bad_inputs_at_op_level(kernel, device):
    """The op itself (bypassing the Python checks) rejects bad arguments with RuntimeError, not a crash."""
    ops = kernel._ops.ops
    dtype = _low_precision(device)
    q = torch.randn(2, 16, 4, 32, device=device).to(dtype)
    none = (None, None, None, None, None)
    cases = [
        ((q, q, q[:, :, :, :16].contiguous()) + none, "head dims differ"),
        ((q[..., :12], q[..., :12], q[..., :12]) + none, "head dim"),
        ((q, q, q, torch.randn(16, 16, device=device).to(dtype), None, None, None, None), "4-D"),
        ((q, q, q, torch.randn(1, 3, 16, 16, device=device).to(dtype), None, None, None, None), "dim 1"),
        ((q, q, q, None, torch.ones(1, 1, 16, 16, device=device), None, None, None), "bool"),
        ((q, q, q, None, None, torch.ones(2, 15, dtype=torch.bool, device=device), None, None), "key_padding_mask"),
        ((q, q, q, None, None, None, torch.randn(9, 4, device=device), None), "together"),
        ((q, q.transpose(-1, -2).contiguous().transpose(-1, -2), q) + none, "contiguous last dim"),
    ]
    for args, words in cases:
        with pytest.raises(RuntimeError, match=words):
            ops.fwd(*args, 0.1, False, -1, -1, False)


# --------------------------------------------------------------------------------------------------------------
# CPU only: every code path of the CPU kernel. The best one for the machine runs above (AVX512-BF16 tile
# products for bf16 where the CPU has them, AVX2/FMA otherwise); WINATTN_CPU_ISA caps the choice.


@pytest.mark.parametrize("isa", ["avx2", "generic"])
def test_cpu_isa_paths(kernel, device, monkeypatch, isa):
    if device != "cpu":
        pytest.skip("CPU code-path selection")
    monkeypatch.setenv("WINATTN_CPU_ISA", isa)
    q, k, v = _qkv(2, 45, 70, 4, 2, 40, torch.bfloat16, device)
    bias = _rand(1, 4, 45, 70, dtype=torch.bfloat16, device=device)
    kpm = torch.rand(2, 70) > 0.2
    check_attention(kernel, torch.bfloat16, q, k, v, bias=bias, key_padding_mask=kpm, causal=True, return_lse=True)
    q16, k16, v16 = _qkv(2, 33, 33, 2, 2, 72, torch.float16, device)
    check_attention(kernel, torch.float16, q16, k16, v16, bias=_rand(2, 1, 33, 33, dtype=torch.float16, device=device),
                    window=(4, 4))
    q32, k32, v32 = _qkv(1, 33, 33, 2, 2, 8, torch.float32, device)
    check_attention(kernel, torch.float32, q32, k32, v32, bias=_rand(33, 33, dtype=torch.float32, device=device),
                    window=(4, 4))
    ws, nw = 7, 2
    qw, kw, vw = _qkv(2 * nw, ws * ws, ws * ws, 2, 2, 32, torch.bfloat16, device)
    table = _rand((2 * ws - 1) ** 2, 2, dtype=torch.float32, device=device)
    check_window_attention(kernel, torch.bfloat16, qw, kw, vw, table, swin_relative_index(ws, device),
                           mask=swin_shift_mask(nw, ws * ws, device))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradient_through_lse(kernel, device, dtype):
    """Ring attention merges partial results through lse, so lse must be differentiable: d lse_i / d s_ij = P_ij.
    A fully masked row (lse = -inf) still gets zero gradients."""
    _skip_unsupported(device, dtype)
    q, k, v = _qkv(2, 40, 48, 4, 2, 32, dtype, device)
    bias = _rand(1, 4, 40, 48, dtype=dtype, device=device)
    kpm = torch.ones(2, 48, dtype=torch.bool, device=device)
    kpm[1] = False  # batch 1: every row fully masked
    inputs = [q, k, v, bias]
    g = torch.randn(2, 40, 4, 32, device=device).to(dtype)
    gl = torch.randn(2, 4, 40, device=device)

    def loss(mod, tensors, cast):
        out, lse = mod.attention(*tensors[:3], bias=tensors[3], key_padding_mask=kpm, return_lse=True)
        live = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
        return (out * cast(g)).sum() + (live * gl.to(live.dtype)).sum()

    loss(kernel, inputs, lambda t: t).backward()
    same_in, ref_in = _leaves_same(inputs), _leaves64(inputs)
    loss(kernel.reference, same_in, lambda t: t).backward()
    loss(kernel.reference, ref_in, lambda t: t.double()).backward()
    for name, t, s, r in zip(("dq", "dk", "dv"), inputs[:3], same_in[:3], ref_in[:3]):
        assert_fa_close(name, t.grad, s.grad, r.grad, dtype)
        assert (t.grad[1] == 0).all(), f"{name}: fully masked batch must get zero gradient"
    assert_rel_l2("dbias", bias.grad, ref_in[3].grad)
