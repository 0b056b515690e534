"""The split-KV decode forwards, marked `gpu`: calls with at most 16 query rows per KV head (H / Hkv x Sq) run
kernel-src/cuda/fwd_decode.h (cp.async) on every architecture but Hopper, where the table takes
sm90/fwd_decode_sm90.h (K / V by TMA). The first section forces fwd_decode.h (WINATTN_FORCE_KERNEL=fwd_decode), the
second the TMA kernel. Each case runs the FlashAttention accuracy rule against the float64 reference (the backward,
on v3 / v1, takes the decode forward's lse, so its gradients check lse too) and checks which kernels ran: one split
writes the output itself, several go through the combine step.
"""

import pytest
import torch

from ._helpers import qkv as make_qkv
from ._helpers import kernels_run, rand, run_case

pytestmark = pytest.mark.gpu

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def qkv(B, Sq, Sk, H, D, dtype=BF16, Hkv=None, grad=True):
    return make_qkv(B, Sq, Sk, H, D, dtype=dtype, Hkv=Hkv, grad=grad)


def ran(names, part):
    return any(part in n for n in names)


def hopper():
    return torch.cuda.get_device_capability()[0] == 9


@pytest.fixture
def force_cp_async(monkeypatch):
    """fwd_decode.h on every architecture (on Hopper the table would take the TMA kernel)."""
    monkeypatch.setenv("WINATTN_FORCE_KERNEL", "fwd_decode")


def test_the_table_takes_tma_on_hopper_and_cp_async_elsewhere(kernel):
    inp = qkv(2, 1, 3000, 8, 128, Hkv=2, grad=False)
    names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"]))
    want, other = ("fwd_decode_tma_kernel", "fwd_decode_kernel") if hopper() else ("fwd_decode_kernel", "tma")
    assert ran(names, want) and not ran(names, other) and ran(names, "decode_combine_kernel"), sorted(names)


@pytest.mark.parametrize("Sk", [1, 77, 1000, 4097])
@pytest.mark.parametrize("D,dtype", [(128, BF16), (64, FP16), (40, BF16), (96, FP16), (256, BF16)])
def test_decode_gqa_matches_the_reference(kernel, force_cp_async, Sk, D, dtype):
    # Llama-shaped: one query per sequence, 4 query heads per KV head (4 rows per CTA)
    inp = qkv(3, 1, Sk, 8, D, dtype, Hkv=2)
    run_case(kernel, inp, {})
    names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"]))
    assert ran(names, "fwd_decode_kernel"), sorted(names)
    # B x Hkv = 6 CTAs per split: more than one split as soon as there are two 128-key steps
    assert ran(names, "decode_combine_kernel") == (Sk > 128), sorted(names)


@pytest.mark.parametrize("Sq,H,Hkv", [(1, 4, 4), (2, 8, 2), (8, 3, 3), (3, 6, 3), (4, 32, 8), (16, 2, 2)])
def test_decode_row_counts(kernel, force_cp_async, Sq, H, Hkv):
    # rows per CTA (one 16-row tile): 1 (MHA decode), 8 (two queries x 4 heads), 8 (MHA, 8 queries), 6 (three
    # queries x 2 heads), 16 (speculative: four queries x 4 heads), 16 (MHA, 16 queries)
    inp = qkv(2, Sq, 700, H, 64, Hkv=Hkv)
    run_case(kernel, inp, {})
    run_case(kernel, inp, {"causal": True})  # bottom-right aligned: the last query sees every key
    names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"]))
    assert ran(names, "fwd_decode_kernel"), sorted(names)


def test_more_rows_than_sixteen_take_the_tiled_kernels(kernel):
    inp = qkv(2, 5, 500, 8, 64, Hkv=2, grad=False)  # 20 rows per KV head
    names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"]))
    assert not ran(names, "fwd_decode"), sorted(names)  # (neither decode kernel)


def test_decode_with_every_score_term(kernel, force_cp_async):
    B, Sq, Sk, H, Hkv = 3, 2, 900, 4, 2
    inp = qkv(B, Sq, Sk, H, 64, Hkv=Hkv)
    kpm = torch.rand(B, Sk, device="cuda") > 0.3
    kpm[2] = False  # an item with no visible key: output 0, lse -inf, gradients 0
    inp["key_padding_mask"] = kpm
    run_case(kernel, inp, {})
    run_case(kernel, inp, {"window": (300, 0)})
    inp["bias"] = rand(B, H, Sq, Sk, dtype=FP32, grad=True)  # dbias per element
    run_case(kernel, inp, {})
    inp["bias"] = rand(1, H, 1, Sk, dtype=BF16)  # a row broadcast over the batch
    inp["mask"] = torch.rand(B, 1, Sq, Sk, device="cuda") > 0.2
    run_case(kernel, inp, {})
    out, lse = kernel.attention(inp["q"], inp["k"], inp["v"], key_padding_mask=kpm, return_lse=True)
    assert torch.all(out[2] == 0) and torch.all(torch.isneginf(lse[2]))
    assert torch.isfinite(lse[:2]).all()


def test_decode_float_key_mask_and_strided_inputs(kernel, force_cp_async):
    # what a generation loop passes: q sliced out of a fused projection, an additive [B, 1, 1, Sk] mask with -inf
    B, Sk, H, D = 2, 1500, 8, 128
    fused = rand(B, 1, 3 * H, D, dtype=BF16)
    q = fused[:, :, H:2 * H].detach().requires_grad_(True)
    k, v = rand(B, Sk, 2, D, dtype=BF16, grad=True), rand(B, Sk, 2, D, dtype=BF16, grad=True)
    m = torch.zeros(B, 1, 1, Sk, device="cuda", dtype=BF16)
    m[0, ..., 1000:] = float("-inf")
    run_case(kernel, dict(q=q, k=k, v=v, bias=m), {})


def nan_in_q_reaches_only_its_row(kernel):
    """README: a NaN in q gives NaN out and lse in every row it reaches, and only there."""
    inp = qkv(2, 1, 3000, 8, 64, Hkv=2, grad=False)
    q = inp["q"].clone()
    q[1, 0, 5, 3] = float("nan")
    out, lse = kernel.attention(q, inp["k"], inp["v"], return_lse=True)
    assert torch.isnan(out[1, 0, 5]).all() and torch.isnan(lse[1, 5, 0])
    keep = torch.ones_like(lse, dtype=torch.bool)
    keep[1, 5, 0] = False
    assert torch.isfinite(lse[keep]).all() and torch.isfinite(out[0]).all() and torch.isfinite(out[1, 0, :5]).all()


def test_nan_in_q_reaches_only_its_row(kernel, force_cp_async):
    nan_in_q_reaches_only_its_row(kernel)


def test_forcing_decode_on_a_long_query_is_refused(kernel, monkeypatch):
    monkeypatch.setenv("WINATTN_FORCE_KERNEL", "fwd_decode")
    inp = qkv(1, 64, 64, 2, 64, grad=False)
    with pytest.raises(Exception, match="fwd_decode: this call cannot run it \\(more than 16 query rows"):
        kernel.attention(inp["q"], inp["k"], inp["v"])


# ---- fwd_decode_tma (sm90/fwd_decode_sm90.h): the same calls on Hopper with K / V loaded by TMA (the table's) ----
# (WINATTN_FORCE_KERNEL is read on every call, so monkeypatch switches it per test.) Each case checks in the profiler's
# trace that the TMA kernel ran, not fwd_decode_kernel, and that the combine step ran exactly when the planner split
# the keys (tma_splits: kernel_choice.h try_fwd_decode's rule for it, one wave of its resident CTAs).
TMA = "fwd_decode_tma"


@pytest.fixture
def force_tma(monkeypatch):
    if not hopper():
        pytest.skip("fwd_decode_tma is a Hopper (sm_90a) kernel")
    monkeypatch.setenv("WINATTN_FORCE_KERNEL", TMA)


def tma_splits(B, Hkv, Sk, D):
    """The planner's split count for fwd_decode_tma: one wave of its resident CTAs (two per SM up to head dim 128,
    one at 160-256), rounded down, in chunks of whole 128-key steps."""
    slots = (2 if D <= 128 else 1) * torch.cuda.get_device_properties(0).multi_processor_count
    steps = -(-Sk // 128)
    want = min(max(slots // (B * Hkv), 1), steps)
    chunk = -(-steps // want) * 128
    return -(-Sk // chunk)


def check_tma_ran(kernel, inp, **kwargs):
    names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"], **kwargs))
    assert ran(names, "fwd_decode_tma_kernel") and not ran(names, "fwd_decode_kernel"), sorted(names)
    B, Sk, Hkv, D = inp["k"].shape
    assert ran(names, "decode_combine_kernel") == (tma_splits(B, Hkv, Sk, D) > 1), sorted(names)


@pytest.mark.parametrize("Sk", [1, 77, 1000, 8191])
@pytest.mark.parametrize("D,dtype", [(128, BF16), (128, FP16), (64, FP16), (64, BF16), (256, BF16), (40, BF16),
                                     (96, FP16), (160, BF16)])
@pytest.mark.parametrize("H,Hkv", [(8, 2), (4, 4)])
def test_decode_tma_matches_the_reference(kernel, force_tma, Sk, D, dtype, H, Hkv):
    # GQA (4 rows per CTA) and MHA (1 row); Sk not a multiple of the 64-key tile (the last tile's keys past Sk arrive
    # as zeros from TMA), D below the instance (columns past D arrive as zeros: 40 at 64, 96 at 128; at 160 the 256
    # instance's column blocks past dim 160 are never loaded and hold the zeros the consumers wrote once)
    inp = qkv(3, 1, Sk, H, D, dtype, Hkv=Hkv)
    run_case(kernel, inp, {})
    check_tma_ran(kernel, inp)


@pytest.mark.parametrize("D", [64, 128, 256])
def test_decode_tma_one_split_of_many_tiles(kernel, force_tma, D):
    # more (batch, KV head) pairs than the CTAs one wave holds: one split per pair, every key of it in one CTA (16
    # 64-key tiles, the stage ring wrapping several times), the output written without the combine step
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    Hkv = 8
    B = 2 * sms // Hkv + 1
    inp = qkv(B, 1, 1000, 4 * Hkv, D, BF16, Hkv=Hkv, grad=False)
    assert tma_splits(B, Hkv, 1000, D) == 1
    run_case(kernel, inp, {})
    check_tma_ran(kernel, inp)


@pytest.mark.parametrize("Sq,H,Hkv", [(1, 4, 4), (2, 8, 2), (8, 3, 3), (3, 6, 3), (4, 32, 8), (16, 2, 2)])
def test_decode_tma_row_counts(kernel, force_tma, Sq, H, Hkv):
    # rows per CTA 1 .. 16 (as test_decode_row_counts), causal (bottom-right aligned) and a band
    inp = qkv(2, Sq, 700, H, 64, Hkv=Hkv)
    run_case(kernel, inp, {})
    run_case(kernel, inp, {"causal": True})
    run_case(kernel, inp, {"window": (200, 0)})
    check_tma_ran(kernel, inp)


@pytest.mark.parametrize("D", [64, 128])
def test_decode_tma_with_every_score_term(kernel, force_tma, D):
    B, Sq, Sk, H, Hkv = 3, 2, 900, 4, 2
    inp = qkv(B, Sq, Sk, H, D, Hkv=Hkv)
    kpm = torch.rand(B, Sk, device="cuda") > 0.3
    kpm[2] = False  # an item with no visible key: output 0, lse -inf, gradients 0
    inp["key_padding_mask"] = kpm
    run_case(kernel, inp, {})  # key padding alone: one byte per key
    run_case(kernel, inp, {"window": (300, 0)})
    inp["bias"] = rand(B, H, Sq, Sk, dtype=FP32, grad=True)  # a bias per element (dbias by the backward)
    run_case(kernel, inp, {})
    inp["bias"] = rand(1, H, 1, Sk, dtype=BF16)  # a row broadcast over the batch, with a bool mask
    inp["mask"] = torch.rand(B, 1, Sq, Sk, device="cuda") > 0.2
    run_case(kernel, inp, {})
    out, lse = kernel.attention(inp["q"], inp["k"], inp["v"], key_padding_mask=kpm, return_lse=True)
    assert torch.all(out[2] == 0) and torch.all(torch.isneginf(lse[2]))
    assert torch.isfinite(lse[:2]).all()
    check_tma_ran(kernel, inp, key_padding_mask=kpm, bias=inp["bias"], mask=inp["mask"])


def test_decode_tma_key_padding_hides_a_whole_split(kernel, force_tma):
    # Llama-shaped, many splits; item 0 keeps its first 300 keys only (every later split of it sees no key: partial
    # lse -inf, weight 0 in the combine), item 1 no key at all (out 0, lse -inf)
    B, Sk, H, Hkv = 2, 5000, 32, 8
    inp = qkv(B, 1, Sk, H, 128, Hkv=Hkv, grad=False)
    kpm = torch.ones(B, Sk, dtype=torch.bool, device="cuda")
    kpm[0, 300:] = False
    kpm[1] = False
    inp["key_padding_mask"] = kpm
    assert tma_splits(B, Hkv, Sk, 128) > 1
    run_case(kernel, inp, {})
    out, lse = kernel.attention(inp["q"], inp["k"], inp["v"], key_padding_mask=kpm, return_lse=True)
    assert torch.all(out[1] == 0) and torch.all(torch.isneginf(lse[1])) and torch.isfinite(lse[0]).all()
    check_tma_ran(kernel, inp, key_padding_mask=kpm)


def test_decode_tma_float_key_mask_and_strided_inputs(kernel, force_tma):
    # q sliced out of a fused projection, k / v views with a padded head stride (the tensor maps take the strides),
    # an additive [B, 1, 1, Sk] mask with -inf
    B, Sk, H, D = 2, 1500, 8, 128
    fused = rand(B, 1, 3 * H, D, dtype=BF16)
    q = fused[:, :, H:2 * H].detach().requires_grad_(True)
    kv = rand(B, Sk, 2, 3, D, dtype=BF16)
    k = kv[:, :, 0, :2].detach().requires_grad_(True)  # [B, Sk, 2, D], head stride D, seq stride 6 D
    v = kv[:, :, 1, 1:].detach().requires_grad_(True)
    m = torch.zeros(B, 1, 1, Sk, device="cuda", dtype=BF16)
    m[0, ..., 1000:] = float("-inf")
    run_case(kernel, dict(q=q, k=k, v=v, bias=m), {})  # (its copies of the inputs are contiguous)
    # the views themselves: the same kernel and splits on contiguous copies give the same bits
    with torch.no_grad():
        out, lse = kernel.attention(q, k, v, bias=m, return_lse=True)
        out_c, lse_c = kernel.attention(q.contiguous(), k.contiguous(), v.contiguous(), bias=m, return_lse=True)
    assert torch.equal(out, out_c) and torch.equal(lse, lse_c)
    check_tma_ran(kernel, dict(q=q, k=k, v=v), bias=m)


def test_decode_tma_nan_in_q_reaches_only_its_row(kernel, force_tma):
    nan_in_q_reaches_only_its_row(kernel)


def test_forcing_decode_tma_is_refused_with_the_reason(kernel, monkeypatch):
    monkeypatch.setenv("WINATTN_FORCE_KERNEL", TMA)
    if not hopper():  # (an sm80-class device, or a build without 9.0a)
        inp = qkv(1, 1, 64, 2, 64, grad=False)
        with pytest.raises(Exception, match="fwd_decode_tma: not Hopper / no sm_90a code"):
            kernel.attention(inp["q"], inp["k"], inp["v"])
        return
    inp = qkv(1, 64, 64, 2, 64, grad=False)
    with pytest.raises(Exception, match="this call cannot run it \\(fwd_decode_tma: more than 16 query rows"):
        kernel.attention(inp["q"], inp["k"], inp["v"])
