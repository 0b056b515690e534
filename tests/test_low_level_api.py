"""The kernel's public low-level API (`attention_forward` / `attention_backward`, `BUILD_DEVICE`, `API_VERSION`) on the
compiled build, against its own autograd path and against the pure-PyTorch twin in `reference`."""

import pytest
import torch

pytestmark = pytest.mark.kernels_ci


@pytest.fixture(autouse=True)
def _cpu_build(kernel):
    """These cases are fp32 on the CPU build; the CUDA build's low-level API is checked in tests/gpu/test_low_level_api_cuda.py."""
    if kernel.BUILD_DEVICE != "cpu":
        pytest.skip("fp32 CPU cases (the CUDA build takes fp16/bf16: tests/gpu/test_low_level_api_cuda.py)")


def _qkv(B=2, Sq=24, Sk=40, H=4, Hkv=2, D=32, requires_grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Sq, H, D, generator=g)
    k = torch.randn(B, Sk, Hkv, D, generator=g)
    v = torch.randn(B, Sk, Hkv, D, generator=g)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def test_api_names_are_public_and_documented(kernel):
    for name in ("attention", "window_attention", "layers", "attention_forward", "attention_backward",
                 "BUILD_DEVICE", "API_VERSION", "reference"):
        assert name in kernel.__all__ and hasattr(kernel, name), name
    assert kernel.BUILD_DEVICE == "cpu" and kernel.API_VERSION == 1
    assert kernel.reference.BUILD_DEVICE is None
    for fn in (kernel.attention_forward, kernel.attention_backward):
        assert "Shapes:" in fn.__doc__


def test_forward_is_attention_without_autograd(kernel):
    q, k, v = _qkv(requires_grad=True)
    out, lse = kernel.attention_forward(q, k, v, causal=True)
    assert not out.requires_grad and not lse.requires_grad
    ref_out, ref_lse = kernel.attention(q, k, v, causal=True, return_lse=True)
    torch.testing.assert_close(out, ref_out.detach(), rtol=0, atol=0)
    torch.testing.assert_close(lse, ref_lse.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("bias_shape", [(4, 24, 40), (2, 1, 24, 40), (40,)], ids=lambda s: "x".join(map(str, s)))
def test_backward_matches_autograd_and_the_reference_twin(kernel, bias_shape):
    q, k, v = _qkv(requires_grad=True)
    bias = torch.randn(*bias_shape, generator=torch.Generator().manual_seed(1)).requires_grad_(True)
    kw = dict(bias=bias, window=(8, 4))
    out, lse = kernel.attention(q, k, v, return_lse=True, **kw)
    grad = torch.randn_like(out)
    expected = torch.autograd.grad(out, (q, k, v, bias), grad)

    args = (grad, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach())
    got = kernel.attention_backward(*args, bias_requires_grad=True, **dict(kw, bias=bias.detach()))
    twin = kernel.reference.attention_backward(*args, bias_requires_grad=True, **dict(kw, bias=bias.detach()))
    for name, e, g, t in zip(("dq", "dk", "dv", "dbias"), expected, got, twin):
        assert g.shape == e.shape == t.shape, name
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4, msg=name)
        torch.testing.assert_close(t, e, rtol=1e-4, atol=1e-4, msg=name)
    assert kernel.attention_backward(*args, **dict(kw, bias=bias.detach()))[3] is None  # dbias only when asked


def test_backward_with_lse_gradient_matches_the_twin(kernel):
    q, k, v = _qkv()
    mask = torch.rand(24, 40, generator=torch.Generator().manual_seed(2)) > 0.3
    out, lse = kernel.attention_forward(q, k, v, mask=mask)
    grad, grad_lse = torch.randn_like(out), torch.randn_like(lse)
    got = kernel.attention_backward(grad, q, k, v, out, lse, mask=mask, grad_lse=grad_lse)
    twin = kernel.reference.attention_backward(grad, q, k, v, out, lse, mask=mask, grad_lse=grad_lse)
    for g, t in zip(got[:3], twin[:3]):
        torch.testing.assert_close(g, t, rtol=1e-4, atol=1e-4)


def test_backward_checks_its_arguments_like_the_forward(kernel):
    q, k, v = _qkv()
    out, lse = kernel.attention_forward(q, k, v)
    with pytest.raises(ValueError, match="head dim must be a multiple of 8"):
        kernel.attention_backward(out[..., :4], q[..., :4], k[..., :4], v[..., :4], out[..., :4], lse)
