"""Hostile or malformed inputs to the kernel API (issue 13, items 10 and 11), on the CPU kernel and the reference.

- `rel_pos_index` outside the table: IndexError before any kernel runs (the kernels gather the table and the
  backward scatters dtable through the index without bounds checks), also after an in-place change of an index
  that passed before, inside a compiled graph, and at the op level (RuntimeError).
- NaN in q, k, bias or the table propagates as in SDPA (row with a NaN score -> NaN out and lse), a NaN in a
  hidden key stays hidden, fully masked rows stay 0.
- Window sides: ints only (TypeError for float / bool), any size (near INT64_MAX = unbounded); H_kv = 0 is a
  ValueError; `trust_remote_code` of a wrong type is a TypeError naming it.

Expected values come from `kernel.reference` in float64 (the comparisons of tests/test_attention.py).
"""

import pytest
import torch
from swin_index import swin_relative_index

WS = 7
N = WS * WS
ROWS = (2 * WS - 1) ** 2  # 169 table rows
H = 2


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _swin_index():
    return swin_relative_index(WS)


def _window_inputs(dtype=torch.float32, grad=False):
    q, k, v = (torch.randn(4, N, H, 32).to(dtype).requires_grad_(grad) for _ in range(3))
    table = (torch.randn(ROWS, H) * 0.5).requires_grad_(grad)
    return q, k, v, table


BAD_VALUES = {"minus_one": -1, "one_past_the_end": ROWS, "huge": 2**40, "most_negative": -(2**63)}


def _with_bad_entry(value, dtype=torch.long):
    index = _swin_index().to(dtype)
    index[5, 17] = value
    return index


# ---- rel_pos_index range ------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("bad", list(BAD_VALUES), ids=str)
def test_out_of_range_index_raises_index_error(kernel, impl, bad):
    mod = kernel if impl == "kernel" else kernel.reference
    q, k, v, table = _window_inputs(grad=True)
    with pytest.raises(IndexError, match=r"rel_pos_index has value .* at \(5, 17\).* 169 rows"):
        mod.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=_with_bad_entry(BAD_VALUES[bad]))


def test_int32_index_is_checked(kernel):
    q, k, v, table = _window_inputs()
    index = _with_bad_entry(ROWS, torch.int32)
    with pytest.raises(IndexError, match="169 rows"):
        kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)


def test_in_place_change_of_a_checked_index_is_rechecked(kernel):
    """The first-seen cache is keyed on the version counter: an index that passed, then modified in place (also
    through a view), is checked again."""
    q, k, v, table = _window_inputs()
    index = _swin_index()
    out = kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)
    torch.testing.assert_close(out, kernel.reference.window_attention(q, k, v, rel_pos_table=table,
                                                                      rel_pos_index=index))
    index[0, 0] = ROWS
    with pytest.raises(IndexError, match="169 rows"):
        kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)
    index[0, 0] = 0
    kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)
    index.view(-1)[1] = -1  # a write through a view bumps the shared version counter
    with pytest.raises(IndexError, match="value -1"):
        kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)
    index.view(-1)[1] = 0
    smaller = table[:100]  # same (cached) index, a table too small for it
    with pytest.raises(IndexError, match="100 rows"):
        kernel.window_attention(q, k, v, rel_pos_table=smaller, rel_pos_index=index)


def test_range_is_computed_once_per_index_tensor(kernel, monkeypatch):
    """Steady state: no recomputation of the index range (on CUDA each one is a device -> host sync). The CPU
    build's window_attention leaves the range to the op, which reads the host-memory index on every call anyway
    (interface._OP_CHECKS_INDEX): there the API must not compute it at all, and the cache is exercised through
    check_rel_pos_index itself."""
    bounds = kernel._index_bounds
    calls = []
    real = bounds._range
    monkeypatch.setattr(bounds, "_range", lambda index: calls.append(1) or real(index))
    q, k, v, table = _window_inputs()
    index = _swin_index()

    def call():
        kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)

    if kernel.interface.BUILD_DEVICE == "cpu":
        for _ in range(3):
            call()
        assert not calls

        def call():  # noqa: F811 - the cache itself
            bounds.check_rel_pos_index(index, ROWS)

    for _ in range(5):
        call()
    assert len(calls) == 1
    index.add_(0)  # in place: re-checked once
    for _ in range(3):
        call()
    assert len(calls) == 2
    del index  # a dead tensor leaves no entry behind (its id may be reused by another tensor)
    assert all(ref() is not None for ref, *_ in bounds._seen.values())


@pytest.mark.parametrize("impl", ["kernel", "reference"])
def test_flat_index_is_checked_as_the_callers_tensor(kernel, impl, monkeypatch):
    """A flat [N * N] index (timm's RelPosBias keeps its index so) is range-checked on the caller's tensor, not on
    the [N, N] view made of it (a new tensor every call): IndexError out of range, and one range computation for
    any number of calls (the reference takes the Python check on every build, as the CUDA build does)."""
    mod = kernel if impl == "kernel" else kernel.reference
    q, k, v, table = _window_inputs()
    with pytest.raises(IndexError, match=r"rel_pos_index has value 169 at \(262,\).* 169 rows"):
        mod.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=_with_bad_entry(ROWS).flatten())
    bounds = kernel._index_bounds
    calls = []
    real = bounds._range
    monkeypatch.setattr(bounds, "_range", lambda index: calls.append(1) or real(index))
    flat = _swin_index().flatten()
    for _ in range(3):
        out = mod.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=flat)
    assert len(calls) == (1 if impl == "reference" else 0)
    torch.testing.assert_close(out, kernel.reference.window_attention(q, k, v, rel_pos_table=table,
                                                                      rel_pos_index=_swin_index()))


def test_inference_tensor_index_is_checked_every_call(kernel):
    """Inference tensors have no version counter, so they are never cached."""
    q, k, v, table = _window_inputs()
    with torch.inference_mode():
        index = _swin_index()
        kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)
        index[3, 3] = ROWS
        with pytest.raises(IndexError, match="169 rows"):
            kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)


def test_compiled_graph_checks_the_index(kernel):
    """Under torch.compile the eager check is skipped while tracing; the graph's check op runs on the real index,
    so an in-place change after compilation still raises IndexError (not the op-level RuntimeError)."""
    q, k, v, table = _window_inputs()
    index = _swin_index()

    def f(q, k, v, table, index):
        return kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index) * 2.0

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, table, index), f(q, k, v, table, index))
    index[2, 2] = ROWS
    with pytest.raises(IndexError, match="169 rows"):
        compiled(q, k, v, table, index)


def test_check_op_passes_opcheck(kernel):
    index = _swin_index()
    torch.library.opcheck(kernel.interface._check_rel_pos_index._opoverload, (index, ROWS))


def _op_args(index):
    q, k, v, table = _window_inputs()
    return q, k, v, table, index


@pytest.mark.parametrize("bad", list(BAD_VALUES), ids=str)
def test_op_level_forward_rejects_out_of_range_index(kernel, bad):
    """torch.ops calls bypass the Python layer: the CPU op checks the index itself on every call."""
    q, k, v, table, index = _op_args(_with_bad_entry(BAD_VALUES[bad]))
    with pytest.raises(RuntimeError, match=r"rel_pos_index\[5, 17\] = .* out of range .* 169 rows"):
        kernel._ops.ops.fwd(q, k, v, None, None, None, table, index, 0.2, False, -1, -1, False)


@pytest.mark.parametrize("bad", ["minus_one", "one_past_the_end"])
def test_op_level_backward_never_scatters_out_of_range(kernel, bad):
    """The backward scatters dtable[rel_index[i, j], h] += dS: an out-of-range entry would write outside dtable
    (heap corruption); the op refuses before the kernel runs."""
    q, k, v, table, good = _op_args(_swin_index())
    out, lse = kernel._ops.ops.fwd(q, k, v, None, None, None, table, good, 0.2, False, -1, -1, False)
    index = _with_bad_entry(BAD_VALUES[bad])
    with pytest.raises(RuntimeError, match="out of range"):
        kernel._ops.ops.bwd(torch.randn_like(out), q, k, v, out, lse, None, None, None, table, index, 0.2, False,
                            -1, -1, False, True, False)


def test_edge_indices_still_pass_and_scatter_correctly(kernel):
    """0 and rows - 1 are valid: the check must not be off by one, and dtable lands where the reference puts it
    (checked beside an out-of-range call, which raises and leaves nothing behind)."""
    q, k, v, table = _window_inputs(grad=True)
    index = torch.randint(0, ROWS, (N, N))
    index[0, 0], index[1, 1] = 0, ROWS - 1
    bad = index.clone()
    bad[1, 1] = ROWS
    with pytest.raises(IndexError):
        kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=bad)
    out = kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)
    t64 = table.detach().double().requires_grad_()
    ref = kernel.reference.window_attention(q.detach().double(), k.detach().double(), v.detach().double(),
                                            rel_pos_table=t64, rel_pos_index=index)
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g.double())
    torch.testing.assert_close(table.grad.double(), t64.grad, atol=1e-4, rtol=1e-4)


# ---- NaN propagation ----------------------------------------------------------------------------------------


def _compare_with_nans(kernel, got, got_lse, **kw):
    ref, ref_lse = kernel.reference.attention(**kw, return_lse=True)
    assert torch.isnan(ref).any(), "the case must put a NaN somewhere"
    assert torch.equal(torch.isnan(got), torch.isnan(ref)), "NaN pattern of out differs from the reference"
    assert torch.equal(torch.isnan(got_lse), torch.isnan(ref_lse)), "NaN pattern of lse differs from the reference"
    torch.testing.assert_close(got.double(), ref.double(), equal_nan=True, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(got_lse.double(), ref_lse.double(), equal_nan=True, atol=2e-5, rtol=2e-5)


def _nan_case(where):
    B, S, Hq, D = 2, 70, 2, 32  # two key tiles: the NaN sits in the second one for some rows
    q, k, v = (torch.randn(B, S, Hq, D) for _ in range(3))
    bias = torch.randn(B, Hq, S, S)
    kpm = torch.ones(B, S, dtype=torch.bool)
    kpm[1, 60:] = False
    kpm[1, 3] = False
    if where == "q":
        q[0, 5, 1, 7] = float("nan")
    elif where == "k":
        k[0, 66, 0, 2] = float("nan")  # a visible key: every row of batch 0, head 0 -> NaN
        k[1, 3, 1, 0] = float("nan")  # a padded-out key: hidden, batch 1 stays finite
    elif where == "bias":
        bias[1, 0, 9, 64] = float("nan")
        bias[0, 1, 2, 5] = float("nan")
    return dict(q=q, k=k, v=v, bias=bias, key_padding_mask=kpm)


@pytest.mark.parametrize("isa", ["best", "generic"])
@pytest.mark.parametrize("where", ["q", "k", "bias"])
def test_nan_propagates_like_sdpa(kernel, monkeypatch, isa, where):
    if isa != "best":
        monkeypatch.setenv("WINATTN_CPU_ISA", isa)
    kw = _nan_case(where)
    got, lse = kernel.attention(**kw, return_lse=True)
    _compare_with_nans(kernel, got, lse, **kw)
    # SDPA on batch 0, which has no hidden keys. (SDPA adds its mask, so there a NaN score of a hidden key
    # poisons the row too; the op hides such keys as masked_fill, the reference and FlashAttention do.)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        kw["q"][:1].transpose(1, 2), kw["k"][:1].transpose(1, 2), kw["v"][:1].transpose(1, 2), attn_mask=kw["bias"][:1]
    ).transpose(1, 2)
    assert torch.isnan(sdpa).any()
    assert torch.equal(torch.isnan(got[:1]), torch.isnan(sdpa)), "NaN pattern differs from SDPA"


@pytest.mark.parametrize("isa", ["best", "generic"])
def test_nan_in_table_propagates_and_masked_rows_stay_zero(kernel, monkeypatch, isa):
    if isa != "best":
        monkeypatch.setenv("WINATTN_CPU_ISA", isa)
    q, k, v, table = _window_inputs()
    table = table.detach().clone()
    index = _swin_index()
    table[index[4, 9], 1] = float("nan")  # every (i, j) sharing that offset, head 1
    got = kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)
    ref = kernel.reference.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)
    assert torch.isnan(ref).any()
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    torch.testing.assert_close(got, ref, equal_nan=True, atol=2e-5, rtol=2e-5)
    # -inf (masked) is not NaN: a fully masked row is 0 with lse -inf, next to NaN rows
    kw = _nan_case("q")
    kw["key_padding_mask"][0] = False
    kw["q"][1, 0, 0, 0] = float("nan")
    out, lse = kernel.attention(**kw, return_lse=True)
    assert (out[0] == 0).all() and (lse[0] == float("-inf")).all()
    _compare_with_nans(kernel, out, lse, **kw)


# ---- windows, head counts, trust_remote_code ----------------------------------------------------------------

INT64_MAX = 2**63 - 1


# causal bounds the right side by 0 itself, so a huge right side matters without causal only
HUGE_WINDOWS = {"max_max": ((INT64_MAX, INT64_MAX), False), "max_3": ((INT64_MAX - 5, 3), False),
                "2_max": ((2, INT64_MAX), False), "max_max_causal": ((INT64_MAX, INT64_MAX), True),
                "max_3_causal": ((INT64_MAX - 5, 3), True)}


@pytest.mark.parametrize("case", list(HUGE_WINDOWS))
def test_huge_window_sides_are_unbounded(kernel, case):
    window, causal = HUGE_WINDOWS[case]
    q, k, v = (torch.randn(2, 70, 2, 32) for _ in range(3))
    k, v = k[:, :50], v[:, :50]  # Sq != Sk: the band offset is nonzero
    unbounded = tuple(-1 if w > 1000 else w for w in window)
    got = kernel.attention(q, k, v, window=window, causal=causal)
    ref = kernel.reference.attention(q.double(), k.double(), v.double(), window=unbounded, causal=causal)
    torch.testing.assert_close(got.double(), ref, atol=2e-5, rtol=2e-5)
    # the op itself (no Python clamp) as well
    out, _ = kernel._ops.ops.fwd(q, k, v, None, None, None, None, None, 32**-0.5, causal, window[0], window[1], False)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("impl", ["kernel", "reference"])
@pytest.mark.parametrize("window", [(2.5, 3), (3, 4.0), (True, 2), (2, False), ("3", 2)],
                         ids=["float_left", "float_right", "bool_left", "bool_right", "str_left"])
def test_window_sides_must_be_ints(kernel, impl, window):
    mod = kernel if impl == "kernel" else kernel.reference
    q, k, v = (torch.randn(1, 16, 2, 32) for _ in range(3))
    with pytest.raises(TypeError, match=r"window (left|right) side must be an int"):
        mod.attention(q, k, v, window=window)


def test_integer_like_window_sides_are_accepted(kernel):
    import numpy as np

    q, k, v = (torch.randn(1, 16, 2, 32) for _ in range(3))
    want = kernel.reference.attention(q, k, v, window=(3, 2))
    for window in [(np.int64(3), torch.tensor(2)), (3, None), [3, 2]]:
        got = kernel.attention(q, k, v, window=window)
        if window[1] is not None:
            torch.testing.assert_close(got, want)
    with pytest.raises(TypeError):
        kernel.attention(q, k, v, window=(2.0, 2))  # the case above that used to be truncated to 2


@pytest.mark.parametrize("impl", ["kernel", "reference"])
def test_zero_kv_heads_is_a_value_error(kernel, impl):
    mod = kernel if impl == "kernel" else kernel.reference
    q = torch.randn(1, 16, 2, 32)
    kv = torch.randn(1, 16, 0, 32)
    with pytest.raises(ValueError, match="at least one head"):
        mod.attention(q, kv, kv)


@pytest.mark.parametrize("setting", [1, 0, 2.5, [1], ["org/a", None]],
                         ids=["int_1", "int_0", "float", "list_of_int", "list_with_none"])
def test_trust_remote_code_of_wrong_type_is_a_type_error(setting, monkeypatch, tmp_path):
    import winattn
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # no network, whatever happens
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(TypeError, match="trust_remote_code must be a bool or a list of repository ids"):
        winattn.load("winattn/window-attention", trust_remote_code=setting)
    from winattn.trust import normalize

    assert normalize(("org/a",)) == ["org/a"] and normalize(True) is True and normalize(None) is False
