"""The public low-level API (`attention_forward` / `attention_backward`) on the CUDA build (marked `gpu`): the same
ops as the autograd path, so with deterministic=True the results are bit-identical to it (dbias: float32 here,
rounded to the bias dtype by autograd)."""

import pytest
import torch

from ._helpers import rand

pytestmark = pytest.mark.gpu


def test_build_device_is_cuda(kernel):
    assert kernel.BUILD_DEVICE == "cuda" and kernel.API_VERSION == 1


@pytest.mark.parametrize("bias_shape", [(1, 4, 200, 300), (300,)], ids=lambda s: "x".join(map(str, s)))
def test_forward_and_backward_match_autograd_bitwise(kernel, bias_shape):
    q, k, v = (rand(2, n, h, 64, dtype=torch.bfloat16, grad=True) for n, h in ((200, 4), (300, 2), (300, 2)))
    bias = rand(*bias_shape, dtype=torch.bfloat16, grad=True)
    kw = dict(bias=bias, causal=True, deterministic=True)
    out, lse = kernel.attention(q, k, v, return_lse=True, **kw)
    grad = torch.randn_like(out)
    expected = torch.autograd.grad(out, (q, k, v, bias), grad)

    f_out, f_lse = kernel.attention_forward(q, k, v, bias=bias, causal=True)
    assert torch.equal(f_out, out.detach()) and torch.equal(f_lse, lse.detach())
    got = kernel.attention_backward(grad, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(),
                                    bias=bias.detach(), causal=True, deterministic=True, bias_requires_grad=True)
    for name, e, g in zip(("dq", "dk", "dv"), expected, got):
        assert g.shape == e.shape and torch.equal(g, e), name
    # dbias comes back float32 (documented); autograd rounds it to the bias's dtype
    assert got[3].dtype == torch.float32 and torch.equal(got[3].to(bias.dtype), expected[3])
