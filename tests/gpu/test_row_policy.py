"""The row policy on every forward kernel (README, `attention`; kernel-src/cuda/softmax.h `finalize_row`), marked
`gpu`: a row whose keys are all hidden gives out = 0 and lse = -inf; a NaN in q, k, the bias or the table gives NaN
out and NaN lse in exactly the rows whose visible scores it reaches, and leaves every other row as the reference has
it.

Each case runs on every forward the planner can choose, forced through WINATTN_FORCE_KERNEL (read on every call:
kernel-src/cuda/host_env.h, so monkeypatch switches it between calls), with call shapes that kernel takes
(kernel_choice.h), and checks in the profiler's trace that the forced kernel is the one that ran, with the schedule
asked for (a forced kernel that cannot take a call raises rather than falls back; the trace keeps these cases from
passing on another kernel if that ever changes). Outputs are poisoned first: NaN where rows must come out finite or
zero, a finite value where they must come out NaN, so a row left unwritten fails either way.
"""

import json
import re
from dataclasses import dataclass

import pytest
import torch
from swin_index import swin_relative_index

from ._helpers import poison, qkv, rand

pytestmark = pytest.mark.gpu

BF16, FP32 = torch.bfloat16, torch.float32
FINITE_POISON = 12345.0


@dataclass(frozen=True)
class Fwd:
    """A forward kernel forced by name, and the call shapes it takes."""

    force: str                      # WINATTN_FORCE_KERNEL
    ran: str                        # regex that a launched kernel's name must match
    D: int
    S: int                          # keys (and queries, unless Sq says otherwise)
    H: int = 4
    Hkv: int | None = None
    B: int = 2
    Sq: int | None = None
    bias: tuple = (BF16, FP32)      # dtypes of a [1, H, Sq, Sk] bias it takes
    masks: bool = True              # takes a bool mask (else key padding only)
    table_W: int | None = 7         # window_attention with a W x W Swin table (None: takes no table)
    schedule: str | None = None     # v3's "persistent" / "per_tile": more 128-query tiles than SMs, grid checked

    @property
    def id(self):
        return f"{self.force}-d{self.D}-s{self.S}"


KERNELS = [
    Fwd("fwd_v1", r"\bfwd_kernel<", D=64, S=200, Hkv=2),
    Fwd("fwd_v3", r"fwd_pipelined_kernel_sm90", D=128, S=320, Hkv=2),  # 16-byte rows: a bf16 bias is staged as is
    Fwd("fwd_v3_narrow", r"FwdPipeTraitsSm90<64,\s*128\b", D=64, S=300, H=2),
    # wide key blocks: the no-term path only (key padding is no term)
    Fwd("fwd_v3_wide", r"FwdPipeTraitsSm90<64,\s*192\b", D=64, S=300, H=2, bias=(), masks=False, table_W=None),
    # one key block sized to a short key set: the no-term path (key padding is none), <= 80 or 128 keys (head dims
    # 64, 80 and 96) or <= 208 (64)
    Fwd("fwd_v3_short", r"FwdPipeTraitsSm90<64,\s*208\b", D=64, S=197, H=2, bias=(), masks=False, table_W=None),
    Fwd("fwd_v3_short", r"FwdPipeTraitsSm90<64,\s*80\b", D=64, S=77, Sq=300, H=2, bias=(), masks=False,
        table_W=None),
    Fwd("fwd_v3_short", r"FwdPipeTraitsSm90<80,\s*80\b", D=72, S=77, Sq=200, H=2, bias=(), masks=False,
        table_W=None),
    Fwd("fwd_v3_short", r"FwdPipeTraitsSm90<96,\s*128\b", D=88, S=120, Sq=200, H=2, bias=(), masks=False,
        table_W=None),
    # 128-key blocks streamed across tiles for any key set (the no-term path, head dims 64 / 96 / 128)
    Fwd("fwd_v3_stream", r"FwdPipeTraitsSm90<128,\s*128,\s*2,\s*true\b", D=128, S=600, H=2, bias=(), masks=False,
        table_W=None),
    # 64-key blocks, two CTAs per SM (the no-term path, head dim 64); 32-key blocks at 65-80 and 81-96 (forced only)
    Fwd("fwd_v3_two_ctas", r"FwdPipeTraitsSm90<64,\s*64,\s*2,\s*false,\s*2>", D=64, S=300, H=2, bias=(),
        masks=False, table_W=None),
    Fwd("fwd_v3_two_ctas", r"FwdPipeTraitsSm90<96,\s*32,\s*2,\s*false,\s*2>", D=88, S=300, H=2, bias=(),
        masks=False, table_W=None),
    # the same at head dim 64 with its last key block cut to the sequence end (forced only)
    Fwd("fwd_v3_ragged", r"FwdPipeRaggedTraitsSm90<64,\s*64\b", D=64, S=300, H=2, bias=(), masks=False,
        table_W=None),
    # 192-row tiles of three consumer warpgroups (the no-term path, head dims 33-96; the table's from longer calls)
    Fwd("fwd_v3_rows192", r"FwdPipeRows192TraitsSm90<64,\s*128\b", D=64, S=300, H=2, bias=(), masks=False,
        table_W=None),
    Fwd("fwd_v3_rows192", r"FwdPipeRows192TraitsSm90<80,\s*128\b", D=72, S=300, H=2, bias=(), masks=False,
        table_W=None),
    Fwd("fwd_v3_rows192", r"FwdPipeRows192TraitsSm90<96,\s*128\b", D=96, S=300, H=2, bias=(), masks=False,
        table_W=None),
    Fwd("fwd_v3_rows192", r"FwdPipeRows192TraitsSm90<48,\s*128\b", D=40, S=300, H=2, bias=(), masks=False,
        table_W=None),
    Fwd("fwd_v3_persistent", r"fwd_pipelined_kernel_sm90", D=64, S=300, schedule="persistent"),
    Fwd("fwd_v3_per_tile", r"fwd_pipelined_kernel_sm90", D=64, S=300, schedule="per_tile"),
    # windows: one key block per window (64 keys at D = 64; 160 / 256 at D = 32: the fp32 and fp16 term tables)
    Fwd("fwd_windows", r"FwdWindowTraitsSm90<64,\s*64\b", D=64, S=49, H=2, B=64),
    Fwd("fwd_windows", r"FwdWindowTraitsSm90<32,\s*160\b", D=32, S=144, H=2, B=64, table_W=12),
    Fwd("fwd_windows", r"FwdWindowTraitsSm90<32,\s*256\b", D=32, S=256, H=2, B=64, bias=(BF16,), table_W=16),
    # decode: <= 16 query rows per KV head (here 4), the keys split over CTAs and merged by the combine kernel
    Fwd("fwd_decode", r"fwd_decode_kernel", D=64, S=3000, Sq=1, H=8, Hkv=2, table_W=None),
    # the same with K / V by TMA (sm90/fwd_decode_sm90.h: the table's decode on Hopper)
    Fwd("fwd_decode_tma", r"fwd_decode_tma_kernel", D=128, S=3000, Sq=1, H=8, Hkv=2, table_W=None),
]


def kernels(where=lambda f: True):
    return [pytest.param(f, id=f.id) for f in KERNELS if where(f)]


def v3_slots(kernel_name):
    """CTAs the persistent grid of this v3 kernel keeps resident: one per SM, two for a tile whose traits end in
    kMinBlocks = 2 (the two-CTA tiles: FwdPipeTraitsSm90<64, 64, 2, false, 2>, <80 / 96, 32, 2, false, 2>, the ragged
    one FwdPipeRaggedTraitsSm90<64, 64, 2, 2>)."""
    two = r"FwdPipeTraitsSm90<\d+,\s*\d+,\s*\d+,\s*\w+,\s*2>|FwdPipeRaggedTraitsSm90<\d+,\s*\d+,\s*\d+,\s*2>"
    per_sm = 2 if re.search(two, kernel_name) else 1
    return per_sm * torch.cuda.get_device_properties(0).multi_processor_count


def batch(f, Sq, H):
    """The spec's batch, or for the v3 schedules one with more 128-query tiles than two CTAs per SM take at once (a
    CTA of the persistent grid walks to a second tile whatever the tile)."""
    if f.schedule is None:
        return f.B
    return 2 * torch.cuda.get_device_properties(0).multi_processor_count // (H * -(-Sq // 128)) + 1


def run_forced(f, monkeypatch, trace, fn, *, B, H, Sq, poison_value):
    """fn() under WINATTN_FORCE_KERNEL=f.force, after poisoning the allocator; checks that f's kernel ran."""
    monkeypatch.setenv("WINATTN_FORCE_KERNEL", f.force)
    poison(poison_value)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        result = fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    launched = [(e["name"], e.get("args", {}).get("grid")) for e in events if e.get("cat") == "kernel"]
    grids = [grid for name, grid in launched if re.search(f.ran, name)]
    assert grids, f"{f.force}: no launched kernel matches {f.ran!r}: {sorted({n for n, _ in launched})}"
    if f.schedule is not None:
        tiles = B * H * -(-Sq // 128)
        for name, grid in launched:
            if re.search(f.ran, name):
                want = min(tiles, v3_slots(name)) if f.schedule == "persistent" else tiles
                assert grid[0] * grid[1] * grid[2] == want, (f.schedule, tiles, name, grid)
    return result


def check_rows(kernel, out, lse, want_nan, ref_args, ref_kwargs):
    """out [B, Sq, H, D], lse [B, H, Sq] (None: window_attention has none); want_nan [B, H, Sq]: the rows that must
    be NaN in out (every element) and lse. Every other row is finite and matches the float64 reference."""
    o = out.float().transpose(1, 2)  # [B, H, Sq, D]
    assert torch.isnan(o[want_nan]).all(), "a row the NaN reaches is not NaN in out"
    assert torch.isfinite(o[~want_nan]).all(), "a row the NaN does not reach is not finite in out"
    if lse is not None:
        assert torch.isnan(lse[want_nan]).all(), f"lse of a NaN row: {lse[want_nan].unique().tolist()}"
        assert torch.isfinite(lse[~want_nan]).all(), "a row the NaN does not reach has a non-finite lse"
    ref64 = [t.double() if t.is_floating_point() else t for t in ref_args]
    kw64 = {n: (t.double() if t.is_floating_point() else t) for n, t in ref_kwargs.items()}
    if lse is None:
        ref_out = kernel.reference.window_attention(*ref64, **kw64)
    else:
        ref_out, ref_lse = kernel.reference.attention(*ref64, **kw64, return_lse=True)
        assert torch.equal(torch.isnan(ref_lse), want_nan), "the case's NaN rows disagree with the reference's lse"
        torch.testing.assert_close(lse[~want_nan].double(), ref_lse[~want_nan].double(), atol=2e-2, rtol=2e-2)
    ref_o = ref_out.transpose(1, 2)
    assert torch.equal(torch.isnan(ref_o).any(-1), want_nan), "the case's NaN rows disagree with the reference's out"
    torch.testing.assert_close(o[~want_nan].double(), ref_o[~want_nan], atol=2e-2, rtol=2e-2)


def shapes(f):
    Sq = f.Sq or f.S
    Hkv = f.Hkv or f.H
    return batch(f, Sq, f.H), Sq, f.S, f.H, Hkv


@pytest.mark.parametrize("f", kernels())
def test_nan_in_one_query_row(kernel, f, monkeypatch, tmp_path):
    B, Sq, Sk, H, Hkv = shapes(f)
    inp = qkv(B, Sq, Sk, H, f.D, BF16, Hkv=Hkv)
    b0, i0, h0 = B - 1, Sq // 2, H - 1  # (v3 persistent: a tile a CTA takes after others)
    inp["q"][b0, i0, h0, 3] = float("nan")
    want = torch.zeros(B, H, Sq, dtype=torch.bool, device="cuda")
    want[b0, h0, i0] = True
    out, lse = run_forced(f, monkeypatch, tmp_path / "trace.json",
                          lambda: kernel.attention(inp["q"], inp["k"], inp["v"], return_lse=True),
                          B=B, H=H, Sq=Sq, poison_value=FINITE_POISON)
    check_rows(kernel, out, lse, want, (inp["q"], inp["k"], inp["v"]), {})


@pytest.mark.parametrize("f", kernels())
def test_nan_in_one_key(kernel, f, monkeypatch, tmp_path):
    B, Sq, Sk, H, Hkv = shapes(f)
    inp = qkv(B, Sq, Sk, H, f.D, BF16, Hkv=Hkv)
    b0, j0, g0 = B - 1, Sk // 3, Hkv - 1
    inp["k"][b0, j0, g0, 5] = float("nan")  # every query of the item sees key j0: all rows of KV head g0's heads
    want = torch.zeros(B, H, Sq, dtype=torch.bool, device="cuda")
    want[b0, torch.arange(H, device="cuda") // (H // Hkv) == g0] = True
    out, lse = run_forced(f, monkeypatch, tmp_path / "trace.json",
                          lambda: kernel.attention(inp["q"], inp["k"], inp["v"], return_lse=True),
                          B=B, H=H, Sq=Sq, poison_value=FINITE_POISON)
    check_rows(kernel, out, lse, want, (inp["q"], inp["k"], inp["v"]), {})


@pytest.mark.parametrize("f,bias_dtype", [pytest.param(f, dt, id=f"{f.id}-{str(dt)[6:]}") for f in KERNELS
                                          for dt in f.bias])
def test_nan_in_the_bias(kernel, f, bias_dtype, monkeypatch, tmp_path):
    # (an fp32 bias on bf16 inputs, and bf16 rows that are not 16-byte aligned, reach v3 recast by
    # combine_terms_kernel; the 256-key window tile's fp16 table takes a bf16 bias recast the same way)
    B, Sq, Sk, H, Hkv = shapes(f)
    inp = qkv(B, Sq, Sk, H, f.D, BF16, Hkv=Hkv)
    bias = rand(1, H, Sq, Sk, dtype=bias_dtype)
    h0, i0, j0 = 0, Sq - 1, Sk // 2
    bias[0, h0, i0, j0] = float("nan")  # broadcast over the batch: row (i0, h0) of every item
    want = torch.zeros(B, H, Sq, dtype=torch.bool, device="cuda")
    want[:, h0, i0] = True
    out, lse = run_forced(f, monkeypatch, tmp_path / "trace.json",
                          lambda: kernel.attention(inp["q"], inp["k"], inp["v"], bias=bias, return_lse=True),
                          B=B, H=H, Sq=Sq, poison_value=FINITE_POISON)
    check_rows(kernel, out, lse, want, (inp["q"], inp["k"], inp["v"]), {"bias": bias})


@pytest.mark.parametrize("f", kernels(lambda f: f.table_W))
def test_nan_in_the_table(kernel, f, monkeypatch, tmp_path):
    # window_attention returns no lse: out only (the table term is gathered by combine_terms_kernel for every kernel)
    W = f.table_W
    N = W * W
    B, H = batch(f, N, f.H), f.H
    inp = qkv(B, N, N, H, f.D, BF16)
    index = swin_relative_index(W, "cuda")
    table = torch.randn((2 * W - 1) ** 2, H, device="cuda") * 0.5
    h0, t0 = H - 1, int(index[0, N - 1])  # a corner offset: one (query, key) pair per window
    table[t0, h0] = float("nan")
    want = torch.zeros(B, H, N, dtype=torch.bool, device="cuda")
    want[:, h0] = (index == t0).any(-1)
    kw = {"rel_pos_table": table, "rel_pos_index": index}
    out = run_forced(f, monkeypatch, tmp_path / "trace.json",
                     lambda: kernel.window_attention(inp["q"], inp["k"], inp["v"], **kw),
                     B=B, H=H, Sq=N, poison_value=FINITE_POISON)
    check_rows(kernel, out, None, want, (inp["q"], inp["k"], inp["v"]), kw)


def check_hidden_rows(kernel, f, monkeypatch, tmp_path, inp, hidden, kwargs, *, B, H, Sq):
    """hidden [B, H, Sq]: the rows with no visible key (out exactly 0, lse -inf); every other row finite and as the
    reference has it."""
    out, lse = run_forced(f, monkeypatch, tmp_path / "trace.json",
                          lambda: kernel.attention(inp["q"], inp["k"], inp["v"], **kwargs, return_lse=True),
                          B=B, H=H, Sq=Sq, poison_value=float("nan"))
    o = out.float().transpose(1, 2)
    assert (o[hidden] == 0).all(), "a row with no visible key is not 0"
    assert torch.isneginf(lse[hidden]).all(), f"lse of a row with no visible key: {lse[hidden].unique().tolist()}"
    assert torch.isfinite(o[~hidden]).all() and torch.isfinite(lse[~hidden]).all()
    ref_out, ref_lse = kernel.reference.attention(inp["q"].double(), inp["k"].double(), inp["v"].double(),
                                                  **kwargs, return_lse=True)
    assert torch.equal(torch.isneginf(ref_lse), hidden), "the case's hidden rows disagree with the reference"
    torch.testing.assert_close(o.double(), ref_out.transpose(1, 2), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse[~hidden].double(), ref_lse[~hidden].double(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("f", kernels())
def test_an_item_without_a_real_key(kernel, f, monkeypatch, tmp_path):
    B, Sq, Sk, H, Hkv = shapes(f)
    inp = qkv(B, Sq, Sk, H, f.D, BF16, Hkv=Hkv)
    kpm = torch.ones(B, Sk, dtype=torch.bool, device="cuda")
    kpm[0, Sk // 2:] = False  # a padded tail
    kpm[1] = False  # no real key at all
    hidden = torch.zeros(B, H, Sq, dtype=torch.bool, device="cuda")
    hidden[1] = True
    check_hidden_rows(kernel, f, monkeypatch, tmp_path, inp, hidden, {"key_padding_mask": kpm}, B=B, H=H, Sq=Sq)


@pytest.mark.parametrize("f", kernels(lambda f: f.masks))
def test_a_bool_mask_row_hiding_every_key(kernel, f, monkeypatch, tmp_path):
    B, Sq, Sk, H, Hkv = shapes(f)
    inp = qkv(B, Sq, Sk, H, f.D, BF16, Hkv=Hkv)
    mask = torch.rand(B, 1, Sq, Sk, device="cuda") > 0.3
    mask[..., 0] = True  # (no other row loses every key by chance)
    mask[0, 0, Sq - 1] = False  # (decode, Sq = 1: the mask is key padding and item 0 has no key)
    hidden = torch.zeros(B, H, Sq, dtype=torch.bool, device="cuda")
    hidden[0, :, Sq - 1] = True
    check_hidden_rows(kernel, f, monkeypatch, tmp_path, inp, hidden, {"mask": mask}, B=B, H=H, Sq=Sq)


@pytest.mark.parametrize("form", ["BHQK", "1HQK", "1H1K"])
@pytest.mark.parametrize("f", kernels(lambda f: f.masks))
def test_a_nan_score_of_a_masked_key_stays_hidden(kernel, f, form, monkeypatch, tmp_path):
    # Keys a bool mask hides stay hidden whatever their score (masked_fill's semantics), also where the planner folds
    # the mask into the additive term as -inf (v3 and the window kernels: kernel_params.h term_hides): a plain
    # -inf term would let the NaN through (NaN + -inf = NaN). The key with the NaN is hidden from every query.
    B, Sq, Sk, H, Hkv = shapes(f)
    inp = qkv(B, Sq, Sk, H, f.D, BF16, Hkv=Hkv)
    b0, j0, g0 = B - 1, Sk // 3, Hkv - 1
    inp["k"][b0, j0, g0, 5] = float("nan")
    shape = {"BHQK": (B, H, Sq, Sk), "1HQK": (1, H, Sq, Sk), "1H1K": (1, H, 1, Sk)}[form]
    mask = torch.rand(*shape, device="cuda") > 0.3
    mask[..., 0] = True  # (no row loses every key by chance)
    mask[..., j0] = False
    want = torch.zeros(B, H, Sq, dtype=torch.bool, device="cuda")
    out, lse = run_forced(f, monkeypatch, tmp_path / "trace.json",
                          lambda: kernel.attention(inp["q"], inp["k"], inp["v"], mask=mask, return_lse=True),
                          B=B, H=H, Sq=Sq, poison_value=float("nan"))
    check_rows(kernel, out, lse, want, (inp["q"], inp["k"], inp["v"]), {"mask": mask})
