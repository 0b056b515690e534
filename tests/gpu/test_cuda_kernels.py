"""CUDA-specific correctness tests of the window-attention kernels (marked `gpu`, skipped without a GPU).

Every case draws fresh random inputs, poisons the caching allocator with NaNs before the kernel runs, and checks
out / dq / dk / dv by the FlashAttention rule and dbias / dtable by relative L2 (see _helpers.py).
"""

import pytest
import torch

from ._helpers import assert_fa_close, assert_rel_l2, poison, rand, run_case

pytestmark = pytest.mark.gpu

BF16, FP16 = torch.bfloat16, torch.float16


def qkv(B, Sq, Sk, H, D, dtype, Hkv=None, grad=True):
    Hkv = Hkv or H
    return dict(q=rand(B, Sq, H, D, dtype=dtype, grad=grad), k=rand(B, Sk, Hkv, D, dtype=dtype, grad=grad),
                v=rand(B, Sk, Hkv, D, dtype=dtype, grad=grad))


# ---- head dims (all instantiated kernels and rounded-up ones), dense bias with gradient ----------------------
@pytest.mark.parametrize("D", [32, 40, 64, 72, 80, 96, 128, 160, 192, 256])
@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_head_dims_dense_bias(kernel, D, dtype):
    B, S, H = 2, 197, 3
    inp = qkv(B, S, S, H, D, dtype)
    inp["bias"] = rand(1, H, S, S, dtype=dtype, grad=True)
    run_case(kernel, inp, {})


@pytest.mark.parametrize("D", [32, 64, 128])
def test_no_bias_multi_block(kernel, D):
    inp = qkv(2, 300, 520, 4, D, BF16)
    run_case(kernel, inp, {})


# ---- every bias broadcast pattern (and dtypes / strides), deterministic and not -----------------------------
BIAS_SHAPES = [
    (2, 3, 150, 170), (1, 3, 150, 170), (2, 1, 150, 170), (1, 1, 150, 170), (150, 170), (2, 3, 1, 170),
    (1, 1, 1, 170), (170,), (2, 1, 150, 1), (3, 150, 1), (2, 3, 1, 1), (1, 1, 1, 1),
]


@pytest.mark.parametrize("shape", BIAS_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("det", [False, True])
def test_bias_broadcast(kernel, shape, det):
    B, Sq, Sk, H, D = 2, 150, 170, 3, 64
    inp = qkv(B, Sq, Sk, H, D, BF16)
    inp["bias"] = rand(*shape, dtype=BF16, grad=True)
    run_case(kernel, inp, {}, deterministic=det)


@pytest.mark.parametrize("bias_dtype", [torch.float32, FP16])
def test_bias_dtype_and_strides(kernel, bias_dtype):
    B, S, H, D = 2, 130, 4, 64
    inp = qkv(B, S, S, H, D, FP16)
    base = torch.randn(1, S, H, S, device="cuda", dtype=torch.float32).to(bias_dtype)
    inp["bias"] = base.transpose(1, 2).requires_grad_(True)  # non-contiguous view [1, H, S, S]
    run_case(kernel, inp, {})


# ---- masks, causal, sliding window, fully masked rows ---------------------------------------------------------
@pytest.mark.parametrize("causal,window", [(True, None), (False, (64, 0)), (False, (100, 30)), (True, (50, 0)),
                                           (False, (0, 0))])
@pytest.mark.parametrize("sq,sk", [(256, 256), (200, 333), (333, 200)])
def test_causal_window(kernel, causal, window, sq, sk):
    inp = qkv(2, sq, sk, 2, 64, BF16)
    inp["bias"] = rand(1, 2, sq, sk, dtype=BF16, grad=True)
    run_case(kernel, inp, {"causal": causal, "window": window})


@pytest.mark.parametrize("det", [False, True])
def test_masks_and_fully_masked_rows(kernel, det):
    B, S, H, D = 3, 140, 2, 32
    inp = qkv(B, S, S, H, D, BF16)
    mask = torch.rand(B, 1, S, S, device="cuda") > 0.3
    mask[0, 0, 5] = False  # fully masked query row
    mask[1, 0, 17:40] = False
    kpm = torch.rand(B, S, device="cuda") > 0.2
    kpm[2] = False  # a batch item with no real key at all
    inp["mask"] = mask
    inp["key_padding_mask"] = kpm
    inp["bias"] = rand(B, H, S, S, dtype=BF16, grad=True)
    rep = run_case(kernel, inp, {}, deterministic=det)
    assert rep


def test_fully_masked_outputs_zero(kernel):
    B, S, H, D = 2, 70, 2, 64
    q, k, v = (rand(B, S, H, D, dtype=BF16, grad=True) for _ in range(3))
    kpm = torch.ones(B, S, dtype=torch.bool, device="cuda")
    kpm[1] = False
    poison()
    out, lse = kernel.attention(q, k, v, key_padding_mask=kpm, return_lse=True)
    assert torch.all(out[1] == 0) and torch.all(torch.isneginf(lse[1]))
    out.sum().backward()
    assert torch.all(q.grad[1] == 0) and torch.all(k.grad[1] == 0) and torch.all(v.grad[1] == 0)


# ---- GQA / MQA --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("Hkv", [1, 2])
@pytest.mark.parametrize("bias_heads", [8, 1])
@pytest.mark.parametrize("det", [False, True])
def test_gqa(kernel, Hkv, bias_heads, det):
    B, S, H, D = 2, 160, 8, 64
    inp = qkv(B, S, S, H, D, BF16, Hkv=Hkv)
    inp["bias"] = rand(1, bias_heads, S, S, dtype=BF16, grad=True)
    run_case(kernel, inp, {"causal": True}, deterministic=det)


# ---- Swin window attention --------------------------------------------------------------------------------------
def swin_inputs(nimg, win, nW, H, D, dtype, shift=True):
    N = win * win
    Bw = nimg * nW
    inp = qkv(Bw, N, N, H, D, dtype)
    coords = torch.stack(torch.meshgrid(torch.arange(win), torch.arange(win), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (win - 1)
    index = (rel[..., 0] * (2 * win - 1) + rel[..., 1]).cuda()
    inp["rel_pos_table"] = (torch.randn((2 * win - 1) ** 2, H, device="cuda") * 0.5).requires_grad_(True)
    inp["rel_pos_index"] = index
    if shift:
        region = torch.randint(0, 3, (nW, N), device="cuda")
        inp["swin_mask"] = torch.where(region[:, :, None] == region[:, None, :], 0.0, -100.0)
    return inp


@pytest.mark.parametrize("win,nimg,nW", [(7, 2, 64), (7, 32, 64), (12, 2, 16), (12, 16, 64), (4, 4, 16), (8, 8, 16),
                                         (10, 4, 16), (16, 4, 8), (16, 2, 1)])
def test_swin(kernel, win, nimg, nW):
    inp = swin_inputs(nimg, win, nW, 4, 32, BF16)
    run_case(kernel, inp, {}, swin=True)


@pytest.mark.parametrize("G", ["1", "3", "8"])
def test_swin_window_mode_forced(kernel, G, monkeypatch):
    monkeypatch.setenv("WINATTN_BWD_G", G)
    monkeypatch.setenv("WINATTN_FWD_G", G)
    inp = swin_inputs(3, 7, 16, 3, 32, FP16)
    inp["bias"] = rand(1, 3, 49, 49, dtype=FP16, grad=True)  # extra learnable bias: dbias from the partials too
    run_case(kernel, inp, {}, swin=True)


# win 12 (N = 144): the wide-window kernels (on Hopper, the wide backward's dbias from its partials)
@pytest.mark.parametrize("win", [7, 12, 16])
def test_swin_shift_mask_grad(kernel, win):
    # [nW, N, N] additive shift mask with a gradient: dbias grouped by window index (b % nW)
    inp = swin_inputs(4, win, 8, 2, 32, BF16, shift=False)
    inp["swin_mask"] = (torch.randn(8, win * win, win * win, device="cuda") * 0.5).requires_grad_(True)
    run_case(kernel, inp, {}, swin=True)


@pytest.mark.parametrize("win", [7, 12, 16])
def test_swin_infinite_mask_hides_rows(kernel, win):
    # -inf shift-mask entries must survive the fp16 table-term expansion: a row hidden entirely by them outputs 0
    # (not the uniform average a saturated -65504 would give), partly hidden rows ignore exactly those keys
    inp = swin_inputs(2, win, 4, 2, 32, BF16)
    m = inp["swin_mask"]
    m[1, 5] = float("-inf")  # every key of query 5 in window 1
    m[2, :, 10:30] = float("-inf")
    out = kernel.window_attention(inp["q"], inp["k"], inp["v"], rel_pos_table=inp["rel_pos_table"],
                                  rel_pos_index=inp["rel_pos_index"], mask=m)
    assert torch.all(out[1::4, 5] == 0)
    run_case(kernel, inp, {}, swin=True)


# ---- alternative backward configurations (kernel_traits.h BwdTraits<32, cfg>; default cfg 0 is covered above) -----
@pytest.mark.parametrize("cfg", ["1"])
def test_bwd_configs_d32(kernel, cfg, monkeypatch):
    monkeypatch.setenv("WINATTN_BWD_CFG", cfg)
    inp = swin_inputs(4, 7, 16, 2, 32, BF16)  # window mode
    run_case(kernel, inp, {}, swin=True)
    inp = qkv(2, 150, 170, 3, 32, BF16)  # several key blocks: dQ through atomics, dbias broadcast over the batch
    inp["bias"] = rand(1, 3, 150, 170, dtype=BF16, grad=True)
    run_case(kernel, inp, {"causal": True})


# ---- long sequence, large batch*heads ---------------------------------------------------------------------------
def test_long_4096(kernel):
    inp = qkv(1, 4096, 4096, 2, 64, BF16)
    inp["bias"] = rand(1, 2, 4096, 4096, dtype=BF16, grad=True)
    run_case(kernel, inp, {})


def test_batch_heads_65536(kernel):
    B, S, H, D = 16384, 16, 4, 32  # B * H = 65536 (grid is 1-D, never on gridDim.y/z)
    inp = qkv(B, S, S, H, D, BF16)
    inp["bias"] = rand(1, H, S, S, dtype=BF16, grad=True)
    run_case(kernel, inp, {})


# ---- deterministic mode -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["long_bias", "gqa_bias1", "swin", "rowbias"])
def test_deterministic_bitwise(kernel, case):
    if case == "swin":
        inp = swin_inputs(16, 7, 64, 4, 32, BF16)
        kw, swin = {}, True
    else:
        H, Hkv = (8, 2) if case == "gqa_bias1" else (4, 4)
        inp = qkv(2, 700, 900, H, 64, BF16, Hkv=Hkv)
        shape = {"long_bias": (1, H, 700, 900), "gqa_bias1": (1, 1, 700, 900), "rowbias": (2, 1, 700, 1)}[case]
        inp["bias"] = rand(*shape, dtype=BF16, grad=True)
        kw, swin = {"causal": case == "gqa_bias1"}, False
    dout = None
    results = []
    for _ in range(2):
        t = {n: (x.detach().clone().requires_grad_(x.requires_grad) if x is not None else None) for n, x in inp.items()}
        poison()
        if swin:
            out = kernel.window_attention(t["q"], t["k"], t["v"], rel_pos_table=t["rel_pos_table"],
                                          rel_pos_index=t["rel_pos_index"], mask=t.get("swin_mask"))
        else:
            out = kernel.attention(t["q"], t["k"], t["v"], bias=t["bias"], deterministic=True, **kw)
        if dout is None:
            dout = torch.randn_like(out)
        out.backward(dout)
        results.append([out] + [x.grad for x in t.values() if x is not None and x.requires_grad])
    for a, b in zip(*results):
        assert torch.equal(a, b), "deterministic mode must give bit-identical results"


def test_dtable_matches_reference_large(kernel):
    # W12-like, enough windows for window mode with the default heuristic
    inp = swin_inputs(8, 12, 64, 4, 32, BF16)
    rep = run_case(kernel, inp, {}, swin=True)
    assert rep["drel_pos_table"] <= 1e-2


# ---- fallback staging paths (taken on sm86 / sm89, whose 99 KB shared memory limit can exclude the prefetched
# additive tile or window mode): forced here through the planner's environment overrides --------------------------
@pytest.mark.parametrize("stages", ["0", "1"])
def test_bias_staging_fallbacks(kernel, stages, monkeypatch):
    monkeypatch.setenv("WINATTN_BIAS_STAGES", stages)
    inp = qkv(2, 150, 170, 3, 64, BF16)
    inp["bias"] = rand(1, 3, 150, 170, dtype=BF16, grad=True)
    run_case(kernel, inp, {"causal": True})
    inp = swin_inputs(4, 7, 16, 2, 32, BF16)
    run_case(kernel, inp, {}, swin=True)
    inp = qkv(2, 96, 96, 2, 128, FP16)
    inp["bias"] = rand(2, 1, 96, 1, dtype=torch.float32, grad=True).to(FP16).detach().requires_grad_(True)
    run_case(kernel, inp, {})


# ---- the v1 (sm80-class) kernels on Hopper: on compute capability 9.0 the planner runs the sm90 (wgmma) kernels
# where they apply (forward for head dims 32..128 without an additive term, window mode forward D=32/64 and
# backward D=32), so the tests above check those there; WINATTN_FORCE_KERNEL=v1 keeps the v1 kernels (what sm80 /
# sm86 / sm89 run) checked on the same machine ----------------------------------------------------------------------------
@pytest.mark.parametrize("D", [32, 64, 128])
def test_v1_kernels_on_hopper(kernel, D, monkeypatch):
    monkeypatch.setenv("WINATTN_FORCE_KERNEL", "v1")
    inp = qkv(2, 197, 197, 3, D, BF16)
    inp["bias"] = rand(1, 3, 197, 197, dtype=BF16, grad=True)
    run_case(kernel, inp, {"causal": True})
    inp = swin_inputs(4, 7, 16, 2, 32, BF16)
    run_case(kernel, inp, {}, swin=True)


# ---- window mode on Hopper (sm90/fwd_windows_sm90.h: <= 64 queries and keys per sequence, many sequences): the
# fp32 term table fast path (no terms, broadcast bias, per-item bias) and the apply_terms path (bool mask, key
# padding, causal), fully masked rows included ---------------------------------------------------------------------
@pytest.mark.parametrize("D", [32, 64])
@pytest.mark.parametrize("terms", ["none", "bias", "bias_per_item", "cross", "bool_mask", "key_padding", "causal"])
def test_window_mode_terms(kernel, D, terms):
    B, N, H = 48, 49, 3
    Sk = 64 if terms == "cross" else N
    inp = qkv(B, N, Sk, H, D, BF16)
    kwargs = {}
    if terms in ("bias", "cross"):
        inp["bias"] = rand(1, H, N, Sk, dtype=BF16, grad=True)
    elif terms == "bias_per_item":
        inp["bias"] = rand(B, 1, N, Sk, dtype=FP16, grad=True)
    elif terms == "bool_mask":
        mask = torch.rand(B, 1, N, Sk, device="cuda") > 0.3
        mask[3, 0, 7] = False  # a fully masked query row
        inp["mask"] = mask
    elif terms == "key_padding":
        kpm = torch.rand(B, Sk, device="cuda") > 0.2
        kpm[5] = False  # an item with no real key
        inp["key_padding_mask"] = kpm
    elif terms == "causal":
        kwargs["causal"] = True
    run_case(kernel, inp, kwargs)


# ---- wide windows on Hopper (sm90 window forward with key blocks 128 / 160 / 256, several 64-query tiles) ----------
@pytest.mark.parametrize("N", [100, 144, 200, 256])
@pytest.mark.parametrize("terms", ["none", "bias_fp16", "bias_fp32", "bias_per_item", "cross", "key_padding"])
def test_wide_window_terms(kernel, N, terms):
    # fp16 terms take the fp16 term table past 160 keys; fp32 ones and key padding go to v1 there (same results)
    B, H, D = 24, 2, 32
    Sk = N - 30 if terms == "cross" else N
    inp = qkv(B, N, Sk, H, D, BF16)
    if terms in ("bias_fp16", "cross"):
        inp["bias"] = rand(1, H, N, Sk, dtype=FP16, grad=True)
    elif terms == "bias_fp32":
        inp["bias"] = rand(1, H, N, Sk, dtype=torch.float32, grad=True)
    elif terms == "bias_per_item":
        inp["bias"] = rand(B // 4, 1, N, Sk, dtype=FP16, grad=True).repeat(4, 1, 1, 1).detach().requires_grad_(True)
    elif terms == "key_padding":
        kpm = torch.rand(B, Sk, device="cuda") > 0.2
        kpm[5] = False
        inp["key_padding_mask"] = kpm
    run_case(kernel, inp, {})


# ---- the general Hopper forward (v3, sm90/fwd_pipelined_sm90.h) with every score term but an additive one --------
@pytest.mark.parametrize("D", [64, 96, 128])
@pytest.mark.parametrize("terms", ["bool_mask", "key_padding", "causal_window", "gqa"])
def test_sm90_general_terms(kernel, D, terms):
    B, Sq, Sk, H = 2, 300, 420, 4
    inp = qkv(B, Sq, Sk, H, D, FP16 if D == 96 else BF16, Hkv=2 if terms == "gqa" else None)
    kwargs = {}
    if terms == "bool_mask":
        mask = torch.rand(B, 1, Sq, Sk, device="cuda") > 0.3
        mask[1, 0, 130] = False
        inp["mask"] = mask
    elif terms == "key_padding":
        kpm = torch.rand(B, Sk, device="cuda") > 0.2
        kpm[1, 128:] = False
        inp["key_padding_mask"] = kpm
    elif terms == "causal_window":
        kwargs = {"causal": True, "window": (96, 0)}
    else:
        kwargs = {"causal": True}
    run_case(kernel, inp, kwargs)


# ---- gradient through lse in window mode (the Hopper window backward computes delta = rowsum(P dP) - dlse itself)
@pytest.mark.parametrize("padded", [False, True])
def test_window_mode_grad_through_lse(kernel, padded):
    B, N, H, D = 24, 49, 2, 32
    q, k, v = (rand(B, N, H, D, dtype=BF16, grad=True) for _ in range(3))
    bias = rand(1, H, N, N, dtype=BF16, grad=True)
    kpm = None
    if padded:  # apply_terms path; item 1 has no real key at all
        kpm = torch.rand(B, N, device="cuda") > 0.2
        kpm[1] = False
    g = torch.randn(B, N, H, D, device="cuda")
    gl = torch.randn(B, H, N, device="cuda")

    def loss(mod, tensors, dt):
        out, lse = mod.attention(*tensors[:3], bias=tensors[3], key_padding_mask=kpm, return_lse=True)
        live = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
        return (out * g.to(dt)).sum() + (live * gl.to(live.dtype)).sum()

    inputs = [q, k, v, bias]
    same = [t.detach().clone().requires_grad_(True) for t in inputs]
    ref = [t.detach().double().requires_grad_(True) for t in inputs]
    poison()
    loss(kernel, inputs, BF16).backward()
    loss(kernel.reference, same, BF16).backward()
    loss(kernel.reference, ref, torch.float64).backward()
    for name, t, s, r in zip(("dq", "dk", "dv"), inputs[:3], same[:3], ref[:3]):
        assert_fa_close(name, t.grad, s.grad, r.grad, BF16)
        if padded:
            assert (t.grad[1] == 0).all(), f"{name}: an item without keys must get zero gradient"
    assert_rel_l2("dbias", bias.grad, ref[3].grad)
