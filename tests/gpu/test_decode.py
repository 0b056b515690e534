"""The split-KV decode forward (kernel-src/cuda/fwd_decode.h), marked `gpu`: calls with at most 16 query rows per KV
head (H / Hkv x Sq) run it on every architecture. Each case runs the FlashAttention accuracy rule against the
float64 reference (the backward, on v3 / v1, takes the decode forward's lse, so its gradients check lse too) and
checks which kernels ran: one split writes the output itself, several go through the combine step.
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


@pytest.mark.parametrize("Sk", [1, 77, 1000, 4097])
@pytest.mark.parametrize("D,dtype", [(128, BF16), (64, FP16), (40, BF16), (96, FP16), (256, BF16)])
def test_decode_gqa_matches_the_reference(kernel, Sk, D, dtype):
    # Llama-shaped: one query per sequence, 4 query heads per KV head (4 rows per CTA)
    inp = qkv(3, 1, Sk, 8, D, dtype, Hkv=2)
    run_case(kernel, inp, {})
    names = kernels_run(lambda: kernel.attention(inp["q"], inp["k"], inp["v"]))
    assert ran(names, "fwd_decode_kernel"), sorted(names)
    # B x Hkv = 6 CTAs per split: more than one split as soon as there are two 128-key steps
    assert ran(names, "decode_combine_kernel") == (Sk > 128), sorted(names)


@pytest.mark.parametrize("Sq,H,Hkv", [(1, 4, 4), (2, 8, 2), (8, 3, 3), (3, 6, 3), (4, 32, 8), (16, 2, 2)])
def test_decode_row_counts(kernel, Sq, H, Hkv):
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
    assert not ran(names, "fwd_decode_kernel"), sorted(names)


def test_decode_with_every_score_term(kernel):
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


def test_decode_float_key_mask_and_strided_inputs(kernel):
    # what a generation loop passes: q sliced out of a fused projection, an additive [B, 1, 1, Sk] mask with -inf
    B, Sk, H, D = 2, 1500, 8, 128
    fused = rand(B, 1, 3 * H, D, dtype=BF16)
    q = fused[:, :, H:2 * H].detach().requires_grad_(True)
    k, v = rand(B, Sk, 2, D, dtype=BF16, grad=True), rand(B, Sk, 2, D, dtype=BF16, grad=True)
    m = torch.zeros(B, 1, 1, Sk, device="cuda", dtype=BF16)
    m[0, ..., 1000:] = float("-inf")
    run_case(kernel, dict(q=q, k=k, v=v, bias=m), {})


def test_nan_in_q_reaches_only_its_row(kernel):
    # README: a NaN in q gives NaN out and lse in every row it reaches, and only there
    inp = qkv(2, 1, 3000, 8, 64, Hkv=2, grad=False)
    q = inp["q"].clone()
    q[1, 0, 5, 3] = float("nan")
    out, lse = kernel.attention(q, inp["k"], inp["v"], return_lse=True)
    assert torch.isnan(out[1, 0, 5]).all() and torch.isnan(lse[1, 5, 0])
    keep = torch.ones_like(lse, dtype=torch.bool)
    keep[1, 5, 0] = False
    assert torch.isfinite(lse[keep]).all() and torch.isfinite(out[0]).all() and torch.isfinite(out[1, 0, :5]).all()


def test_forcing_decode_on_a_long_query_is_refused(kernel, monkeypatch):
    monkeypatch.setenv("WINATTN_FORCE_KERNEL", "fwd_decode")
    inp = qkv(1, 64, 64, 2, 64, grad=False)
    with pytest.raises(Exception, match="fwd_decode: this call cannot run it \\(more than 16 query rows"):
        kernel.attention(inp["q"], inp["k"], inp["v"])
