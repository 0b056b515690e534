"""Hostile inputs on the CUDA kernels (issue 13, items 10 and 11; marked `gpu`, skipped without a GPU).

An out-of-range `rel_pos_index` used to read outside the table on the GPU: one past the end returned garbage, -1
or a huge value was an illegal memory access that ended the CUDA context of the whole process. Now the Python
layer raises IndexError before any kernel runs, and the context stays usable: each case runs a normal call after
the refused one and checks it by the FlashAttention rule (_helpers.run_case). The check costs one device -> host
sync when an index tensor is first seen and none after (asserted with torch.cuda.set_sync_debug_mode).
"""

import pytest
import torch
from swin_index import swin_relative_index

from ._helpers import rand, run_case

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16
WS, H, D = 7, 3, 32
N = WS * WS
ROWS = (2 * WS - 1) ** 2

BAD_VALUES = {"minus_one": -1, "one_past_the_end": ROWS, "huge": 2**40, "most_negative": -(2**63)}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _index():
    return swin_relative_index(WS, "cuda")


def _inputs(index, grad=True):
    inp = {n: rand(8, N, H, D, dtype=BF16, grad=grad) for n in ("q", "k", "v")}
    inp["rel_pos_table"] = (torch.randn(ROWS, H, device="cuda") * 0.5).requires_grad_(grad)
    inp["rel_pos_index"] = index
    return inp


def _call(kernel, inp):
    return kernel.window_attention(inp["q"], inp["k"], inp["v"], rel_pos_table=inp["rel_pos_table"],
                                   rel_pos_index=inp["rel_pos_index"])


def _context_still_usable(kernel):
    torch.cuda.synchronize()  # a sticky error from the refused call would surface here
    run_case(kernel, _inputs(_index()), {}, swin=True)
    torch.cuda.synchronize()


@pytest.mark.parametrize("bad", list(BAD_VALUES))
def test_out_of_range_index_raises_and_context_survives(kernel, bad):
    index = _index()
    index[5, 17] = BAD_VALUES[bad]
    inp = _inputs(index)
    with pytest.raises(IndexError, match=r"rel_pos_index has value .* at \(5, 17\).* 169 rows"):
        _call(kernel, inp)
    _context_still_usable(kernel)


def test_in_place_change_after_a_good_call_is_rechecked(kernel):
    index = _index()
    inp = _inputs(index, grad=False)
    _call(kernel, inp)
    index[0, 0] = -1
    with pytest.raises(IndexError, match="value -1"):
        _call(kernel, inp)
    index[0, 0] = ROWS + 1000
    with pytest.raises(IndexError, match="169 rows"):
        _call(kernel, inp)
    _context_still_usable(kernel)


def test_int32_index_on_cuda(kernel):
    index = _index().int()
    index[1, 2] = ROWS
    with pytest.raises(IndexError, match="169 rows"):
        _call(kernel, _inputs(index, grad=False))
    _context_still_usable(kernel)


def test_no_host_sync_once_the_index_was_seen(kernel):
    inp = _inputs(_index(), grad=False)
    _call(kernel, inp)  # first sight: the one sync
    fresh = dict(inp, rel_pos_index=_index())
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            _call(kernel, inp)
        with pytest.raises(RuntimeError, match="synchroniz"):  # the detector works: a new index syncs once
            _call(kernel, fresh)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_compiled_graph_checks_the_index(kernel):
    index = _index()
    inp = _inputs(index, grad=False)

    def f(q, k, v, table, index):
        return kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index) * 2.0

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    args = (inp["q"], inp["k"], inp["v"], inp["rel_pos_table"], index)
    torch.testing.assert_close(compiled(*args), f(*args))
    index[3, 3] = ROWS
    with pytest.raises(IndexError, match="169 rows"):
        compiled(*args)
    _context_still_usable(kernel)


# ---- NaN and window sizes (the CPU side of these is in tests/security/test_kernel_inputs.py) -------------------


@pytest.mark.parametrize("where", ["q", "bias", "k_visible_and_padded"])
def test_nan_gives_nan_rows_like_the_reference(kernel, where):
    """A NaN score makes its row NaN (out and lse); a NaN in a key hidden by key_padding_mask stays hidden."""
    B, S = 2, 200
    q, k, v = (rand(B, S, H, 64, dtype=BF16) for _ in range(3))
    bias = rand(B, H, S, S, dtype=BF16)
    kpm = torch.ones(B, S, dtype=torch.bool, device="cuda")
    kpm[1, 120:] = False
    if where == "q":
        q[0, 17, 1, 3] = float("nan")
    elif where == "bias":
        bias[1, 2, 150, 99] = float("nan")
    else:
        k[0, 130, 1, 0] = float("nan")  # visible: every row of batch 0, head 1
        k[1, 130, 2, 0] = float("nan")  # padded out: batch 1 stays finite
    out, lse = kernel.attention(q, k, v, bias=bias, key_padding_mask=kpm, return_lse=True)
    ref, ref_lse = kernel.reference.attention(q.double(), k.double(), v.double(), bias=bias.double(),
                                              key_padding_mask=kpm, return_lse=True)
    assert torch.isnan(ref).any()
    assert torch.equal(torch.isnan(out), torch.isnan(ref)), "NaN pattern of out differs from the reference"
    assert torch.equal(torch.isnan(lse), torch.isnan(ref_lse)), "NaN pattern of lse differs from the reference"


@pytest.mark.parametrize("window,causal", [((2**63 - 1, 2**63 - 1), False), ((2**63 - 6, 3), True),
                                           ((5, 2**63 - 1), False)])
def test_huge_window_sides_are_unbounded(kernel, window, causal):
    inp = {"q": rand(2, 300, H, 64, dtype=BF16, grad=True), "k": rand(2, 260, H, 64, dtype=BF16, grad=True),
           "v": rand(2, 260, H, 64, dtype=BF16, grad=True)}
    run_case(kernel, inp, {"window": window, "causal": causal})  # ref64 with the side clamped = unbounded
