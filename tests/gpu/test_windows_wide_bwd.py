"""The Hopper wide-window backward (kernel-src/cuda/sm90/bwd_windows_wide_sm90.h): Swin windows of 65 .. 144 tokens
with the relative-position table's gradient, checked against the float64 reference by the FlashAttention rule and
dtable / dbias by relative L2 (marked `gpu`). Shapes walk the kernel's edges: both instances (<= 128 and <= 144
tokens), padding key rows inside a warp and whole padding warps, windows per CTA forced to odd counts, a learnable
shift mask, fully hidden rows, fp16 and bf16, and bitwise determinism of dtable.
"""

import os

import pytest
import torch

from ._helpers import rand, run_case
from .test_cuda_kernels import swin_inputs

pytestmark = pytest.mark.gpu

BF16, FP16 = torch.bfloat16, torch.float16


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    yield


def _hopper():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the wide-window backward is the Hopper path")


# win 9 / 10 / 11: the two-warpgroup instance (N = 81, 100, 121: padding rows in the last key warp, and at 81 / 100
# whole padding warps); 12: the three-warpgroup one (N = 144, 16 real keys in its last warpgroup)
@pytest.mark.parametrize("win", [9, 10, 11, 12])
@pytest.mark.parametrize("dtype", [BF16, FP16])
@pytest.mark.parametrize("shift", [False, True])
def test_swin_wide(kernel, win, dtype, shift):
    inp = swin_inputs(3, win, 4, 3, 32, dtype, shift=shift)
    run_case(kernel, inp, {}, swin=True)


@pytest.mark.parametrize("G", ["1", "3", "7"])
@pytest.mark.parametrize("win", [10, 12])
def test_windows_per_cta_forced(kernel, G, win, monkeypatch):
    # G windows per CTA: the last CTA of a period column takes fewer; the dS sums must still cover each window once
    monkeypatch.setenv("WINATTN_BWD_G", G)
    inp = swin_inputs(5, win, 4, 2, 32, BF16)
    inp["bias"] = rand(1, 2, win * win, win * win, dtype=FP16, grad=True)  # a learnable bias: dbias from the partials
    run_case(kernel, inp, {}, swin=True)


def test_learnable_shift_mask(kernel):
    # an [nW, N, N] additive mask with a gradient: dbias grouped by window index (b % nW) at N = 144
    inp = swin_inputs(3, 12, 4, 2, 32, BF16, shift=False)
    inp["swin_mask"] = (torch.randn(4, 144, 144, device="cuda") * 0.5).requires_grad_(True)
    run_case(kernel, inp, {}, swin=True)


def test_hidden_rows(kernel):
    # -inf in the shift mask: a row with every key hidden (P = 0, zero gradients) and columns hidden in all rows
    inp = swin_inputs(2, 12, 4, 2, 32, BF16)
    m = inp["swin_mask"]
    m[1, 7] = float("-inf")
    m[2, :, 100:130] = float("-inf")
    run_case(kernel, inp, {}, swin=True)


@pytest.mark.parametrize("Sq,Sk", [(144, 100), (100, 144), (70, 128)])
def test_cross_lengths(kernel, Sq, Sk):
    # queries and keys of different lengths with a learnable fp16 bias broadcast over the windows
    B, H = 12, 2
    inp = dict(q=rand(B, Sq, H, 32, dtype=BF16, grad=True), k=rand(B, Sk, H, 32, dtype=BF16, grad=True),
               v=rand(B, Sk, H, 32, dtype=BF16, grad=True), bias=rand(1, H, Sq, Sk, dtype=FP16, grad=True))
    run_case(kernel, inp, {})


def test_dtable_bitwise_deterministic(kernel):
    inp = swin_inputs(8, 12, 4, 3, 32, BF16)
    dout = torch.randn(32, 144, 3, 32, device="cuda", dtype=BF16)
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


@pytest.mark.parametrize("win", [10, 12])
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


@pytest.mark.parametrize("win,D", [(8, 32), (14, 32), (12, 48), (16, 32)])
def test_swin_around_the_wide_kernel(kernel, win, D):
    # the neighbours of its range, through the other backward kernels: N = 64 (the 64-token window kernel), 196 and
    # 256 (v1's window mode) and head dim 48 (kernel head dim 64: v1)
    inp = swin_inputs(2, win, 4, 2, D, BF16)
    run_case(kernel, inp, {}, swin=True)
