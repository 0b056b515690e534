"""The Hopper wide-window backward (kernel-src/cuda/sm90/bwd_windows_wide_sm90.h): Swin windows of 65 .. 256 tokens
with the relative-position table's gradient, checked against the float64 reference by the FlashAttention rule and
dtable / dbias by relative L2 (marked `gpu`). Shapes walk the kernel's edges: the three instances (<= 128, <= 144
and the split one, four CTAs per window, <= 256 tokens), padding key rows inside a warp and whole padding warps,
windows per CTA forced to odd counts, fp16 and bf16, bitwise determinism of dtable, a bf16 bias recast to fp16
for them, and the other score terms on the wide paths: key padding, bool masks shared by the windows (folded into
the term) and per window (read as bits). (A learnable shift mask and fully hidden rows at N = 144 are in
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


def _assert_wide_kernels_ran(kernel, inp, also=()):
    """On Hopper, a forward + backward of `attention` with `inp`'s terms runs the window forward and the wide
    backward (not v3), and the kernels named in `also`; elsewhere nothing to check."""
    if torch.cuda.get_device_capability()[0] != 9:
        return
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        kernel.attention(inp["q"], inp["k"], inp["v"], bias=inp.get("bias"), mask=inp.get("mask"),
                         key_padding_mask=inp.get("key_padding_mask")).sum().backward()
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    assert any("fwd_windows_kernel_sm90" in n for n in names), sorted(names)
    assert any("bwd_windows_wide_kernel_sm90" in n for n in names), sorted(names)
    for name in also:
        assert any(name in n for n in names), sorted(names)


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
    _assert_wide_kernels_ran(kernel, inp)


def _window_inputs(B, N, H, bias_dtype):
    bias = (torch.randn(1, H, N, N, device="cuda") * 0.5).to(bias_dtype).requires_grad_(True)
    return dict(q=rand(B, N, H, 32, dtype=BF16, grad=True), k=rand(B, N, H, 32, dtype=BF16, grad=True),
                v=rand(B, N, H, 32, dtype=BF16, grad=True), bias=bias)


# N = 64 (the 64-key tiles: apply_terms), 100 / 121 / 144 (the wide tiles' per-window key-padding vote in the
# forward, by words and, at 121 keys a row, by bytes; the two-flag rows of the wide backward), 196 / 256 (the split
# backward: padding in either key half)
@pytest.mark.parametrize("N", [64, 100, 121, 144, 196, 256])
@pytest.mark.parametrize("bias_dtype", [BF16, FP16])
def test_key_padding_on_window_calls(kernel, N, bias_dtype):
    B, H = 9, 2
    inp = _window_inputs(B, N, H, bias_dtype)
    kpm = torch.rand(B, N, device="cuda") > 0.3
    kpm[0] = True                 # a window without padding (the vote skips it)
    kpm[1] = False                # a window of padding only: every row hidden (0 out, lse -inf, zero grads)
    kpm[2, : N // 2] = False      # the whole first half (the split backward's first key half)
    kpm[3, N // 2:] = False
    inp["key_padding_mask"] = kpm
    run_case(kernel, inp, {})
    if N > 64:
        _assert_wide_kernels_ran(kernel, inp)


@pytest.mark.parametrize("view", ["key_stride_2", "row_stride_124"])
def test_key_padding_views(kernel, view, monkeypatch):
    # key-padding views: a key stride of 2 (the byte reads follow kp_sk) and 121 keys in rows of 124 bytes (word
    # reads but the last, partial word by bytes), with windows per CTA forced to 3
    monkeypatch.setenv("WINATTN_FWD_G", "3")
    monkeypatch.setenv("WINATTN_BWD_G", "3")
    B, H = 7, 2
    N = 144 if view == "key_stride_2" else 121
    inp = _window_inputs(B, N, H, FP16)
    if view == "key_stride_2":
        inp["key_padding_mask"] = (torch.rand(B, 2 * N, device="cuda") > 0.25)[:, ::2]
    else:
        base = torch.zeros(B, 124, dtype=torch.bool, device="cuda")  # (past the 121 keys: padded, never read)
        base[:, :N] = torch.rand(B, N, device="cuda") > 0.25
        inp["key_padding_mask"] = base[:, :N]
    run_case(kernel, inp, {})


@pytest.mark.parametrize("N", [64, 100, 144, 256])
@pytest.mark.parametrize("mask_shape", ["NN", "11NN", "1HNN"])
def test_shared_bool_mask_is_folded_into_the_term(kernel, N, mask_shape):
    # A bool mask broadcast over the windows folds into the fp16 term (winattn_cuda.cu fold_window_mask), with a
    # hidden row and a hidden column; on Hopper the window kernels take the call (not v3)
    B, H = 6, 2
    inp = _window_inputs(B, N, H, BF16)
    shape = {"NN": (N, N), "11NN": (1, 1, N, N), "1HNN": (1, H, N, N)}[mask_shape]
    mask = torch.rand(*shape, device="cuda") > 0.3
    mask[..., 5, :] = False
    mask[..., :, 7] = False
    inp["mask"] = mask
    run_case(kernel, inp, {})
    if N > 64:
        _assert_wide_kernels_ran(kernel, inp)


# A bool mask per window is not folded (an fp16 copy would be the size of the scores): the wide kernels read it as
# bits (KParams::mbits; the forward by TMA with each window, the backward transposed). N = 100 / 121 / 144 (words
# of a row past the keys, odd lengths), 196 / 256 (the split backward's query halves: a row's second four words)
@pytest.mark.parametrize("N", [100, 121, 144, 196, 256])
@pytest.mark.parametrize("heads", [1, 2])
def test_per_window_bool_mask_as_bits(kernel, N, heads):
    B, H = 7, 2
    inp = _window_inputs(B, N, H, BF16)
    mask = torch.rand(B, heads, N, N, device="cuda") > 0.3
    mask[0] = True                # a window that hides nothing
    mask[1, :, 3, :] = False      # a fully hidden row
    mask[2, :, :, : N // 2] = False  # the first key half (in the split backward: one CTA's keys)
    mask[3, :, N // 2:, :] = False   # the second query half
    inp["mask"] = mask
    if N == 144:
        inp["key_padding_mask"] = torch.rand(B, N, device="cuda") > 0.2  # both, on the same scores
    run_case(kernel, inp, {})
    _assert_wide_kernels_ran(kernel, inp, also=("mask_bits_kernel",))


@pytest.mark.parametrize("N", [121, 144])
def test_per_window_bool_mask_views(kernel, N):
    # the bits pass reads 4 mask bytes at a time where a row allows it: views that do not (keys 2 apart, rows that
    # start one byte in) take its byte loads, and must give the same bits
    B, H = 5, 2
    inp = _window_inputs(B, N, H, BF16)
    inp["mask"] = (torch.rand(B, 1, N, 2 * N + 1, device="cuda") > 0.3)[..., 1::2]
    inp["mask"][1, :, 5, :] = False  # a fully hidden row
    run_case(kernel, inp, {})
    _assert_wide_kernels_ran(kernel, inp, also=("mask_bits_kernel",))


def test_fp32_bias_with_a_mask_stays_exact(kernel):
    # an fp32 bias is not folded with the mask (fp16 would round it): other paths, still by the FlashAttention rule
    B, N, H = 6, 144, 2
    inp = _window_inputs(B, N, H, torch.float32)
    inp["mask"] = torch.rand(1, 1, N, N, device="cuda") > 0.3
    run_case(kernel, inp, {})
