"""Hopper forward v3 (sm90/fwd_pipelined_sm90.h): cases that stress its machinery (marked `gpu`).

On compute capability 9.0 every non-window forward runs v3, so the whole GPU suite checks it; these cases aim at
what is new: the TMA pipeline against short sequences (fewer key blocks than stages, S = tile + 1), ragged head
dims (TMA zero-fills the columns past D), every broadcast of the additive term, fp32 bias with bf16 inputs, D = 256,
GQA 32 / 8, causal and sliding windows with Sq != Sk (tiles with no visible key), fully masked rows, and the v1
kernel still selectable from the same binary (the v2 forward was retired: forcing it is an error). Forward only (the backward is checked by the other files).
"""

import math

import pytest
import torch

from ._helpers import qkv, rand, run_case

pytestmark = pytest.mark.gpu

BF16, FP16 = torch.bfloat16, torch.float16


def fwd(kernel, inp, **kwargs):
    return run_case(kernel, inp, kwargs, check_grads=False)


# pipeline depth vs sequence length: one key, fewer key blocks than stages, tile +- 1 (128-query / 64..128-key tiles)
@pytest.mark.parametrize("S", [1, 17, 127, 128, 129, 257, 641])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_sequence_lengths(kernel, S, D):
    fwd(kernel, qkv(2, S, S, 2, D))


@pytest.mark.parametrize("Sq,Sk", [(1, 1000), (1000, 1), (130, 700), (700, 130)])
def test_cross_lengths(kernel, Sq, Sk):
    fwd(kernel, qkv(2, Sq, Sk, 3, 128, FP16))


# every head dim the kernel rounds to, and ragged ones in between (TMA zero-fills columns D .. 32k)
@pytest.mark.parametrize("D", [8, 32, 48, 64, 72, 96, 112, 128, 144, 160, 184, 192, 200, 256])
def test_head_dims(kernel, D):
    fwd(kernel, qkv(1, 300, 333, 2, D, FP16 if D % 16 else BF16))


BIAS_SHAPES = [(2, 3, 200, 260), (1, 3, 200, 260), (2, 1, 200, 260), (1, 1, 200, 260), (200, 260), (2, 3, 1, 260),
               (1, 1, 1, 260), (260,), (2, 1, 200, 1), (3, 200, 1), (1, 1, 1, 1)]


@pytest.mark.parametrize("shape", BIAS_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("bias_dtype", [BF16, torch.float32])
def test_bias_broadcasts(kernel, shape, bias_dtype):
    inp = qkv(2, 200, 260, 3, 64)
    inp["bias"] = rand(*shape, dtype=bias_dtype)
    fwd(kernel, inp)


def test_strided_bias_and_inputs(kernel):
    # a bias that is a transposed view (stride 1 along the queries) and q/k/v sliced out of a packed qkv tensor
    qkv_packed = rand(2, 300, 3, 4, 64, dtype=BF16)
    q, k, v = qkv_packed.unbind(2)
    bias = rand(1, 4, 300, 300, dtype=BF16).transpose(-1, -2)
    fwd(kernel, dict(q=q, k=k, v=v, bias=bias))


@pytest.mark.parametrize("H,Hkv", [(32, 8), (8, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa(kernel, H, Hkv, causal):
    fwd(kernel, qkv(1, 333, 333, H, 128, Hkv=Hkv), causal=causal)


@pytest.mark.parametrize("Sq,Sk", [(300, 700), (700, 300), (128, 1000)])
@pytest.mark.parametrize("window", [None, (64, 0), (200, 50), (0, 0)])
def test_causal_and_windows_unequal_lengths(kernel, Sq, Sk, window):
    # causal with Sq > Sk leaves the first Sq - Sk queries (whole 128-query tiles) without a visible key
    kwargs = {"causal": True} if window is None else {"window": window}
    fwd(kernel, qkv(2, Sq, Sk, 2, 64), **kwargs)


# Many tiles per CTA (the persistent grid walks several), for every tile whose epilogue stages O in shared memory
# (fwd_epilogue_sm90.h): each warp rewrites its slice tile after tile once its previous TMA store has read it. Rows
# end inside a warp's 16 (Sq % 16 != 0) or a tile; 72 and 160 columns are clipped by the store's map. (The table
# takes the streamed tile for 129-512 keys at head dims 65-128, the narrow one forced beside it.)
MANY_TILES = {
    "two-cta-ragged": (None, (64, 12, 197, 197, 64), None),
    "rows192": ("fwd_v3_rows192", (2, 16, 1500, 1500, 64), None),
    "narrow64": ("fwd_v3_narrow", (4, 16, 700, 700, 64), None),
    "keys80-stream": (None, (8, 10, 1000, 77, 64), None),
    "stream128-cross512": (None, (2, 12, 3001, 512, 128), None),
    "stream96-d72": (None, (8, 16, 250, 250, 72), None),
    "narrow128-cross512": ("fwd_v3_narrow", (2, 12, 3001, 512, 128), None),
    "d160": (None, (4, 8, 1000, 1000, 160), None),
    "staged-bias-two-cta": (None, (32, 12, 197, 197, 64), "bias"),
    "row-term128": (None, (4, 8, 1000, 1000, 128), "fmask"),  # (a float mask [B, 1, 1, S] as diffusers passes it)
    "mask-bits64": (None, (32, 12, 197, 197, 64), "mask"),
}


@pytest.mark.parametrize("case", list(MANY_TILES))
def test_many_tiles_per_cta(kernel, monkeypatch, case):
    force, (B, H, Sq, Sk, D), term = MANY_TILES[case]
    if force:
        monkeypatch.setenv("WINATTN_FORCE_KERNEL", force)
    inp = qkv(B, Sq, Sk, H, D, FP16 if B % 16 else BF16)
    if term == "bias":
        inp["bias"] = rand(1, H, Sq, Sk, dtype=inp["q"].dtype)
    elif term == "fmask":
        inp["bias"] = torch.where(torch.rand(B, 1, 1, Sk, device="cuda") > 0.2, 0.0, -10000.0).to(inp["q"].dtype)
    elif term == "mask":
        inp["mask"] = torch.rand(1, H, 1, Sk, device="cuda") > 0.3
    fwd(kernel, inp)


# Lazy rescaling (kernel-src/cuda/softmax.h kLazySlackLog2; the kernels at head dim 256 and the streamed tiles take
# it, fwd_pipelined_sm90.h fwd_lazy_rescale): a row keeps its exponent base while a key block raises its max by at
# most 8 (log2 units), so P reaches 2^8 before O is rescaled, and O is rescaled only where a row of the warp moved its
# base. The kernels without it run the same inputs as a control. The scores here rise block after block in the order
# v3 visits the blocks (the last one first), at a different slope per query row (the rows of one warp decide
# differently): rises inside the slack, near it, and a jump past it. The saved lse is checked against float64's (its
# base is then not the row's max).
RISE_PER_32_KEYS = {"slow": 1.5, "near-slack": 3.9, "jump": None}


def rising_scores(inp, rise, on_bias):
    """Sets q[..., 0] (1, 1/2 or 1/4 per row) and the ramp, in k[..., 0] or (on_bias) in a [1, 1, 1, Sk] bias."""
    q, k = inp["q"], inp["k"]
    Sk, D = k.shape[1], q.shape[-1]
    u = ((Sk - 1 - torch.arange(Sk, device="cuda")) // 32).double()  # the 32-key group's place in the visit order
    ramp = torch.where(u >= u.max() / 2, 30.0, 0.0) + 0.5 * u if rise == "jump" else RISE_PER_32_KEYS[rise] * u
    ramp = ramp / math.log2(math.e)  # log2 units -> natural
    c = torch.tensor([1.0, 0.5, 0.25], device="cuda")[torch.randint(0, 3, q.shape[:3], device="cuda")]
    q[..., 0] = c.to(q.dtype)
    if on_bias:
        inp["bias"] = ramp.view(1, 1, 1, Sk).to(q.dtype)
    else:
        k[:, :, :, 0] = (ramp * math.sqrt(D)).view(1, Sk, 1).to(k.dtype)  # (times 1 / scale)
    for t in (q, k, inp["v"]):
        t.requires_grad_(True)
    return inp


@pytest.mark.parametrize("rise", list(RISE_PER_32_KEYS))
@pytest.mark.parametrize("force,D,dtype,on_bias", [
    (None, 256, BF16, False), (None, 256, FP16, True), ("fwd_v3_stream", 96, FP16, False),
    (None, 128, BF16, False), (None, 64, FP16, True), ("fwd_v3_narrow", 64, BF16, False),
    ("fwd_v3_wide", 128, FP16, False), ("fwd_v3_stream", 128, BF16, False), ("fwd_v3_rows192", 64, FP16, False),
    ("fwd_v3_two_ctas", 64, BF16, False)])
def test_rising_row_max(kernel, monkeypatch, rise, force, D, dtype, on_bias):
    if force:
        monkeypatch.setenv("WINATTN_FORCE_KERNEL", force)
    inp = rising_scores(qkv(2, 300, 1000, 2, D, dtype), rise, on_bias)
    # The output by the FlashAttention rule and the saved lse against float64's: a base the kernel lost track of
    # shows there directly (errors of the order of the skipped rise, up to 8 * ln 2). The gradients only with the
    # ramp on the bias: with it on K (up to ~260), dS of the dominant key is P (dP - rowsum(dO O)), a difference O's
    # rounding decides, times that K, and every version sits at ~2x the same-dtype dq error there (v4.9 up to 1.95x
    # over 120 draws at head dim 64, bf16; RESULTS v5.0), so the rule would judge the input, not the kernel.
    run_case(kernel, inp, {}, check_grads=on_bias)
    with torch.no_grad():
        bias = inp.get("bias")
        _, lse = kernel.attention(inp["q"], inp["k"], inp["v"], bias=bias, return_lse=True)
        _, lse64 = kernel.reference.attention(inp["q"].double(), inp["k"].double(), inp["v"].double(),
                                              bias=None if bias is None else bias.double(), return_lse=True)
    err = (lse.double() - lse64).abs().max().item()
    assert err <= 2e-3, f"lse: max err {err:.3e}"


def test_fully_masked_rows_give_zero(kernel):
    B, S, H, D = 2, 300, 2, 128
    inp = qkv(B, S, S, H, D)
    mask = torch.rand(B, H, S, S, device="cuda") > 0.5
    mask[0, 1, 5] = False
    mask[1, :, 200:260] = False  # a band of rows (crossing a 64-row warpgroup boundary) sees nothing
    inp["mask"] = mask
    fwd(kernel, inp)
    out, lse = kernel.attention(inp["q"], inp["k"], inp["v"], mask=mask, return_lse=True)
    assert (out[0, 5, 1] == 0).all() and (out[1, 200:260] == 0).all()
    assert torch.isneginf(lse[1, :, 200:260]).all()


def test_key_padding_items(kernel):
    B, S = 3, 4352
    inp = qkv(B, S, S, 2, 128)
    kpm = torch.ones(B, S, dtype=torch.bool, device="cuda")
    kpm[1, 4000:] = False  # padded tail
    kpm[2] = False  # no real key at all: out = 0
    inp["key_padding_mask"] = kpm
    fwd(kernel, inp)


def test_negative_scale(kernel):
    # the folded-scale softmax path needs scale > 0: other scales take the general path
    fwd(kernel, qkv(1, 200, 200, 2, 64), scale=-0.3)


def test_v1_still_selectable_and_v2_retired(kernel, monkeypatch):
    monkeypatch.setenv("WINATTN_FORCE_KERNEL", "v1")
    inp = qkv(2, 300, 300, 2, 128)
    fwd(kernel, inp, causal=True)
    monkeypatch.setenv("WINATTN_FORCE_KERNEL", "fwd_v2")
    with pytest.raises(Exception, match="fwd_v2 was retired with the v2 forward; fwd_v1 runs what it ran"):
        kernel.attention(inp["q"], inp["k"], inp["v"])
