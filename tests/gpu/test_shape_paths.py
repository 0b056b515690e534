"""The paths the kernel choice (kernel_choice.h) added for the shape matrix (issue 29), marked `gpu`: each case runs
the FlashAttention accuracy rule against the float64 reference and checks, on Hopper, which kernels ran.

* a full-size additive term v3 cannot stage as given (fp32, the other 16-bit dtype, rows that are not 16-byte
  aligned: BEiT's N = 197) is recast to the input dtype (combine_terms_kernel) and staged;
* its dbias, when its rows are not whole 16-byte units, is reduced into a padded copy and unpadded;
* a term broadcast over the queries ([B or 1, H or 1, 1, Sk]: float key-padding masks) is read one value per key
  (forward kTermsRawRow, backward kBwdTermsRow), -inf / finfo.min / -10000 entries included;
* a bool mask [B or 1, 1, 1, Sk] runs as key padding (fully masked items included);
* the relative-position table term of a v3 call is gathered in the input dtype.
"""

import re

import pytest
import torch

from swin_index import swin_relative_index

from ._helpers import qkv as make_qkv
from ._helpers import kernels_run, rand, run_case

pytestmark = pytest.mark.gpu

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def qkv(B, Sq, Sk, H, D, dtype=BF16, Hkv=None):
    return make_qkv(B, Sq, Sk, H, D, dtype=dtype, Hkv=Hkv, grad=True)


def hopper():
    return torch.cuda.get_device_capability()[0] == 9


def ran(names, *parts):
    return any(all(p in n for p in parts) for n in names)


@pytest.mark.parametrize("dtype,bias_dtype", [(BF16, FP32), (FP16, FP32), (BF16, FP16), (BF16, BF16)])
@pytest.mark.parametrize("N", [197, 200])
def test_relative_position_bias_shared_over_the_batch(kernel, dtype, bias_dtype, N):
    # BEiT-shaped: a learnable [1, H, N, N] bias shared over the batch, with its gradient (reduced over the batch)
    inp = qkv(6, N, N, 3, 64, dtype)
    inp["bias"] = rand(1, 3, N, N, dtype=bias_dtype, grad=True)
    run_case(kernel, inp, {})
    if hopper():
        names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"], bias=inp["bias"]).sum().backward())
        # (a 16-bit bias of the other dtype arrives cast to q's by the Python layer: recast only past the fp32 / row rules)
        assert ran(names, "combine_terms_kernel") == (bias_dtype == FP32 or N % 8 != 0), sorted(names)
        assert ran(names, "fwd_pipelined_kernel_sm90") and ran(names, "bwd_pipelined_kernel_sm90"), sorted(names)
        assert ran(names, "unpad_rows_kernel") == (N % 4 != 0), sorted(names)


def test_per_item_fp32_bias_with_ragged_rows(kernel):
    # [B, H, S, S] fp32 (one contributor per dbias element: the store into the padded copy), S % 4 != 0
    inp = qkv(2, 131, 131, 2, 128)
    inp["bias"] = rand(2, 2, 131, 131, dtype=FP32, grad=True)
    run_case(kernel, inp, {})
    run_case(kernel, inp, {"causal": True})


@pytest.mark.parametrize("fill", ["-inf", "finfo.min", "-10000"])
@pytest.mark.parametrize("term_dtype", [FP32, BF16])
def test_float_key_padding_mask(kernel, fill, term_dtype):
    # what diffusers pipelines pass: an additive [B, 1, 1, S] mask of 0 and a large negative value
    B, S = 3, 300
    value = {"-inf": float("-inf"), "finfo.min": torch.finfo(term_dtype).min, "-10000": -10000.0}[fill]
    m = torch.zeros(B, 1, 1, S, device="cuda", dtype=term_dtype)
    m[0, ..., 250:] = value
    m[1, ..., :7] = value
    m[2, ..., 1::3] = value
    inp = qkv(B, S, S, 4, 128)
    inp["bias"] = m
    run_case(kernel, inp, {})
    if hopper():
        names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"], bias=m).sum().backward())
        assert not ran(names, "combine_terms_kernel"), sorted(names)  # read as given, one value per key


@pytest.mark.parametrize("D", [64, 72, 160, 256])
@pytest.mark.parametrize("shape", [(2, 1, 1, 257), (1, 3, 1, 257), (2, 3, 1, 257)])
def test_terms_broadcast_over_the_queries(kernel, shape, D):
    # a per-key bias without its gradient (row path: staged per key block by a producer warp, whose register share
    # is its own at every head dim), cross-attention lengths, GQA
    inp = qkv(2, 190, 257, 3, D, FP16, Hkv=1)
    inp["bias"] = rand(*shape, dtype=FP32)
    run_case(kernel, inp, {})
    run_case(kernel, inp, {"window": (40, 7)})


def test_row_term_with_gradient_still_correct(kernel):
    # with dbias the row term's backward sums dbias per key in registers (kernel_modes.h kBwdTermsRowKeyGrad)
    inp = qkv(2, 150, 150, 2, 64)
    inp["bias"] = rand(2, 1, 1, 150, dtype=FP32, grad=True)
    run_case(kernel, inp, {})


# The row term's gradient per key summed over the CTA's query blocks in registers, one atomic per key and (batch,
# head): several query and key blocks, odd Sk, GQA (a CTA runs the heads of its KV group one after the other: the
# sums restart per head), dbias shared over heads or batches, key padding, a causal band, hidden (-inf) keys
@pytest.mark.parametrize("bshape,dtype,D,Hkv", [((1, 4, 1, 333), BF16, 64, 2), ((2, 1, 1, 333), FP32, 128, 4),
                                                ((2, 4, 1, 333), FP16, 64, 1), ((1, 1, 1, 333), BF16, 128, 2)],
                         ids=["heads_gqa", "batch_fp32_d128", "per_item_fp16", "shared_gqa_d128"])
@pytest.mark.parametrize("extra", ["plain", "key_padding", "causal"])
def test_key_bias_gradient_summed_per_key(kernel, bshape, dtype, D, Hkv, extra):
    inp = qkv(2, 300, 333, 4, D, FP16 if dtype == FP16 else BF16, Hkv=Hkv)
    bias = rand(*bshape, dtype=dtype)
    bias[..., 5] = float("-inf")  # a key no query sees: dbias 0 there
    inp["bias"] = bias.requires_grad_(True)
    kwargs = {}
    if extra == "key_padding":
        kp = torch.ones(2, 333, dtype=torch.bool, device="cuda")
        kp[1, 200:] = False
        inp["key_padding_mask"] = kp
    if extra == "causal":
        kwargs["causal"] = True
    run_case(kernel, inp, kwargs)


def test_fully_hidden_rows_under_a_float_mask(kernel):
    # every key of item 1 at -inf: output 0 and lse -inf there, gradients 0 (no NaN)
    inp = qkv(2, 70, 90, 2, 64)
    m = torch.zeros(2, 1, 1, 90, device="cuda", dtype=FP32)
    m[1] = float("-inf")
    inp["bias"] = m
    run_case(kernel, inp, {})
    out, lse = kernel.attention(inp["q"], inp["k"], inp["v"], bias=m, return_lse=True)
    assert torch.all(out[1] == 0) and torch.all(torch.isneginf(lse[1]))


@pytest.mark.parametrize("period", [1, 3])
def test_bool_key_mask_runs_as_key_padding(kernel, period):
    B, S = 3, 333
    mask = torch.rand(period, 1, 1, S, device="cuda") > 0.3
    if period == 3:
        mask[1] = False  # an item with no visible key: output 0, gradients 0
    inp = qkv(B, S, S, 2, 64)
    inp["mask"] = mask
    run_case(kernel, inp, {})
    if hopper():
        names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"], mask=mask).sum().backward())
        assert ran(names, "fwd_pipelined_kernel_sm90") and ran(names, "bwd_pipelined_kernel_sm90"), sorted(names)


@pytest.mark.parametrize("shape", [(1, 3, 1, 199), (2, 3, 1, 199)])
def test_bool_per_head_key_mask_runs_as_a_row_term(kernel, shape):
    # [B or 1, H, 1, Sk] (per-head token dropping): one row of bits in v3's forward, a 0 / -inf row term in its
    # backward; a head with no visible key gives 0
    B, S = 2, 199
    mask = torch.rand(*shape, device="cuda") > 0.4
    mask[0, 1] = False
    inp = qkv(B, S, S, 3, 64)
    inp["mask"] = mask
    run_case(kernel, inp, {})
    if hopper():
        names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"], mask=mask).sum().backward())
        assert ran(names, "combine_terms_kernel"), sorted(names)


@pytest.mark.parametrize("mshape,bias", [((2, 3, 250, 333), None), ((1, 3, 250, 333), (1, 3, 250, 333)),
                                        ((2, 1, 250, 333), (2, 1, 1, 333)), ((1, 1, 250, 1), (1, 3, 250, 333))],
                         ids=["bhqk", "1hqk+bias", "b1qk+row_bias", "11q1+bias"])
@pytest.mark.parametrize("D", [64, 128])
def test_bool_mask_per_score_is_folded_into_the_staged_term(kernel, mshape, bias, D):
    # A bool mask per score (document masks, per-head masks) with or without a bias, with its gradient: on Hopper
    # folded with the bias into one term of the input dtype (-inf where hidden) that TMA stages (without a bias both
    # directions read bits: the next tests). The general path read a byte per score: 0.17-0.25x cuDNN (RESULTS
    # v3.6). Hidden rows give 0.
    B, Sq, Sk = 2, 250, 333
    mask = torch.rand(*mshape, device="cuda") > 0.3
    mask[..., 0] = True
    if mshape[2] > 1:
        mask[0, 0, 17] = False  # a query row with every key hidden (in every head where the mask is per head)
    inp = qkv(B, Sq, Sk, 3, D)
    inp["mask"] = mask
    if bias is not None:
        inp["bias"] = rand(*bias, dtype=torch.float32, grad=True)
    run_case(kernel, inp, {})
    if hopper():
        def step():
            kw = {"bias": inp["bias"]} if bias is not None else {}
            kernel.attention(inp["q"], inp["k"], inp["v"], mask=mask, **kw).sum().backward()
        names = kernels_run(step)
        assert ran(names, "fwd_pipelined_kernel_sm90") and ran(names, "bwd_pipelined_kernel_sm90"), sorted(names)
        if bias is None:  # (no term to fold into: bits both ways, test_bool_mask_per_score_backward_as_bits)
            assert not ran(names, "combine_terms_kernel"), sorted(names)
        else:
            assert ran(names, "combine_terms_kernel"), sorted(names)


@pytest.mark.parametrize("mshape", [(2, 3, 250, 333), (1, 3, 250, 333), (2, 1, 250, 333), (1, 1, 250, 1)],
                         ids=["bhqk", "1hqk", "b1qk", "11q1"])
@pytest.mark.parametrize("D,H,Hkv,kw", [(64, 3, 3, {}), (128, 4, 2, {"causal": True}), (160, 3, 3, {}),
                                        (256, 2, 1, {"window": (100, 30)})], ids=["d64", "d128_gqa_causal",
                                                                                  "d160", "d256_gqa_window"])
def test_bool_mask_per_score_runs_as_bits(kernel, mshape, D, H, Hkv, kw):
    # A bool mask per score without an additive term: on Hopper the forward reads it as bits, one key block ahead
    # (kTermsRawBits: 128 / 96 / 64-key blocks at these head dims, 16-byte or word loads), the backward folds it
    # into a staged -inf term. Rows with every key hidden give 0; the band and the sequence end still apply.
    B, Sq, Sk = 2, 250, 333
    mask = torch.rand(mshape[0], H if mshape[1] > 1 else 1, *mshape[2:], device="cuda") > 0.3
    mask[..., 0] = True
    mask[..., 249, :] = True  # (the band leaves the last rows their own keys)
    mask[0, 0, 17] = False  # a query row with every key hidden
    inp = qkv(B, Sq, Sk, H, D, Hkv=Hkv)
    inp["mask"] = mask
    run_case(kernel, inp, kw)
    if hopper():
        names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"], mask=mask, **kw))
        assert ran(names, "mask_bits_kernel") and ran(names, "fwd_pipelined_kernel_sm90"), sorted(names)


# The two-CTA tile, the table's choice at head dim <= 64 without a term for 129-320 keys, and up to 1088 keys on
# calls of 8+ tiles per SM (not forced: the choice is under test too): ViT-B/16's batch (more tiles than its
# persistent grid of two CTAs per SM), odd lengths, fp16 with GQA and a causal band, cross-attention with key
# padding, a sliding band, ViT-B/16-384's 577 keys over 1080 tiles
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,D,dtype,kw", [
    (128, 197, 197, 12, 12, 64, BF16, {}), (3, 257, 257, 4, 2, 64, FP16, {"causal": True}),
    (2, 300, 140, 4, 1, 48, BF16, {"key_padding": True}), (2, 70, 320, 2, 2, 64, BF16, {"window": (30, 30)}),
    (18, 577, 577, 12, 12, 64, BF16, {}),
], ids=["vit_b16", "fp16_gqa_causal", "cross_key_padding_d48", "band", "vit_b16_384"])
def test_two_cta_tile_for_vit_class_key_sets(kernel, B, Sq, Sk, H, Hkv, D, dtype, kw):
    kw = dict(kw)
    inp = qkv(B, Sq, Sk, H, D, dtype, Hkv=Hkv)
    if kw.pop("key_padding", False):
        kpm = torch.ones(B, Sk, dtype=torch.bool, device="cuda")
        kpm[0, 100:] = False
        kpm[1, ::3] = False
        inp["key_padding_mask"] = kpm
    run_case(kernel, inp, kw)  # (every GPU: the shapes' numbers; the two-CTA tile itself is Hopper's)
    if hopper():
        names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"],
                                                     key_padding_mask=inp.get("key_padding_mask"), **kw))
        # (head dims 33-48 on the 48 instance: kernel_choice.h v3_head_dim); at 49-64 the ragged variant where
        # the keys end inside a 64-key block and no key padding is given
        if D > 48 and Sk % 64 != 0 and "key_padding_mask" not in inp:
            assert ran(names, "fwd_pipelined_kernel_sm90", "FwdPipeRaggedTraitsSm90<64, 64, 2, 2>"), sorted(names)
        else:
            assert ran(names, "fwd_pipelined_kernel_sm90", f"<{48 if D <= 48 else 64}, 64, 2, false, 2>"), \
                sorted(names)


# The two-CTA tile at head dims 65-96 (forced only: the 80 and 96 instances' 32-key blocks, for DiT / PixArt's 72 at
# 256-1024 tokens): DiT-shaped 256 and 1024 tokens, odd lengths, fp16 with GQA and a causal band, key padding (a vote
# per block), a sliding band, more tiles than its persistent grid, head dim 96 itself
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,D,dtype,kw", [
    (16, 256, 256, 16, 16, 72, BF16, {}), (2, 1024, 1024, 4, 4, 72, BF16, {}),
    (3, 257, 300, 4, 2, 72, FP16, {"causal": True}), (2, 300, 140, 4, 1, 80, BF16, {"key_padding": True}),
    (2, 70, 320, 2, 2, 96, BF16, {"window": (30, 30)}), (40, 197, 197, 12, 12, 72, BF16, {}),
], ids=["dit_256", "dit_1024", "fp16_gqa_causal", "key_padding_d80", "band_d96", "more_tiles_than_ctas"])
def test_two_cta_tile_at_head_dims_65_to_96(kernel, monkeypatch, B, Sq, Sk, H, Hkv, D, dtype, kw):
    inp, kw = padded_case(B, Sq, Sk, H, Hkv, D, dtype, kw, 40, 3)
    names = forced_kernels_run(kernel, monkeypatch, "fwd_v3_two_ctas", inp, kw)
    assert ran(names, "fwd_pipelined_kernel_sm90", f"<{80 if D <= 80 else 96}, 32, 2, false, 2>"), sorted(names)


# The two-CTA tile with the staged 16-bit term (fwd_v3_two_ctas on a call with a bias alone, head dim 64, forced
# only; fwd_v3_ragged: the same with its last key block cut to the sequence end): BEiT-shaped [1, H, 197, 197]
# learnable bias over a batch (bf16; fp32, recast before; fp16 with fp16 q), T5-shaped [1, H, 512, 512], a per-item
# [B, H, S, S] bias, GQA, a causal band, cross-attention to 140 keys
@pytest.mark.parametrize("force,traits", [
    ("fwd_v3_two_ctas", r"FwdPipeTraitsSm90<(\(int\))?64, (\(int\))?64, (\(int\))?2, false, (\(int\))?2>"),
    ("fwd_v3_ragged", r"FwdPipeRaggedTraitsSm90<(\(int\))?64, (\(int\))?64, (\(int\))?2, (\(int\))?2>"),
], ids=["two_ctas", "ragged"])
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,dtype,bias_shape,bias_dtype,kw", [
    (16, 197, 197, 12, 12, BF16, (1, 12, 197, 197), BF16, {}), (8, 197, 197, 4, 4, BF16, (1, 4, 197, 197), FP32, {}),
    (6, 197, 197, 4, 4, FP16, (1, 4, 197, 197), FP16, {}), (4, 512, 512, 4, 4, BF16, (1, 4, 512, 512), FP32, {}),
    (3, 300, 300, 4, 2, BF16, (3, 4, 300, 300), BF16, {}), (2, 257, 257, 4, 4, BF16, (1, 4, 257, 257), BF16,
                                                           {"causal": True}),
    (2, 300, 140, 4, 1, BF16, (1, 4, 300, 140), BF16, {}),
], ids=["beit_bf16", "beit_fp32", "beit_fp16", "t5_fp32", "per_item_gqa", "causal", "cross_sk140"])
def test_two_cta_tile_with_a_staged_term(kernel, monkeypatch, force, traits, B, Sq, Sk, H, Hkv, dtype, bias_shape,
                                         bias_dtype, kw):
    inp = qkv(B, Sq, Sk, H, 64, dtype, Hkv=Hkv)
    inp["bias"] = rand(*bias_shape, dtype=bias_dtype, grad=True)
    names = forced_kernels_run(kernel, monkeypatch, force, inp, kw)
    # (kTermsRawBias, kernel_modes.h; then the kernel's kDynamic)
    staged = re.compile(traits + r", (__nv_bfloat16|__half), (\(int\))?1, (\(bool\))?(false|0)>")
    assert any(staged.search(n) for n in names), sorted(names)


# The two-CTA tile with a ragged last key block (fwd_v3_ragged, forced only: the block a tile visits first computed
# over the 16-key steps up to the sequence end, 16 / 32 / 48 / 64 keys wide): ViT-B/16's 197 keys (16), EVA-02's 257
# and ViT-B/16-384's 577 (16, more tiles than the grid), 224 (32), 176 (48), 192 (a whole last block), one key, fp16
# with GQA and a causal band (each tile's first block the diagonal one, whole but for the last tile's), key padding
# (a vote per block) with an item whose keys are all hidden, a sliding band, cross-attention to 140 keys
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,dtype,kw", [
    (16, 197, 197, 12, 12, BF16, {}), (4, 257, 257, 12, 12, BF16, {}), (18, 577, 577, 12, 12, BF16, {}),
    (2, 224, 224, 4, 4, BF16, {}), (2, 176, 176, 4, 2, BF16, {}), (2, 192, 192, 4, 4, BF16, {}),
    (2, 33, 1, 2, 1, BF16, {}), (3, 257, 257, 4, 2, FP16, {"causal": True}),
    (3, 197, 197, 4, 4, BF16, {"key_padding": True}), (2, 389, 389, 2, 2, BF16, {"window": (100, 30)}),
    (2, 300, 140, 4, 1, BF16, {}),
], ids=["vit_b16", "eva02", "vit_b16_384", "tail32", "tail48", "whole_last_block", "one_key", "fp16_gqa_causal",
        "key_padding", "band", "cross_sk140"])
def test_ragged_last_key_block(kernel, monkeypatch, B, Sq, Sk, H, Hkv, dtype, kw):
    inp, kw = padded_case(B, Sq, Sk, H, Hkv, 64, dtype, kw, 40, 3)
    names = forced_kernels_run(kernel, monkeypatch, "fwd_v3_ragged", inp, kw)
    assert ran(names, "fwd_pipelined_kernel_sm90", "FwdPipeRaggedTraitsSm90<64, 64, 2, 2>"), sorted(names)


@pytest.mark.parametrize("D,Sq,Sk,H,Hkv,kw", [
    (64, 300, 77, 3, 3, {}), (40, 130, 80, 4, 2, {}), (64, 77, 77, 2, 2, {"causal": True}), (64, 5, 1, 2, 1, {}),
    (72, 257, 77, 3, 3, {}), (80, 64, 33, 2, 2, {"window": (10, 5)}), (96, 129, 80, 2, 1, {}),
    (64, 197, 197, 3, 3, {}), (48, 200, 208, 2, 1, {"causal": True}), (64, 333, 81, 2, 2, {}),
    (72, 300, 120, 2, 2, {"key_padding": True}), (96, 129, 128, 2, 1, {}), (64, 130, 129, 2, 2, {}),
    (64, 197, 150, 3, 3, {"key_padding": True}), (56, 197, 197, 2, 2, {"window": (64, 64)}),
], ids=lambda v: str(v) if not isinstance(v, dict) else "-".join(v) or "plain")
def test_short_key_sets_in_one_key_block(kernel, monkeypatch, D, Sq, Sk, H, Hkv, kw):
    # fwd_v3_short (kernel_choice.h: the table's choice up to 128 keys, forced here so that the 208-key tile runs
    # too): one key block of 80 or 128 keys (head dims <= 96) or 208 (<= 64) for the whole key set; odd lengths,
    # GQA, causal / sliding bands, key padding hiding a tail, a single key
    if not hopper():
        pytest.skip("fwd_v3_short is a Hopper kernel")
    monkeypatch.setenv("WINATTN_FORCE_KERNEL", "fwd_v3_short")
    kw = dict(kw)
    inp = qkv(2, Sq, Sk, H, D, Hkv=Hkv)
    if kw.pop("key_padding", False):
        kpm = torch.ones(2, Sk, dtype=torch.bool, device="cuda")
        kpm[0, 100:] = False
        kpm[1, ::3] = False
        inp["key_padding_mask"] = kpm
    run_case(kernel, inp, kw)
    block = 80 if Sk <= 80 else 128 if Sk <= 128 else 208
    names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"],
                                                 key_padding_mask=inp.get("key_padding_mask"), **kw))
    assert ran(names, "fwd_pipelined_kernel_sm90", f", {block}, 2, true,"), sorted(names)


def three_padded_items(Sk, tail, stride):
    """Key padding [3, Sk] of three items: every key hidden, the last `tail` hidden, every `stride`-th hidden."""
    kpm = torch.ones(3, Sk, dtype=torch.bool, device="cuda")
    kpm[0] = False
    kpm[1, Sk - tail:] = False
    kpm[2, ::stride] = False
    return kpm


def ran_terms(names, mode, head_dim=r"\d+", traits_rest=r"[^>]*"):
    """Whether a bf16 forward v3 kernel with 128-key blocks and score-term mode `mode` (kernel_modes.h) ran."""
    pattern = re.compile(rf"FwdPipeTraitsSm90<(\(int\))?{head_dim}, (\(int\))?128, {traits_rest}>, __nv_bfloat16, "
                         rf"(\(int\))?{mode}, (\(bool\))?(false|0)>")  # (then kDynamic)
    return any(pattern.search(n) for n in names)


# Key padding on 81-128 keys (PixArt's 120 T5 tokens), the table's choice (not forced): bits that the producer warp
# stages with each key block (kTermsRawRowPadded without a term, the 128-key tile). An item with every key
# hidden, a padded tail, holes; GQA; a causal and a sliding band on top; more 128-query tiles than SMs.
@pytest.mark.parametrize("D,Sk,H,Hkv,kw", [(72, 120, 4, 4, {}), (64, 97, 4, 2, {}), (64, 128, 2, 1, {"causal": True}),
                                          (72, 120, 2, 2, {"window": (30, 10)})],
                         ids=["d72_sk120", "d64_sk97_gqa", "d64_sk128_causal", "d72_sk120_band"])
def test_key_padding_on_short_key_sets_as_staged_bits(kernel, D, Sk, H, Hkv, kw):
    B = 3
    inp = qkv(B, 1300, Sk, H, D, Hkv=Hkv)
    inp["key_padding_mask"] = kpm = three_padded_items(Sk, 40, 5)
    run_case(kernel, inp, kw)
    if hopper():
        names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"], key_padding_mask=kpm, **kw))
        streamed_keys128 = r"(\(int\))?2, (\(bool\))?(true|1), (\(int\))?1"
        assert ran_terms(names, 7, traits_rest=streamed_keys128), sorted(names)


# Key padding alone on a longer key set (Qwen-Image-shaped text padding), the table's choice where the raw path would
# take the narrow tile: bits staged by the producer warp (kTermsRawRowPadded, narrow tile), not a vote per block.
@pytest.mark.parametrize("D,Sk,Hkv,kw", [(128, 1200, 4, {}), (64, 1500, 2, {"causal": True})],
                         ids=["d128_sk1200", "d64_sk1500_gqa_causal"])
def test_key_padding_on_long_key_sets_as_bits(kernel, D, Sk, Hkv, kw):
    B = 3
    inp = qkv(B, Sk, Sk, 4, D, Hkv=Hkv)
    inp["key_padding_mask"] = kpm = three_padded_items(Sk, 300, 9)
    run_case(kernel, inp, kw)
    if hopper():
        names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"], key_padding_mask=kpm, **kw))
        assert ran_terms(names, 7, head_dim=D), sorted(names)


def padded_case(B, Sq, Sk, H, Hkv, D, dtype, kw, tail, stride):
    """The case's q, k, v, with key padding three_padded_items(Sk, tail, stride) (its first B items) where kw asks for
    it ("key_padding", popped: the returned kw is what the calls take)."""
    kw = dict(kw)
    inp = qkv(B, Sq, Sk, H, D, dtype, Hkv=Hkv)
    if kw.pop("key_padding", False):
        inp["key_padding_mask"] = three_padded_items(Sk, tail, stride)[:B]
    return inp, kw


def forced_kernels_run(kernel, monkeypatch, force, inp, kw, backward=False):
    """forced_hopper_case, then the kernels its forward (and backward) launched."""
    call = forced_hopper_case(kernel, monkeypatch, force, inp, kw)
    return kernels_run(lambda: call().sum().backward() if backward else call())


def forced_hopper_case(kernel, monkeypatch, force, inp, kw):
    """inp's case under WINATTN_FORCE_KERNEL=force (a Hopper kernel: skipped elsewhere) by the accuracy rule, forward
    and backward; returns a call of its forward (for kernels_run)."""
    if not hopper():
        pytest.skip(f"{force} runs Hopper kernels only")
    monkeypatch.setenv("WINATTN_FORCE_KERNEL", force)
    # (deterministic goes to run_case's own argument: the reference and the same-dtype comparator do not take it)
    rest = {k: v for k, v in kw.items() if k != "deterministic"}
    run_case(kernel, inp, rest, deterministic=kw.get("deterministic"))
    return lambda: kernel.attention(inp["q"], inp["k"], inp["v"], bias=inp.get("bias"), mask=inp.get("mask"),
                                    key_padding_mask=inp.get("key_padding_mask"), **kw)


# The 192-row tile (fwd_v3_rows192: three consumer warpgroups, head dims <= 96; forced here for every path): last
# tiles of 5 / 8 / 17 rows, GQA, fp16, causal and sliding bands (one CTA per tile), key padding with an item whose keys
# are all hidden (the vote per key block), more tiles than its persistent grid (ViT-B/16-384-shaped), cross-attention
# to fewer keys than one block; at head dims 72 and 96 (the 96 instance, P through shared memory) DiT-shaped and the
# same paths; at 40 and 48 (the 48 instance, 16-column blocks) SD 1.5-shaped
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,D,dtype,kw", [
    (2, 197, 197, 6, 6, 64, BF16, {}), (2, 1000, 1000, 4, 2, 64, FP16, {"causal": True}),
    (3, 200, 333, 4, 1, 48, BF16, {"key_padding": True}), (2, 389, 900, 2, 2, 64, BF16, {"window": (100, 30)}),
    (4, 577, 577, 12, 12, 64, BF16, {}), (2, 593, 77, 3, 3, 64, BF16, {}),
    (2, 1024, 1024, 16, 16, 72, BF16, {}), (2, 1000, 1000, 4, 2, 96, FP16, {"causal": True}),
    (3, 200, 333, 4, 1, 72, BF16, {"key_padding": True}), (2, 389, 900, 2, 2, 80, BF16, {"window": (100, 30)}),
    (2, 1024, 1024, 8, 8, 40, BF16, {}), (2, 700, 700, 4, 2, 48, FP16, {"causal": True}),
], ids=["s197", "fp16_gqa_causal", "key_padding_d48", "band", "more_tiles_than_ctas", "cross_sk77",
        "dit_d72", "fp16_gqa_causal_d96", "key_padding_d72", "band_d80", "sd15_d40", "fp16_gqa_causal_d48"])
def test_192_row_tile(kernel, monkeypatch, B, Sq, Sk, H, Hkv, D, dtype, kw):
    inp, kw = padded_case(B, Sq, Sk, H, Hkv, D, dtype, kw, 100, 3)
    names = forced_kernels_run(kernel, monkeypatch, "fwd_v3_rows192", inp, kw)
    assert ran(names, "fwd_pipelined_kernel_sm90", "FwdPipeRows192TraitsSm90<"), sorted(names)


# The 192-row tile's last query tile of a head where one or two of its consumer warpgroups have no row below Sq
# (they compute padding rows that the epilogue does not store; skipping their GEMMs in a branch was slower, RESULTS
# v5.10): one live row (577 = 3 x 192 + 1), 64 (1024), 128 (320), none idle (1100); persistent with more tiles than
# CTAs (a CTA's next tile after an idle one, its stage and turn phases) and one CTA per tile; at 64, 72 (the 80
# instance) and 40 (48), GQA, fp16
@pytest.mark.parametrize("schedule", ["fwd_v3_persistent", "fwd_v3_per_tile"])
@pytest.mark.parametrize("B,S,H,Hkv,D,dtype", [
    (4, 577, 12, 12, 64, BF16), (3, 1024, 16, 4, 72, BF16), (6, 320, 8, 8, 40, FP16), (2, 1100, 8, 2, 72, BF16),
], ids=["one_live_row_d64", "64_live_rows_gqa_d72", "128_live_rows_fp16_d40", "none_idle_d72"])
def test_192_row_tile_with_idle_warpgroups(kernel, monkeypatch, schedule, B, S, H, Hkv, D, dtype):
    inp = qkv(B, S, S, H, D, dtype, Hkv=Hkv)
    names = forced_kernels_run(kernel, monkeypatch, f"fwd_v3_rows192,{schedule}", inp, {})
    assert ran(names, "fwd_pipelined_kernel_sm90", "FwdPipeRows192TraitsSm90<"), sorted(names)


# Forward v3's instances at head dims 48 (16-column blocks) and 80 (96's tiles, GEMMs over 80) and the backward's at 96
# (16-column blocks; fwd_v3_fine_dims, bwd_v3_fine_dims, forced here, the table's too: SD 1.5's 40, DiT's and PixArt's
# 72 run there instead of at 64 / 96 / 128): every tile and term path they have, against the reference (the backward
# at head dims 72 and 80). The raw path's narrow tile (GQA), causal and sliding bands, the short key blocks (77
# tokens; 120 with key padding as staged bits, an item whose keys are all hidden), the two-CTA tile (197 keys at 48),
# the staged bias tile, a float row term, a bool mask per score as bits; in the backward also GQA with key padding and
# a bias gradient, and deterministic mode with the 16-bit dbias store (Sk % 8 == 0).
@pytest.mark.parametrize("D,Sq,Sk,H,Hkv,dtype,kw,term", [
    (40, 600, 600, 4, 2, BF16, {}, None), (72, 300, 257, 3, 3, FP16, {"causal": True}, None),
    (72, 1000, 1000, 2, 2, BF16, {"window": (100, 20)}, None), (72, 500, 77, 2, 2, BF16, {}, None),
    (40, 300, 120, 2, 1, BF16, {"key_padding": True}, None), (40, 197, 197, 3, 3, BF16, {}, None),
    (72, 300, 300, 2, 2, BF16, {}, "bias"), (80, 200, 333, 2, 2, BF16, {}, "row"),
    (48, 250, 333, 4, 4, BF16, {}, "mask"), (80, 250, 300, 4, 2, BF16, {"key_padding": True}, "bias"),
    (72, 260, 264, 4, 2, BF16, {"deterministic": True}, "bias per item"),
], ids=["d40_gqa", "d72_fp16_causal", "d72_band", "d72_sk77", "d40_sk120_key_padding", "d40_two_ctas", "d72_bias",
        "d80_row_term", "d48_mask_bits", "d80_gqa_key_padding_bias", "d72_gqa_deterministic_bias16"])
def test_instances_at_head_dims_48_and_80(kernel, monkeypatch, D, Sq, Sk, H, Hkv, dtype, kw, term):
    fine_bwd = 64 < D <= 96
    B = 3
    inp, kw = padded_case(B, Sq, Sk, H, Hkv, D, dtype, kw, 40, 5)
    if term == "bias":
        inp["bias"] = rand(1, H, Sq, Sk, dtype=dtype, grad=True)
    elif term == "bias per item":  # (one contributor per dbias element: deterministic v3 takes it)
        inp["bias"] = rand(B, H, Sq, Sk, dtype=dtype, grad=True)
    elif term == "row":
        inp["bias"] = torch.where(torch.rand(B, 1, 1, Sk, device="cuda") > 0.2, 0.0, float("-inf")).to(dtype)
    elif term == "mask":
        inp["mask"] = torch.rand(B, H, Sq, Sk, device="cuda") > 0.3
    call = forced_hopper_case(kernel, monkeypatch, "fwd_v3_fine_dims" + (",bwd_v3_fine_dims" if fine_bwd else ""),
                              inp, kw)
    names = kernels_run(call)
    assert ran(names, "fwd_pipelined_kernel_sm90", f"FwdPipeTraitsSm90<{48 if D <= 48 else 80}, "), sorted(names)
    if fine_bwd:
        names = kernels_run(lambda: call().sum().backward())
        # (one key block of at most 128 keys: dQ stored directly, bwd_v3_dq_direct, the table's there)
        bwd = "bwd_dq_direct_kernel_sm90" if Sk <= 128 and "window" not in kw and "causal" not in kw \
            else "bwd_pipelined_kernel_sm90"
        assert ran(names, bwd, "BwdPipeTraitsSm90<96, "), sorted(names)


# dQ stored by the backward kernel itself where each dQ tile has one contributor (bwd_v3_dq_direct, forced only: one
# key block, no band): no fp32 accumulator, no memset of it, no conversion pass. Cross-attention to 77 / 120 / 128
# keys at head dims 40-128 with query counts that end mid-tile, GQA, fp16, key padding with an item whose keys are all
# hidden (that key block is walked, not skipped: its dQ of 0 is stored), deterministic mode, a float row term with
# -inf, a bool mask per score as bits with fully masked rows; a staged bias is refused (its kernels lack the store).
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,D,dtype,kw,term", [
    (3, 593, 77, 4, 4, 64, BF16, {}, None), (2, 300, 77, 4, 4, 40, FP16, {}, None),
    (3, 257, 120, 4, 2, 72, BF16, {"key_padding": True}, None), (2, 200, 128, 4, 2, 128, BF16, {}, None),
    (2, 129, 100, 2, 2, 64, BF16, {"deterministic": True}, None), (2, 300, 77, 2, 2, 64, BF16, {}, "row"),
    (2, 190, 96, 4, 4, 64, BF16, {}, "mask"), (3, 70, 128, 2, 2, 96, FP16, {"key_padding": True}, "row"),
], ids=["sk77_d64", "sk77_d40_fp16", "sk120_d72_gqa_key_padding", "sk128_d128_gqa", "deterministic", "row_term",
        "mask_bits_hidden_rows", "d96_fp16_row_term_key_padding"])
def test_direct_dq_for_one_key_block(kernel, monkeypatch, B, Sq, Sk, H, Hkv, D, dtype, kw, term):
    inp, kw = padded_case(B, Sq, Sk, H, Hkv, D, dtype, kw, 40, 5)
    if term == "row":
        inp["bias"] = torch.where(torch.rand(B, 1, 1, Sk, device="cuda") > 0.2, 0.0, float("-inf")).to(dtype)
    elif term == "mask":
        mask = torch.rand(B, H, Sq, Sk, device="cuda") > 0.3
        mask[:, :, 5:9] = False  # (rows that see no key: dQ 0)
        inp["mask"] = mask
    names = forced_kernels_run(kernel, monkeypatch, "bwd_v3_dq_direct", inp, kw, backward=True)
    assert ran(names, "bwd_dq_direct_kernel_sm90") and not ran(names, "dq_frag_convert_kernel"), sorted(names)


# dQ resident in shared memory (bwd_v3_dq_resident, forced only): one CTA per (batch, KV head) walks every key block
# with the group's dQ summed on chip, no accumulator in global memory. ViT's 197 tokens (two key blocks, the second
# of 69 keys), EVA's 257 (three) in fp16, GQA (a group of two heads' dQ), causal and sliding bands (key blocks that
# see few query blocks), key padding with an item whose keys are all hidden, deterministic mode, head dim 72 on the
# 96 instance, one key block.
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,D,dtype,kw", [
    (4, 197, 197, 6, 6, 64, BF16, {}), (2, 257, 257, 4, 4, 64, FP16, {}), (2, 64, 300, 4, 2, 64, BF16, {}),
    (2, 200, 200, 2, 2, 64, BF16, {"causal": True}), (2, 260, 260, 2, 2, 64, BF16, {"window": (50, 10)}),
    (3, 150, 300, 2, 2, 64, BF16, {"key_padding": True}), (2, 197, 197, 2, 2, 64, BF16, {"deterministic": True}),
    (2, 100, 300, 2, 2, 72, BF16, {}), (2, 197, 77, 4, 4, 40, BF16, {}),
], ids=["vit_s197", "eva_s257_fp16", "gqa", "causal", "band", "key_padding", "deterministic", "d72", "one_key_block"])
def test_resident_dq_for_short_sequences(kernel, monkeypatch, B, Sq, Sk, H, Hkv, D, dtype, kw):
    inp, kw = padded_case(B, Sq, Sk, H, Hkv, D, dtype, kw, 100, 7)
    names = forced_kernels_run(kernel, monkeypatch, "bwd_v3_dq_resident", inp, kw, backward=True)
    assert ran(names, "bwd_dq_resident_kernel_sm90") and not ran(names, "dq_frag_convert_kernel"), sorted(names)


# 128 queries per backward step at head dim 64 (bwd_v3_q128; the table's from 512 queries): dQ by query halves into
# the 64-row accumulator tiles, query counts ending mid-block (and below one block), GQA, causal and sliding bands, key
# padding with an item whose keys are all hidden, head dim 40 on the 64 instance, fp16, one query.
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,D,dtype,kw", [
    (2, 1000, 1000, 4, 4, 64, BF16, {}), (2, 700, 900, 8, 2, 64, BF16, {}),
    (2, 640, 640, 4, 4, 64, FP16, {"causal": True}), (3, 500, 700, 4, 2, 64, BF16, {"window": (120, 40)}),
    (3, 333, 600, 2, 2, 64, BF16, {"key_padding": True}), (2, 257, 300, 6, 3, 40, FP16, {}),
    (1, 100, 2000, 2, 2, 64, BF16, {}), (2, 1, 300, 4, 4, 48, BF16, {}),
], ids=["d64", "gqa", "fp16_causal", "gqa_band", "key_padding", "d40_fp16_gqa", "one_block", "one_query"])
def test_128_query_steps_at_head_dim_64(kernel, monkeypatch, B, Sq, Sk, H, Hkv, D, dtype, kw):
    inp, kw = padded_case(B, Sq, Sk, H, Hkv, D, dtype, kw, 100, 11)
    names = forced_kernels_run(kernel, monkeypatch, "bwd_v3_q128", inp, kw, backward=True)
    q128 = re.compile(r"bwd_pipelined_kernel_sm90<[^<]*BwdPipeTraitsSm90<(\(int\))?64, (\(int\))?2, (\(int\))?128>")
    assert any(q128.search(n) for n in names), sorted(names)


# ... and with dQ stored directly (one key block of at most 128 keys, no band: bwd_v3_q128 takes the direct store
# there, the table's from 512 queries): cross-attention to 77 / 100 / 120 keys, queries ending mid-block, GQA, fp16 at
# head dim 40, deterministic mode (one contributor per dQ element), key padding with an item whose keys are all hidden.
@pytest.mark.parametrize("B,Sq,Sk,H,Hkv,D,dtype,kw", [
    (3, 593, 77, 4, 4, 64, BF16, {}), (2, 300, 77, 4, 4, 40, FP16, {}),
    (2, 129, 100, 2, 2, 64, BF16, {"deterministic": True}), (3, 700, 120, 4, 2, 64, BF16, {"key_padding": True}),
], ids=["sk77", "d40_fp16", "deterministic", "gqa_key_padding"])
def test_128_query_steps_with_direct_dq(kernel, monkeypatch, B, Sq, Sk, H, Hkv, D, dtype, kw):
    inp, kw = padded_case(B, Sq, Sk, H, Hkv, D, dtype, kw, 40, 13)
    names = forced_kernels_run(kernel, monkeypatch, "bwd_v3_q128", inp, kw, backward=True)
    q128 = re.compile(r"bwd_dq_direct_kernel_sm90<[^<]*BwdPipeTraitsSm90<(\(int\))?64, (\(int\))?2, (\(int\))?128>")
    assert any(q128.search(n) for n in names) and not ran(names, "dq_frag_convert_kernel"), sorted(names)


# Key padding beside a staged bias tile (T5-shaped: a [1, H, S, S] position bias on a padded batch), the table's choice
# at D <= 64: the row warp stages the padding as bits with each key block (kTermsRawBiasPadded). An item with every
# key hidden, a padded tail, holes; a ragged key count, GQA, a causal band; bias gradients. (A NaN key that the
# padding hides: test_input_bounds.py test_nan_gives_nan_rows_like_the_reference, which takes this path too.)
@pytest.mark.parametrize("D,Sq,Sk,H,Hkv,kw", [(64, 512, 512, 4, 4, {}), (64, 300, 333, 4, 2, {}),
                                              (32, 260, 260, 2, 2, {"causal": True})],
                         ids=["d64_s512", "d64_sk333_gqa", "d32_causal"])
def test_key_padding_beside_a_staged_bias_as_bits(kernel, D, Sq, Sk, H, Hkv, kw):
    B = 3
    inp = qkv(B, Sq, Sk, H, D, Hkv=Hkv)
    inp["bias"] = rand(1, H, Sq, Sk, dtype=BF16, grad=True)
    inp["key_padding_mask"] = kpm = three_padded_items(Sk, 45, 7)
    run_case(kernel, inp, kw)
    if hopper():
        names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"], bias=inp["bias"],
                                                     key_padding_mask=kpm, **kw))
        assert ran_terms(names, 6, head_dim=D), sorted(names)


@pytest.mark.parametrize("D,Sk,kw", [(64, 77, {}), (72, 80, {"causal": True}), (64, 197, {"window": (40, 40)}),
                                      (48, 150, {"key_padding": True})],
                         ids=["d64_sk77", "d72_sk80_causal", "d64_sk197_band", "d48_sk150_key_padding"])
def test_short_key_blocks_pipeline_across_tiles(kernel, monkeypatch, D, Sk, kw):
    # More 128-query tiles than SMs (6 x 4 x 9 = 216), so each persistent CTA carries one tile's P V into the next
    # tile's Q K^T (consume_stream); with the band most tiles see no key and sit between tiles that do.
    if not hopper():
        pytest.skip("fwd_v3_short is a Hopper kernel")
    monkeypatch.setenv("WINATTN_FORCE_KERNEL", "fwd_v3_short")
    kw = dict(kw)
    inp = qkv(6, 1100, Sk, 4, D, Hkv=2)
    if kw.pop("key_padding", False):
        kpm = torch.rand(6, Sk, device="cuda") > 0.3
        kpm[2] = False  # an item whose every key is hidden
        inp["key_padding_mask"] = kpm
    run_case(kernel, inp, kw)
    names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"],
                                                 key_padding_mask=inp.get("key_padding_mask"), **kw))
    block = 80 if Sk <= 80 else 128 if Sk <= 128 else 208
    assert ran(names, "fwd_pipelined_kernel_sm90", f", {block}, 2, true,"), sorted(names)


@pytest.mark.parametrize("D,B,H,Hkv,Sq,Sk,kw", [
    (72, 32, 4, 4, 256, 256, {}),                                            # DiT: 2 key blocks, 256 tiles
    (64, 4, 8, 2, 1000, 1000, {"causal": True}),                             # 1 .. 8 key blocks per tile
    (128, 6, 4, 4, 1100, 256, {"window": (40, 40)}),                         # empty tiles between the others
    (80, 4, 6, 2, 600, 700, {"key_padding": True}),                          # GQA, key padding, ragged ends
], ids=["dit_d72", "causal_gqa_d64", "band_empty_tiles_d128", "key_padding_d80"])
def test_streamed_tiles_across_tile_boundaries(kernel, monkeypatch, D, B, H, Hkv, Sq, Sk, kw):
    # fwd_v3_stream (forced only: slower than the narrow tile, RESULTS v3.9): 128-key blocks, the consumers' loop
    # pipelined across tile boundaries (consume_stream: a tile's last P V issued with the next tile's first Q K^T,
    # the running softmax restarted, the finished tile's epilogue after); persistent, so each CTA walks tiles of
    # different lengths
    if not hopper():
        pytest.skip("fwd_v3_stream is a Hopper kernel")
    monkeypatch.setenv("WINATTN_FORCE_KERNEL", "fwd_v3_stream,fwd_v3_persistent")
    kw = dict(kw)
    inp = qkv(B, Sq, Sk, H, D, Hkv=Hkv)
    if kw.pop("key_padding", False):
        kpm = torch.rand(B, Sk, device="cuda") > 0.2
        kpm[1, 300:] = False
        inp["key_padding_mask"] = kpm
    run_case(kernel, inp, kw)
    names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"],
                                                 key_padding_mask=inp.get("key_padding_mask"), **kw))
    assert ran(names, "fwd_pipelined_kernel_sm90", ", 128, 2, true,"), sorted(names)


@pytest.mark.parametrize("D,B,H,Hkv,Sq,Sk,dtype", [
    (72, 40, 12, 4, 300, 256, BF16),    # GQA; 480 heads of 3 query tiles: full rounds of the grid, then a partial one
    (128, 20, 8, 8, 257, 129, FP16),    # a ragged last query tile and a 1-key second block
    (96, 64, 4, 4, 256, 200, BF16),     # DiT-shaped: 2 query tiles, 2 key blocks
], ids=["gqa_partial_round_d72", "ragged_fp16_d128", "dit_d96"])
def test_kv_resident_across_a_heads_query_tiles(kernel, D, B, H, Hkv, Sq, Sk, dtype):
    # The table's streamed tile on 129-256 keys (FwdPipeParams::kv_reuse): each CTA walks one head's query tiles in
    # turn and its producer hands the K / V stages over again without loading them; poisoned outputs (run_case)
    # catch a tile computed on another head's K / V or left unwritten
    inp = qkv(B, Sq, Sk, H, D, dtype, Hkv=Hkv)
    run_case(kernel, inp, {})
    if hopper():
        names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"]))
        assert ran(names, "fwd_pipelined_kernel_sm90", ", 128, 2, true,"), sorted(names)


@pytest.mark.parametrize("D,B,H,Hkv,Sq,Sk,kw,force", [
    (128, 2, 8, 2, 2000, 2000, {"causal": True}, None),                     # the table's for band calls; ragged end
    (64, 3, 6, 3, 1500, 1700, {"window": (300, 0)}, None),                  # sliding window, Sq != Sk
    (256, 3, 6, 6, 1100, 1100, {"causal": True}, None),                     # head dim 256's 64-key blocks
    (64, 3, 8, 8, 1000, 1000, {}, "fwd_v3_dynamic"),                        # forced on a call without a band
], ids=["causal_gqa_d128", "window_d64", "causal_d256", "forced_dense_d64"])
def test_dynamic_schedule(kernel, monkeypatch, D, B, H, Hkv, Sq, Sk, kw, force):
    # The v3 forward's dynamic schedule (fwd_pipelined_sm90.h: each CTA's producer takes its next tile from a counter
    # in the workspace, zeroed by a memset, and posts it to the consumers): more tiles than SMs, of different lengths,
    # so CTAs take several each in an order no test fixes; poisoned outputs (run_case) catch a tile left unwritten or
    # written twice by different CTAs
    if not hopper():
        pytest.skip("the v3 forward is a Hopper kernel")
    if force:
        monkeypatch.setenv("WINATTN_FORCE_KERNEL", force)
    inp = qkv(B, Sq, Sk, H, D, Hkv=Hkv)
    run_case(kernel, inp, kw)
    with torch.no_grad():
        names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"], **kw))
    assert ran(names, "fwd_pipelined_kernel_sm90") and ran(names, "Memset"), sorted(names)


@pytest.mark.parametrize("case", ["bias", "empty_tiles"])
def test_band_calls_the_dynamic_schedule_does_not_take(kernel, case):
    # one CTA per tile, as before v5.6: a band call with a bias (the dynamic schedule has instances of the no-term
    # path only: launch_sm90.h has_dynamic), and a causal call with more queries than keys (aligned at the end), whose
    # first query tiles see no key (the consumers learn that no tile follows from the next index: kernel_choice.h
    # no_empty_tiles); the empty rows come out 0 with lse = -inf
    if not hopper():
        pytest.skip("the v3 forward is a Hopper kernel")
    inp = qkv(2, 1100, 1100, 5, 96) if case == "bias" else qkv(2, 700, 300, 4, 64)
    if case == "bias":
        inp["bias"] = rand(2, 5, 1100, 1100, dtype=FP32)
    run_case(kernel, inp, {"causal": True})
    with torch.no_grad():
        names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"], bias=inp.get("bias"), causal=True))
    assert ran(names, "fwd_pipelined_kernel_sm90") and not ran(names, "Memset"), sorted(names)


@pytest.mark.parametrize("term", ["float [B,1,1,Sk] -inf", "float [1,H,1,Sk] fp32", "bool [1,1,Sq,Sk]",
                                  "bool [B,H,Sq,Sk]", "bool [1,H,1,Sk]"])
@pytest.mark.parametrize("D,Sk", [(64, 77), (72, 120), (64, 128)])
def test_short_key_blocks_with_a_row_term_or_mask_bits(kernel, monkeypatch, term, D, Sk):
    # fwd_v3_short's 128-key tile also takes a term broadcast over the queries (kTermsRawRow) and a bool mask as bits
    # (kTermsRawBits), each loaded for the next tile while the GEMMs run; more tiles than SMs (6 x 4 x 9), rows with
    # every key hidden
    if not hopper():
        pytest.skip("fwd_v3_short is a Hopper kernel")
    monkeypatch.setenv("WINATTN_FORCE_KERNEL", "fwd_v3_short")
    B, H, Sq = 6, 4, 1100
    inp = qkv(B, Sq, Sk, H, D, Hkv=2)
    if term.startswith("float"):
        shape = (B, 1, 1, Sk) if "[B,1,1,Sk]" in term else (1, H, 1, Sk)
        keep = torch.rand(shape, device="cuda") > 0.3
        keep[0] = False  # (item 0: every key hidden)
        if "-inf" in term:
            inp["bias"] = torch.zeros(shape, device="cuda", dtype=BF16).masked_fill(~keep, float("-inf"))
        else:
            inp["bias"] = torch.randn(shape, device="cuda", dtype=FP32)
    else:
        shape = {"bool [1,1,Sq,Sk]": (1, 1, Sq, Sk), "bool [B,H,Sq,Sk]": (B, H, Sq, Sk),
                 "bool [1,H,1,Sk]": (1, H, 1, Sk)}[term]
        inp["mask"] = torch.rand(shape, device="cuda") > 0.3
        inp["mask"][..., 0] = True
        if shape[2] == Sq:
            inp["mask"][0, 0, 17] = False  # a query row with every key hidden
    run_case(kernel, inp, {})
    names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"], bias=inp.get("bias"),
                                                 mask=inp.get("mask")))
    assert ran(names, "fwd_pipelined_kernel_sm90", ", 128, 2, true,"), sorted(names)


@pytest.mark.parametrize("how", ["bwd_v3_bits", "bwd_v3_fold"])
@pytest.mark.parametrize("mshape", [(2, 3, 250, 333), (1, 3, 250, 333), (2, 1, 250, 333), (1, 1, 250, 333)],
                         ids=["bhqk", "1hqk", "b1qk", "11qk"])
@pytest.mark.parametrize("D,H,Hkv,kw", [(64, 3, 3, {}), (128, 4, 2, {"causal": True}), (40, 2, 2, {"kp": True}),
                                        (96, 4, 1, {"window": (100, 30)})],
                         ids=["d64", "d128_gqa_causal", "d40_key_padding", "d96_gqa_window"])
def test_bool_mask_per_score_backward_as_bits(kernel, monkeypatch, how, mshape, D, H, Hkv, kw):
    # bwd_v3_bits (kernel_choice.h, the table's choice): the backward reads the mask as transposed bits (a key's
    # row of query bits, two words per key and 64-query block); bwd_v3_fold folds it into a -inf term instead (the
    # A/B path). Rows with every key hidden, key padding, the band and the sequence ends (Sq = 250, Sk = 333:
    # partial words and blocks)
    if not hopper():
        pytest.skip("bwd_v3_bits is a Hopper kernel")
    monkeypatch.setenv("WINATTN_FORCE_KERNEL", how)
    kw = dict(kw)
    B, Sq, Sk = 2, 250, 333
    mask = torch.rand(mshape[0], H if mshape[1] > 1 else 1, *mshape[2:], device="cuda") > 0.3
    mask[..., 0] = True
    mask[..., 249, :] = True  # (the band leaves the last rows their own keys)
    mask[0, 0, 17] = False  # a query row with every key hidden
    mask[..., 5:9, 300] = False  # (a column hidden for some rows: a key's bits differ within a word)
    inp = qkv(B, Sq, Sk, H, D, Hkv=Hkv)
    inp["mask"] = mask
    if kw.pop("kp", False):
        kpm = torch.ones(B, Sk, dtype=torch.bool, device="cuda")
        kpm[1, 200:] = False
        inp["key_padding_mask"] = kpm
    run_case(kernel, inp, kw)
    names = kernels_run(lambda: torch.autograd.grad(
        kernel.attention(inp["q"], inp["k"], inp["v"], mask=mask, key_padding_mask=inp.get("key_padding_mask"),
                         **kw).sum(), [inp["q"], inp["k"], inp["v"]]))
    if how == "bwd_v3_bits":
        assert ran(names, "bwd_pipelined_kernel_sm90") and not ran(names, "combine_terms_kernel"), sorted(names)
        assert sum("mask_bits_kernel" in n for n in names) == 2, sorted(names)  # (forward's, backward's transposed)
    else:  # the fold: a -inf term prepared for the backward, bits for the forward
        assert ran(names, "bwd_pipelined_kernel_sm90") and ran(names, "combine_terms_kernel"), sorted(names)
        assert sum("mask_bits_kernel" in n for n in names) == 1, sorted(names)


@pytest.mark.parametrize("layout", ["rows_of_4_bytes", "odd_row_stride"])
def test_backward_mask_bits_four_keys_per_thread(kernel, layout):
    # The backward's transposed bits read four keys per thread where every mask row is contiguous and 4-byte
    # aligned with Sk % 4 == 0 (mask_bits_transposed4_kernel); a mask viewed out of a wider tensor (row stride 337)
    # takes the byte-wise kernel. Both against the reference: partial query words (Sq = 250), a row with every key
    # hidden, GQA.
    B, Sq, Sk, H = 2, 250, 336, 4
    wide = torch.rand(B, H, Sq, Sk + 1, device="cuda") > 0.3
    mask = wide[..., :Sk].contiguous() if layout == "rows_of_4_bytes" else wide[..., :Sk]
    mask[..., 0] = True
    mask[1, 2, 40] = False
    inp = qkv(B, Sq, Sk, H, 64, Hkv=2)
    inp["mask"] = mask
    run_case(kernel, inp, {})
    if hopper():
        names = kernels_run(lambda: torch.autograd.grad(
            kernel.attention(inp["q"], inp["k"], inp["v"], mask=mask).sum(), [inp["q"], inp["k"], inp["v"]]))
        assert ran(names, "mask_bits_transposed4_kernel") == (layout == "rows_of_4_bytes"), sorted(names)


def test_bool_key_mask_with_key_padding_stays_a_mask(kernel):
    inp = qkv(2, 200, 200, 2, 64)
    inp["mask"] = torch.rand(2, 1, 1, 200, device="cuda") > 0.3
    kpm = torch.ones(2, 200, dtype=torch.bool, device="cuda")
    kpm[0, 150:] = False
    inp["key_padding_mask"] = kpm
    run_case(kernel, inp, {})


@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_table_term_outside_window_shapes(kernel, dtype):
    # head dim 64 and N = 197: not a window-kernel shape; the table term is gathered in the input dtype for v3 (the
    # forward; with the table's gradient the backward is v1's ordered reduction)
    W = 14
    N = 197
    B, H = 4, 3
    idx = torch.zeros(N, N, dtype=torch.long, device="cuda")
    idx[1:, 1:] = swin_relative_index(W, "cuda")
    idx[0, :] = (2 * W - 1) ** 2  # BEiT's cls-token rows / columns: three extra table rows
    idx[:, 0] = (2 * W - 1) ** 2 + 1
    idx[0, 0] = (2 * W - 1) ** 2 + 2
    inp = qkv(B, N, N, H, 64, dtype)
    inp["rel_pos_table"] = rand((2 * W - 1) ** 2 + 3, H, dtype=FP32, grad=True)
    inp["rel_pos_index"] = idx
    run_case(kernel, inp, {}, swin=True)
