"""Hopper backward v3 (sm90/bwd_pipelined_sm90.h): cases that stress its machinery (marked `gpu`).

On compute capability 9.0 every non-window backward runs v3 (but deterministic calls whose dbias needs ordering and
the relative-position table gradient), so the whole GPU suite checks it;
these cases aim at what is new: the KV-outer stage pipeline against short and ragged sequences (one key, S = tile
+- 1, fewer query blocks than stages), dQ through the fragment-order accumulator (ragged head dims: columns past D),
dbias written by TMA (one writer: a store in the bias dtype; broadcast over batch / heads: an fp32 reduce-add),
head dims padded to the 64 / 128 kernels, the global-memory path of terms TMA cannot stage (bool masks, fp32 and
broadcast terms, dbias by atomics), GQA reduced in the CTA,
causal and sliding windows with Sq != Sk (key blocks no query sees), key padding that hides whole key blocks, the
bitwise-deterministic dQ tickets, and which kernel actually ran (profiler).
"""

import pytest
import torch

from ._helpers import qkv as make_qkv
from ._helpers import kernels_run, rand, run_case

pytestmark = pytest.mark.gpu

BF16, FP16 = torch.bfloat16, torch.float16


def qkv(B, Sq, Sk, H, D, dtype=BF16, Hkv=None):
    return make_qkv(B, Sq, Sk, H, D, dtype=dtype, Hkv=Hkv, grad=True)


@pytest.mark.parametrize("S", [1, 17, 63, 64, 65, 127, 128, 129, 257, 641])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_sequence_lengths(kernel, S, D):
    run_case(kernel, qkv(2, S, S, 2, D), {})


@pytest.mark.parametrize("Sq,Sk", [(1, 1000), (130, 700), (700, 130)])
def test_cross_lengths(kernel, Sq, Sk):
    run_case(kernel, qkv(2, Sq, Sk, 3, 128, FP16), {})


def test_one_key(kernel):
    # Softmax over a single key: P = 1, so dS = P (dP - delta), dq and dk are exactly 0. delta = rowsum(dO * O) uses
    # the rounded O (as FlashAttention's preprocess does), so dq, dk are rounding noise of |dO| |V - O| eps rather
    # than the fp32 floor the FlashAttention rule allows for exact zeros: dv is checked by the rule, dq, dk by size.
    inp = qkv(2, 1000, 1, 3, 128, FP16)
    inp["q"].requires_grad_(False)
    inp["k"].requires_grad_(False)
    run_case(kernel, inp, {})
    q, k = (inp[n].detach().clone().requires_grad_(True) for n in ("q", "k"))
    out = kernel.attention(q, k, inp["v"].detach())
    out.backward(torch.randn_like(out))
    assert q.grad.abs().max().item() <= 1e-4 and k.grad.abs().max().item() <= 1e-3


# 24..64 on the 64 kernel, 72..128 on 128, 136..256 on the split head-dim kernel
@pytest.mark.parametrize("D", [24, 32, 40, 64, 72, 96, 112, 128, 136, 160, 192, 248, 256])
def test_ragged_head_dims(kernel, D):
    run_case(kernel, qkv(1, 300, 333, 2, D, FP16 if D % 16 else BF16), {})


# dbias: one contributor per element (store), and broadcast over batch / heads / both (reduce-add at L2)
# (Sk = 264: TMA needs 16-byte bias rows; other widths take v1, covered by test_cuda_kernels.py)
@pytest.mark.parametrize("shape", [(2, 3, 200, 264), (1, 3, 200, 264), (2, 1, 200, 264), (1, 1, 200, 264),
                                   (200, 264)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("det", [False, True])
def test_dbias_broadcasts(kernel, shape, det):
    inp = qkv(2, 200, 264, 3, 64)
    inp["bias"] = rand(*shape, dtype=BF16, grad=True)
    run_case(kernel, inp, {}, deterministic=det)


# dbias in the bias's own dtype, written once per element by TMA (no zero-fill, no fp32 pass): one contributor, and
# pair mode ([1, H, S, S] with B = 2); Sk % 8 != 0 keeps the fp32 store (16-bit rows must be whole 16-byte units)
@pytest.mark.parametrize("B,bshape,D", [(2, (2, 3, 200, 264), 128), (2, (1, 3, 200, 264), 64),
                                        (2, (2, 3, 200, 332), 64), (3, (3, 2, 130, 136), 96)],
                         ids=["store128", "pair64", "fp32_store_sk332", "store_d96"])
@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_dbias_in_bias_dtype(kernel, B, bshape, D, dtype):
    Sq, Sk = bshape[2], bshape[3]
    inp = qkv(B, Sq, Sk, bshape[1], D, dtype)
    inp["bias"] = rand(*bshape, dtype=dtype, grad=True)
    run_case(kernel, inp, {})
    bias = inp["bias"].detach().clone().requires_grad_(True)
    out = kernel.attention(inp["q"].detach(), inp["k"].detach(), inp["v"].detach(), bias=bias)
    out.backward(torch.randn_like(out))
    assert bias.grad.dtype == dtype and bias.grad.shape == bias.shape and torch.isfinite(bias.grad).all()


# Bool masks (with fully hidden rows) folded into the staged term as -inf (kernel_choice.h prepare_v3_term; a mask
# broadcast over the keys too, and [B, 1, 1, Sk] as key padding); terms TMA cannot stage run v3's global-memory path:
# fp32 and broadcast additive terms, odd widths; dbias broadcast over rows / columns (or rows TMA cannot address) by
# fp32 atomics
@pytest.mark.parametrize("mshape", [(2, 1, 200, 264), (1, 1, 200, 264), (2, 3, 200, 264), (2, 1, 1, 264),
                                    (1, 3, 200, 1)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("D", [64, 128, 256])
def test_bool_masks(kernel, mshape, D):
    inp = qkv(2, 200, 264, 3, D)
    mask = torch.rand(*mshape, device="cuda") > 0.3
    if mshape[2] > 1:
        mask[..., 7, :] = False  # a fully hidden query row: out 0, gradients 0
    inp["mask"] = mask
    run_case(kernel, inp, {})


@pytest.mark.parametrize("bshape,dtype", [((1, 3, 200, 264), torch.float32), ((2, 3, 1, 264), BF16),
                                          ((2, 1, 1, 264), BF16), ((1, 3, 200, 1), torch.float32),
                                          ((1, 1, 1, 1), BF16), ((2, 3, 200, 333), BF16)],
                         ids=["fp32_full", "rows_bcast", "rows_heads_bcast", "cols_bcast", "scalar", "sk333"])
@pytest.mark.parametrize("causal", [False, True])
def test_global_terms_with_dbias(kernel, bshape, dtype, causal):
    Sk = bshape[3] if bshape[3] > 1 else 264
    inp = qkv(2, 200, Sk, 3, 64)
    inp["bias"] = rand(*bshape, dtype=dtype, grad=True)
    run_case(kernel, inp, {"causal": causal})


# The split head-dim consumer (D > 128): dbias by every route (16-bit store, fp32 reduce-add, atomics), GQA with a
# band, deterministic tickets
@pytest.mark.parametrize("bshape,dtype", [((2, 3, 200, 264), BF16), ((1, 3, 200, 264), BF16),
                                          ((2, 1, 200, 264), torch.float32), ((2, 3, 1, 264), BF16)],
                         ids=["store16", "reduce", "reduce_fp32", "atomic_rows"])
@pytest.mark.parametrize("D", [192, 256])
def test_split_head_dim_dbias(kernel, bshape, dtype, D):
    inp = qkv(2, 200, 264, 3, D)
    inp["bias"] = rand(*bshape, dtype=dtype, grad=True)
    run_case(kernel, inp, {})


@pytest.mark.parametrize("det", [False, True])
def test_split_head_dim_gqa_band(kernel, det):
    run_case(kernel, qkv(2, 333, 400, 8, 256, FP16, Hkv=2), {"window": (150, 10)}, deterministic=det)


def test_mask_bias_and_padding_together(kernel):
    B, S = 2, 300
    inp = qkv(B, S, S, 4, 128, FP16)
    inp["bias"] = rand(1, 4, S, S, dtype=FP16, grad=True)
    inp["mask"] = torch.rand(B, 1, S, S, device="cuda") > 0.2
    kpm = torch.ones(B, S, dtype=torch.bool, device="cuda")
    kpm[1, 200:] = False
    inp["key_padding_mask"] = kpm
    run_case(kernel, inp, {"window": (100, 20)})
    run_case(kernel, inp, {}, deterministic=True)


@pytest.mark.parametrize("H,Hkv", [(32, 8), (8, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa(kernel, H, Hkv, causal):
    run_case(kernel, qkv(1, 333, 333, H, 128, Hkv=Hkv), {"causal": causal})


@pytest.mark.parametrize("Sq,Sk", [(300, 700), (700, 300), (128, 1000)])
@pytest.mark.parametrize("window", [None, (64, 0), (200, 50), (0, 0)])
def test_causal_and_windows_unequal_lengths(kernel, Sq, Sk, window):
    kwargs = {"causal": True} if window is None else {"window": window}
    run_case(kernel, qkv(2, Sq, Sk, 2, 64), kwargs)


def test_key_padding_hides_whole_key_blocks(kernel):
    B, S = 3, 700
    inp = qkv(B, S, S, 2, 128)
    kpm = torch.ones(B, S, dtype=torch.bool, device="cuda")
    kpm[1, 300:] = False  # key blocks 3.. of item 1 have no key: their CTAs skip, dK = dV = 0 there
    kpm[2] = False  # no real key at all: every gradient 0
    inp["key_padding_mask"] = kpm
    run_case(kernel, inp, {})
    run_case(kernel, inp, {}, deterministic=True)


@pytest.mark.parametrize("pair", ["1", "0"])
def test_dense_bias_with_causal_and_padding(kernel, pair, monkeypatch):
    # [1, H, S, S] with B = 2: pair mode (one CTA owns both batches, dS summed on chip, plain store) and the
    # reduce-add it replaces (WINATTN_FORCE_KERNEL=bwd_v3_no_pair)
    if pair == "0":
        monkeypatch.setenv("WINATTN_FORCE_KERNEL", "bwd_v3_no_pair")
    inp = qkv(2, 336, 336, 2, 64)
    inp["bias"] = rand(1, 2, 336, 336, dtype=BF16, grad=True)
    kpm = torch.ones(2, 336, dtype=torch.bool, device="cuda")
    kpm[0, 250:] = False
    inp["key_padding_mask"] = kpm
    run_case(kernel, inp, {"causal": True})
    run_case(kernel, inp, {}, deterministic=True)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("D", [128, 256])
def test_deterministic_bitwise(kernel, bias, D):
    B, S, H = 2, 1100, 4
    t = qkv(B, S, S, H, D)
    if bias:
        t["bias"] = rand(1, H, S, S, dtype=BF16, grad=True)  # two contributors per dbias element
    dout = torch.randn(B, S, H, D, device="cuda", dtype=BF16)
    runs = []
    for _ in range(2):
        leaves = {n: x.detach().clone().requires_grad_(True) for n, x in t.items()}
        out = kernel.attention(leaves["q"], leaves["k"], leaves["v"], bias=leaves.get("bias"), deterministic=True)
        out.backward(dout)
        runs.append([leaves[n].grad for n in leaves])
    for a, b in zip(*runs):
        assert torch.equal(a, b), "deterministic=True must give bit-identical gradients"


@pytest.mark.parametrize("case", ["plain128", "dense_bias64", "causal_gqa", "key_padding", "bool_mask_d96",
                                  "row_bias_fp32", "plain256", "bias_d160"])
def test_v3_is_the_default_on_hopper(kernel, case):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("backward v3 is the Hopper path")
    D = {"dense_bias64": 64, "bool_mask_d96": 96, "row_bias_fp32": 64, "plain256": 256, "bias_d160": 160}.get(case, 128)
    H, Hkv = (8, 2) if case == "causal_gqa" else (4, 4)
    t = qkv(2, 512, 512, H, D, Hkv=Hkv)
    kw = {}
    if case == "dense_bias64":
        kw["bias"] = rand(1, H, 512, 512, dtype=BF16, grad=True)
    if case == "bool_mask_d96":
        kw["mask"] = torch.rand(2, 1, 512, 512, device="cuda") > 0.5
    if case == "bias_d160":
        kw["bias"] = rand(1, H, 512, 512, dtype=BF16, grad=True)
    if case == "row_bias_fp32":
        kw["bias"] = rand(2, 1, 1, 512, dtype=torch.float32, grad=True)
    if case == "causal_gqa":
        kw["causal"] = True
    if case == "key_padding":
        kpm = torch.ones(2, 512, dtype=torch.bool, device="cuda")
        kpm[0, 400:] = False
        kw["key_padding_mask"] = kpm

    def step():
        out = kernel.attention(t["q"], t["k"], t["v"], **kw)
        out.backward(torch.ones_like(out))

    names = kernels_run(step)
    assert any("bwd_pipelined_kernel_sm90" in n for n in names), sorted(names)
    assert not any("bwd_kernel<" in n for n in names), sorted(names)
