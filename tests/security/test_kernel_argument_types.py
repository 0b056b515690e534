"""Issue 27: the kernel API's flag and scale types, and the reference on a `+inf` score (CPU kernel and reference).

- `causal`, `return_lse`, `deterministic` (and the low-level `bias_requires_grad`) took any truthy value:
  `causal="no"` was causal. Now anything but a bool is a TypeError, as SDPA's `is_causal`.
- `scale` accepted strings (`float("0.5")`). Now it must be a real number or a one-element real tensor (TypeError
  otherwise); non-finite values stay a ValueError.
- A visible `+inf` score (bias or table): the kernels give NaN (as SDPA); the reference gave +-inf out and +inf lse.
  Now the reference gives NaN out and lse in that row, as documented (`attention`'s docstring, the README's
  security section).
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _qkv(S=16, H=2, D=32):
    return tuple(torch.randn(1, S, H, D) for _ in range(3))


NOT_BOOLS = ["no", "", 1, 0, 1.0, None, np.bool_(True), torch.tensor(True)]


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("flag", ["causal", "return_lse", "deterministic"])
@pytest.mark.parametrize("value", NOT_BOOLS, ids=repr)
def test_flags_must_be_bools(kernel, impl, flag, value):
    mod = kernel if impl == "kernel" else kernel.reference
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=f"{flag} must be a bool"):
        mod.attention(q, k, v, **{flag: value})


def test_flags_of_the_other_entry_points_must_be_bools(kernel):
    q, k, v = _qkv()
    for mod in (kernel, kernel.reference):
        with pytest.raises(TypeError, match="causal must be a bool"):
            mod.attention_forward(q, k, v, causal="no")
        with pytest.raises(TypeError, match="deterministic must be a bool"):
            mod.attention_forward(q, k, v, deterministic=1)
        out, lse = mod.attention_forward(q, k, v, bias=torch.zeros(1, 1, 16, 16))
        with pytest.raises(TypeError, match="bias_requires_grad must be a bool"):
            mod.attention_backward(torch.ones_like(out), q, k, v, out, lse, bias=torch.zeros(1, 1, 16, 16),
                                   bias_requires_grad="yes")


def test_sdpa_refuses_the_same_flags():
    """The rule followed: SDPA's is_causal takes only a bool."""
    q = torch.randn(1, 2, 16, 32)
    for value in NOT_BOOLS:
        with pytest.raises(TypeError):
            F.scaled_dot_product_attention(q, q, q, is_causal=value)


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("scale", ["0.5", b"0.5", True, 1 + 2j, [0.5], torch.tensor([0.5, 1.0]), torch.tensor(True)],
                         ids=repr)
def test_scale_must_be_a_real_number(kernel, impl, scale):
    mod = kernel if impl == "kernel" else kernel.reference
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="scale must be a real number"):
        mod.attention(q, k, v, scale=scale)
    with pytest.raises(TypeError, match="scale must be a real number"):
        mod.window_attention(q, k, v, scale=scale)


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf"), 1e39, -3.5e38, torch.tensor(1e300,
                                   dtype=torch.float64)], ids=repr)
def test_scale_must_be_finite_in_float32(kernel, impl, scale):
    """The kernels compute in float32: a scale that is finite as a double but past float32's range (1e39) became inf
    inside the op and every output NaN, silently. Refused like a NaN or infinite scale."""
    mod = kernel if impl == "kernel" else kernel.reference
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="scale must be finite in float32"):
        mod.attention(q, k, v, scale=scale)
    with pytest.raises(ValueError, match="scale must be finite in float32"):
        mod.window_attention(q, k, v, scale=scale)
    mod.attention(q, k, v, scale=float(torch.finfo(torch.float32).max))  # the largest float32 is accepted


@pytest.mark.parametrize("scale", [0.5, 1, np.float32(0.5), np.int64(1), torch.tensor(0.5), torch.tensor(1)],
                         ids=repr)
def test_real_scales_are_accepted(kernel, scale):
    q, k, v = _qkv()
    torch.testing.assert_close(kernel.attention(q, k, v, scale=scale),
                               kernel.reference.attention(q, k, v, scale=float(scale)), atol=1e-4, rtol=1e-4)


def _sdpa(q, k, v, bias):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          attn_mask=bias).transpose(1, 2)


def test_reference_gives_nan_on_a_visible_plus_inf_score_like_the_kernel_and_sdpa(kernel):
    q, k, v = _qkv()
    bias = torch.zeros(1, 1, 16, 16)
    bias[0, 0, 3, 5] = float("inf")
    out, lse = kernel.attention(q, k, v, bias=bias, return_lse=True)
    ref_out, ref_lse = kernel.reference.attention(q, k, v, bias=bias, return_lse=True)
    expected = _sdpa(q, k, v, bias)
    for got in (out, ref_out):
        assert torch.equal(torch.isnan(got), torch.isnan(expected))
        assert torch.isnan(got[0, 3]).all() and not torch.isinf(got).any()
        torch.testing.assert_close(got[0, :3], expected[0, :3], atol=1e-4, rtol=1e-4)
    assert torch.equal(torch.isnan(ref_lse), torch.isnan(lse)) and torch.isnan(ref_lse[0, :, 3]).all()
    assert not torch.isinf(ref_lse).any()


def test_a_hidden_plus_inf_score_stays_hidden(kernel):
    q, k, v = _qkv()
    bias = torch.zeros(1, 1, 16, 16)
    bias[0, 0, 3, 9] = float("inf")  # key 9 is after query 3: hidden by causal
    out = kernel.attention(q, k, v, bias=bias, causal=True)
    ref = kernel.reference.attention(q, k, v, bias=bias, causal=True)
    assert torch.isfinite(out).all() and torch.isfinite(ref).all()
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_reference_gradients_follow_the_kernel_on_a_plus_inf_score(kernel):
    q, k, v = _qkv()
    bias = torch.zeros(1, 1, 16, 16)
    bias[0, 0, 3, 5] = float("inf")
    out, lse = kernel.attention_forward(q, k, v, bias=bias)
    g = torch.ones_like(out)
    got = kernel.attention_backward(g, q, k, v, out, lse, bias=bias, bias_requires_grad=True)
    ref = kernel.reference.attention_backward(g, q, k, v, out, lse, bias=bias, bias_requires_grad=True)
    assert torch.isnan(got[0][0, 3]).all() and torch.isnan(ref[0][0, 3]).all()  # dq of the row: NaN in both
