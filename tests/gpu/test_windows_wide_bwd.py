"""The Hopper wide-window backward (kernel-src/cuda/sm90/bwd_windows_wide_sm90.h): Swin windows of 65 .. 256 tokens
with the relative-position table's gradient, checked against the float64 reference by the FlashAttention rule and
dtable / dbias by relative L2 (marked `gpu`). Shapes walk the kernel's edges: the three instances (<= 128, <= 144
and the split one, four CTAs per window, <= 256 tokens), padding key rows inside a warp and whole padding warps,
windows per CTA forced to odd counts, fp16 and bf16, bitwise determinism of dtable, and a bf16 bias recast to
fp16 for them. (A learnable shift mask and fully hidden rows at N = 144 are in
test_cuda_kernels.py, parametrized over W7 and W12.)
"""

import pytest
import torch

from ._helpers import rand, run_case
from .test_cuda_kernels import swin_inputs

pytestmark = pytest.mark.gpu

BF16, FP16 = torch.bfloat16, torch.float16


def _hopper():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the wide-window backward is the Hopper path")


# win 9 / 10 / 11: the two-warpgroup instance (N = 81, 100, 121: padding rows in the last key warp, and at 81 / 100
# whole padding warps); 12: the three-warpgroup one (N = 144, 16 real keys in its last warpgroup); 13 / 14 / 16: the
# split one (N = 169, 196, 256: second halves of 41, 68 and 128 tokens)
@pytest.mark.parametrize("win", [9, 10, 11, 12, 13, 14, 16])
@pytest.mark.parametrize("dtype", [BF16, FP16])
@pytest.mark.parametrize("shift", [False, True])
def test_swin_wide(kernel, win, dtype, shift):
    inp = swin_inputs(3, win, 4, 3, 32, dtype, shift=shift)
    run_case(kernel, inp, {}, swin=True)


@pytest.mark.parametrize("G", ["1", "3", "7"])
@pytest.mark.parametrize("win", [10, 12, 14])
def test_windows_per_cta_forced(kernel, G, win, monkeypatch):
    # G windows per CTA: the last CTA of a period column takes fewer; the dS sums must still cover each window once
    monkeypatch.setenv("WINATTN_BWD_G", G)
    inp = swin_inputs(5, win, 4, 2, 32, BF16)
    inp["bias"] = rand(1, 2, win * win, win * win, dtype=FP16, grad=True)  # a learnable bias: dbias from the partials
    run_case(kernel, inp, {}, swin=True)


@pytest.mark.parametrize("Sq,Sk", [(144, 100), (100, 144), (70, 128), (256, 150), (100, 200), (200, 256)])
def test_cross_lengths(kernel, Sq, Sk):
    # queries and keys of different lengths with a learnable fp16 bias broadcast over the windows
    B, H = 12, 2
    inp = dict(q=rand(B, Sq, H, 32, dtype=BF16, grad=True), k=rand(B, Sk, H, 32, dtype=BF16, grad=True),
               v=rand(B, Sk, H, 32, dtype=BF16, grad=True), bias=rand(1, H, Sq, Sk, dtype=FP16, grad=True))
    run_case(kernel, inp, {})


@pytest.mark.parametrize("win", [12, 16])
def test_dtable_bitwise_deterministic(kernel, win):
    inp = swin_inputs(8, win, 4, 3, 32, BF16)
    dout = torch.randn(32, win * win, 3, 32, device="cuda", dtype=BF16)
    grads = []
    for _ in range(2):
        t = inp["rel_pos_table"].detach().clone().requires_grad_(True)
        q, k, v = (inp[n].detach().clone().requires_grad_(True) for n in "qkv")
        out = kernel.window_attention(q, k, v, rel_pos_table=t, rel_pos_index=inp["rel_pos_index"],
                                      mask=inp["swin_mask"])
        out.backward(dout)
        grads.append((t.grad, q.grad, k.grad, v.grad))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


@pytest.mark.parametrize("win", [10, 12, 16])
def test_wide_kernel_is_the_default_on_hopper(kernel, win):
    _hopper()
    inp = swin_inputs(2, win, 4, 2, 32, BF16)

    def step():
        out = kernel.window_attention(inp["q"], inp["k"], inp["v"], rel_pos_table=inp["rel_pos_table"],
                                      rel_pos_index=inp["rel_pos_index"], mask=inp["swin_mask"])
        out.sum().backward()

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    assert any("bwd_windows_wide_kernel_sm90" in n for n in names), sorted(names)


@pytest.mark.parametrize("win,D", [(8, 32), (17, 32), (12, 48), (16, 64)])
def test_swin_around_the_wide_kernel(kernel, win, D):
    # the neighbours of its range, through the other backward kernels: N = 64 (the 64-token window kernel), 289 (v1's
    # window mode) and head dims 48 / 64 (kernel head dim 64: v1)
    inp = swin_inputs(2, win, 4, 2, D, BF16)
    run_case(kernel, inp, {}, swin=True)


@pytest.mark.parametrize("win", [12, 16])
def test_bf16_bias_is_recast_for_the_wide_kernels(kernel, win):
    # A learnable bf16 bias broadcast over the windows: the wide kernels keep their term tables in fp16, so it is
    # recast (winattn_cuda.cu recast_bf16_term) instead of sending the call to v3. -inf entries stay -inf and finite
    # values past fp16's range saturate (exp() still 0); the profiler shows which kernels ran on Hopper.
    B, H, N = 8, 2, win * win
    bias = torch.randn(1, H, N, N, device="cuda") * 0.5
    bias[0, 0, 3, ::5] = -float("inf")
    bias[0, 1, 7, ::3] = -1e5
    inp = dict(q=rand(B, N, H, 32, dtype=BF16, grad=True), k=rand(B, N, H, 32, dtype=BF16, grad=True),
               v=rand(B, N, H, 32, dtype=BF16, grad=True), bias=bias.to(BF16).requires_grad_(True))
    run_case(kernel, inp, {})
    if torch.cuda.get_device_capability()[0] != 9:
        return
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        kernel.attention(inp["q"], inp["k"], inp["v"], bias=inp["bias"]).sum().backward()
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    assert any("fwd_windows_kernel_sm90" in n for n in names), sorted(names)
    assert any("bwd_windows_wide_kernel_sm90" in n for n in names), sorted(names)
