"""The integrations use only the kernel's public API (`__all__`): a kernel fetched at run time may be older or newer
than the installed winattn, and only `__all__` is covered by its API version."""

import types

import pytest
import torch


def _public_only(module):
    """The module as seen through its `__all__` alone (no `_ops`, `_args`, `interface`, `IS_REFERENCE`)."""
    return types.SimpleNamespace(**{name: getattr(module, name) for name in module.__all__})


@pytest.fixture(params=["compiled", "reference"])
def public_kernel(request):
    if request.param == "compiled":
        return _public_only(request.getfixturevalue("kernel"))
    from winattn.reference_kernel import load_reference

    return _public_only(load_reference())


def test_context_parallel_backward_needs_only_the_public_api(public_kernel):
    from winattn.integrations import kernel_device_type
    from winattn.integrations.diffusers import attention_backward

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 16, 4, 32, generator=g, requires_grad=True) for _ in range(3))
    bias = torch.randn(4, 16, 16, generator=g)
    out, lse = public_kernel.attention(q, k, v, bias=bias, causal=True, return_lse=True)
    grad = torch.randn_like(out)
    expected = torch.autograd.grad(out, (q, k, v), grad)
    got = attention_backward(public_kernel, grad, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(),
                             bias=bias, causal=True)
    for e, g_ in zip(expected, got):
        torch.testing.assert_close(g_, e, rtol=1e-4, atol=1e-4)
    assert kernel_device_type(public_kernel) in ("cpu", None)
