"""The per-call host path of the compiled kernel (issue 16, "small calls"), on the CPU build.

- Argument checks are cached per call signature (_args.py): a good call must not let a later bad call with the
  same shapes through. Every check that depends on something outside the key (the rel_pos_index values, the
  identity and version of the index tensor) still runs on each call, and every metadata difference (strides,
  dtype, device, scale, window) is a different key.
- Eager calls go straight into the kernel (_autograd.py): no frame of torch.library's Python autograd kernel runs,
  and the gradients are the same numbers as those of the registered formula (the route of torch.ops callers and
  torch.compile).
"""

import sys

import pytest
import torch
from swin_index import swin_relative_index

WS = 7
N = WS * WS
ROWS = (2 * WS - 1) ** 2
H = 2


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _swin_index():
    return swin_relative_index(WS)


def _shift_mask(nw):
    region = torch.randint(0, 4, (nw, N))
    return torch.where(region[:, :, None] == region[:, None, :], 0.0, -100.0)


def _window_inputs(grad=False, batch=4):
    q, k, v = (torch.randn(batch, N, H, 32).requires_grad_(grad) for _ in range(3))
    table = (torch.randn(ROWS, H) * 0.5).requires_grad_(grad)
    return q, k, v, table


# ---- the validation cache never skips a check ----------------------------------------------------------------


def _good_window_call(kernel):
    q, k, v, table = _window_inputs()
    index, mask = _swin_index(), _shift_mask(2)
    kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index, mask=mask, scale=0.5)
    return q, k, v, table, index, mask


def _window_bad_cases():
    """Bad calls with the same shapes as the good call above (so a cache keyed too loosely would let them pass)."""

    def bad_index_value(kernel, q, k, v, table, index, mask):
        fresh = index.clone()
        fresh[5, 17] = ROWS
        kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=fresh, mask=mask, scale=0.5)

    def same_index_changed_in_place(kernel, q, k, v, table, index, mask):
        index[5, 17] = -1
        kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index, mask=mask, scale=0.5)

    def smaller_table_same_index(kernel, q, k, v, table, index, mask):
        kernel.window_attention(q, k, v, rel_pos_table=table[:100], rel_pos_index=index, mask=mask, scale=0.5)

    def k_strided_last_dim(kernel, q, k, v, table, index, mask):
        k2 = torch.randn(4, N, 32, H).transpose(-1, -2)  # same shape, stride(-1) != 1
        kernel.window_attention(q, k2, v, rel_pos_table=table, rel_pos_index=index, mask=mask, scale=0.5)

    def k_other_dtype(kernel, q, k, v, table, index, mask):
        kernel.window_attention(q, k.bfloat16(), v, rel_pos_table=table, rel_pos_index=index, mask=mask, scale=0.5)

    def v_on_meta(kernel, q, k, v, table, index, mask):
        kernel.window_attention(q, k, v.to("meta"), rel_pos_table=table, rel_pos_index=index, mask=mask, scale=0.5)

    def nan_scale(kernel, q, k, v, table, index, mask):
        kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index, mask=mask, scale=float("nan"))

    def float_index(kernel, q, k, v, table, index, mask):
        kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index.float(), mask=mask, scale=0.5)

    def bool_mask(kernel, q, k, v, table, index, mask):
        kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index, mask=mask > 0, scale=0.5)

    def mask_as_array(kernel, q, k, v, table, index, mask):
        kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index, mask=mask.numpy(), scale=0.5)

    return {
        "bad_index_value": (bad_index_value, IndexError, "169 rows"),
        "same_index_changed_in_place": (same_index_changed_in_place, IndexError, "value -1"),
        "smaller_table_same_index": (smaller_table_same_index, IndexError, "100 rows"),
        "k_strided_last_dim": (k_strided_last_dim, ValueError, "contiguous last dim"),
        "k_other_dtype": (k_other_dtype, ValueError, "dtype"),
        "v_on_meta": (v_on_meta, ValueError, "device"),
        "nan_scale": (nan_scale, ValueError, "finite"),
        "float_index": (float_index, ValueError, "integer"),
        "bool_mask": (bool_mask, ValueError, "additive float"),
        "mask_as_array": (mask_as_array, ValueError, "additive float"),
    }


@pytest.mark.parametrize("case", list(_window_bad_cases()))
def test_window_attention_rejects_bad_input_after_a_cached_good_call(kernel, case):
    fn, error, words = _window_bad_cases()[case]
    inputs = _good_window_call(kernel)
    _good_window_call(kernel)  # the signature is cached now
    with pytest.raises(error, match=words):
        fn(kernel, *inputs)


def _attention_bad_cases():
    """(call, error, words): each call replaces one argument of the good call below by a bad one of the same
    shape (or an equivalent good one: the last case)."""

    def call(kernel, a, **changes):
        return kernel.attention(a["q"], a["k"], a["v"], **{**{n: a[n] for n in ("bias", "mask", "key_padding_mask",
                                                                                 "window")}, **changes})

    return {
        "window_negative": (lambda kern, a: call(kern, a, window=(-3, 2)), ValueError, "window"),
        "window_float": (lambda kern, a: call(kern, a, window=(3.0, 2)), TypeError, "must be an int"),
        "bias_int": (lambda kern, a: call(kern, a, bias=a["bias"].long()), ValueError, "floating-point"),
        "mask_float": (lambda kern, a: call(kern, a, mask=a["mask"].float()), ValueError, "bool"),
        "kpm_float": (lambda kern, a: call(kern, a, key_padding_mask=a["key_padding_mask"].float()), ValueError,
                      "key_padding_mask"),
        "q_as_list": (lambda kern, a: call(kern, dict(a, q=a["q"].tolist())), ValueError, "torch.Tensor"),
        # not an error: any bias strides are read (strides of the bias are not part of the checks)
        "bias_strided_same_shape": (
            lambda kern, a: call(kern, a, bias=a["bias"].transpose(-1, -2).contiguous().transpose(-1, -2)), None,
            None),
    }


@pytest.mark.parametrize("case", list(_attention_bad_cases()))
def test_attention_rejects_bad_input_after_a_cached_good_call(kernel, case):
    fn, error, words = _attention_bad_cases()[case]
    a = {n: torch.randn(2, 16, H, 32) for n in ("q", "k", "v")}
    a.update(bias=torch.randn(1, H, 16, 16), mask=torch.rand(16, 16) > 0.1, window=(3, 2),
             key_padding_mask=torch.ones(2, 16, dtype=torch.bool))
    for _ in range(2):
        want = kernel.attention(a["q"], a["k"], a["v"], bias=a["bias"], mask=a["mask"],
                                key_padding_mask=a["key_padding_mask"], window=a["window"])
    if error is None:
        torch.testing.assert_close(fn(kernel, a), want)
        return
    with pytest.raises(error, match=words):
        fn(kernel, a)


def test_plans_are_bounded(kernel, monkeypatch):
    """Dynamic shapes must not grow the validation cache without bound."""
    args = kernel._args
    monkeypatch.setattr(args, "_MAX_PLANS", 4)
    args._plans.clear()
    for s in range(1, 12):
        q = torch.randn(1, s, 1, 8)
        kernel.attention(q, q, q)
        assert len(args._plans) <= 4
    assert len(args._plans) >= 1


def test_the_cache_keeps_no_tensor_alive(kernel):
    """Keys and plans hold metadata only (shapes, dtypes, devices), never a tensor or a view of one."""
    import gc
    import weakref

    q, k, v, table = _window_inputs()
    index, mask, bias = _swin_index(), _shift_mask(2), torch.randn(1, H, N, N)
    kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index, mask=mask, bias=bias[0])
    kernel.attention(q, k, v, bias=bias[0, 0], mask=mask[0] > 0)
    refs = [weakref.ref(t) for t in (q, k, v, table, index, mask, bias)]
    del q, k, v, table, index, mask, bias
    gc.collect()
    assert all(r() is None for r in refs)


def test_uncacheable_arguments_are_still_checked(kernel):
    """A window given as a list or a 0-d tensor scale is not a cache key; both still go through every check."""
    q, k, v = (torch.randn(1, 16, H, 32) for _ in range(3))
    want = kernel.reference.attention(q, k, v, window=(3, 2), scale=0.3)
    torch.testing.assert_close(kernel.attention(q, k, v, window=[3, 2], scale=torch.tensor(0.3)), want)
    with pytest.raises(ValueError, match="finite"):
        kernel.attention(q, k, v, window=[3, 2], scale=torch.tensor(float("inf")))
    with pytest.raises(ValueError, match="window"):
        kernel.attention(q, k, v, window=[-3, 2])


# ---- the eager route --------------------------------------------------------------------------------------------


def _frames_from(path_part, fn):
    """Names of the functions defined in files whose path contains `path_part` that ran during fn()."""
    seen = set()

    def profile(frame, event, arg):
        if event == "call" and path_part in frame.f_code.co_filename:
            seen.add(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_eager_calls_skip_the_python_autograd_kernel(kernel, grad):
    """torch.library's autograd kernel (torch/_library/autograd.py) cost ~6 us per call without gradients and ~60 us
    with them on one 7x7 window; eager calls do not enter it. A direct torch.ops call still does."""
    q, k, v, table = _window_inputs(grad=grad)
    index, mask = _swin_index(), _shift_mask(2)
    lib = "torch/_library/autograd.py"
    seen = _frames_from(lib, lambda: kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index,
                                                             mask=mask))
    assert not seen, f"eager window_attention ran {sorted(seen)} from {lib}"
    bias = torch.randn(1, H, N, N, requires_grad=grad)
    seen = _frames_from(lib, lambda: kernel.attention(q, k, v, bias=bias, return_lse=True))
    assert not seen, f"eager attention ran {sorted(seen)} from {lib}"
    seen = _frames_from(lib, lambda: kernel._ops.ops.fwd(q, k, v, None, None, None, table, index, 0.1, False, -1,
                                                         -1, False))
    assert "autograd_impl" in seen  # the detector works


def test_eager_gradients_equal_those_of_the_registered_formula(kernel):
    """Window attention with table, shift mask and an extra bias: eager route vs the op through the dispatcher."""
    q, k, v, table = _window_inputs(grad=True)
    index, mask = _swin_index().int(), _shift_mask(2)
    bias = torch.randn(1, H, N, N, requires_grad=True)
    dout = torch.randn(4, N, H, 32)
    out = kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index, bias=bias, mask=mask)
    eager = torch.autograd.grad(out, (q, k, v, table, bias), dout)

    a = kernel._args.window_attention_args(q, k, v, rel_pos_table=table, rel_pos_index=index, bias=bias, mask=mask)
    out_op, _ = kernel._ops.ops.fwd(*a.as_tuple())
    registered = torch.autograd.grad(out_op, (q, k, v, table, bias), dout)
    assert torch.equal(out, out_op)
    for name, x, y in zip(("dq", "dk", "dv", "dtable", "dbias"), eager, registered):
        assert x.dtype == y.dtype and torch.equal(x, y), f"{name} differs between the eager and registered routes"


def test_eager_lse_gradient_equals_that_of_the_registered_formula(kernel):
    q, k, v = (torch.randn(2, 24, H, 16, requires_grad=True) for _ in range(3))
    bias = torch.randn(2, 1, 24, 24, dtype=torch.float32, requires_grad=True)
    kpm = torch.ones(2, 24, dtype=torch.bool)
    kpm[1, 20:] = False
    gout, glse = torch.randn(2, 24, H, 16), torch.randn(2, H, 24)
    out, lse = kernel.attention(q, k, v, bias=bias, key_padding_mask=kpm, causal=True, return_lse=True)
    eager = torch.autograd.grad((out, lse), (q, k, v, bias), (gout, glse), retain_graph=True)
    lse_only = torch.autograd.grad(lse, (q, k, v, bias), glse)  # grad_out arrives as None

    a = kernel._args.attention_args(q, k, v, bias=bias, key_padding_mask=kpm, causal=True)
    out_op, lse_op = kernel._ops.ops.fwd(*a.as_tuple())
    registered = torch.autograd.grad((out_op, lse_op), (q, k, v, bias), (gout, glse), retain_graph=True)
    registered_lse_only = torch.autograd.grad(lse_op, (q, k, v, bias), glse)
    for x, y in zip(eager + lse_only, registered + registered_lse_only):
        assert torch.equal(x, y)


def test_no_grad_and_inference_mode_calls_record_no_graph(kernel):
    q, k, v, table = _window_inputs(grad=True)
    index = _swin_index()
    with torch.no_grad():
        out = kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)
    assert out.grad_fn is None and not out.requires_grad
    with torch.inference_mode():
        out2 = kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)
    assert out2.is_inference() and torch.equal(out, out2)
    out3 = kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)
    assert out3.grad_fn is not None and torch.equal(out3.detach(), out)


# ---- the CPU forward's scratch is reused uninitialized --------------------------------------------------------


@pytest.mark.parametrize("isa", ["default", "avx2", "generic"])
def test_cpu_forward_scratch_reuse_reads_nothing_stale(kernel, monkeypatch, isa):
    """The forward's tile scratch comes from a per-thread arena kept between calls, without a zero fill
    (ScratchLease, kernel-src/cpu/cpu_common.h). A call that leaves NaN in every buffer it touches, then calls of
    other shapes, dtypes, head dims and score terms, must each match the reference: a buffer read before it is
    written (a padding column, an accumulator row) would show the previous call's NaN. Also a call above the
    arena's keep limit (its own allocation) between two small ones."""
    if kernel.interface.BUILD_DEVICE != "cpu":
        pytest.skip("CPU kernel scratch")
    if isa != "default":
        monkeypatch.setenv("WINATTN_CPU_ISA", isa)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one arena: every call below reuses the one the NaN call dirtied
    try:
        for dtype in (torch.float32, torch.bfloat16):
            big = [torch.full((2, 130, 4, 64), float("nan"), dtype=dtype) for _ in range(3)]
            assert kernel.attention(*big, bias=torch.randn(1, 4, 130, 130)).isnan().all()
            q, k, v, table = (t.to(dtype) for t in _window_inputs(batch=2))
            table = table.float()
            index, mask = _swin_index(), _shift_mask(2)
            got = kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index, mask=mask)
            want = kernel.reference.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index, mask=mask)
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)
            # wide GQA group at D = 256: ~8 MB of scratch, above the keep limit (allocated for that call only)
            qg = torch.randn(1, 9, 32, 256).to(dtype)
            kg, vg = (torch.randn(1, 9, 1, 256).to(dtype) for _ in range(2))
            torch.testing.assert_close(kernel.attention(qg, kg, vg), kernel.reference.attention(qg, kg, vg),
                                       atol=tol, rtol=tol)
            qs, ks, vs = (torch.randn(3, 5, 2, 16).to(dtype) for _ in range(3))
            kpm = torch.tensor([[True] * 5, [True, True, False, True, False], [False] * 4 + [True]])
            torch.testing.assert_close(kernel.attention(qs, ks, vs, key_padding_mask=kpm, causal=True),
                                       kernel.reference.attention(qs, ks, vs, key_padding_mask=kpm, causal=True),
                                       atol=tol, rtol=tol)
    finally:
        torch.set_num_threads(threads)


# ---- the op allocates its outputs through the C shim ------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 7, 3, 16), (0, 7, 3, 16), (2, 0, 3, 16), (1, 1, 1, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_op_outputs_are_contiguous_tensors_of_the_right_dtype(kernel, device, shape, dtype):
    """out / lse come from aoti_torch_empty_strided (torch_binding.cpp new_contiguous) rather than
    torch::stable::new_empty: same shapes, dtypes, device and contiguous strides as torch.empty gives (zero-size
    dims included), and new tensors that require no gradient."""
    if device == "cuda" and dtype == torch.float32:
        dtype = torch.float16
    q = torch.randn(shape, device=device).to(dtype)
    out, lse = kernel._ops.ops.fwd(q, q, q, None, None, None, None, None, 0.25, False, -1, -1, False)
    B, S, H, D = shape
    for t, want_shape, want_dtype in ((out, shape, dtype), (lse, (B, H, S), torch.float32)):
        assert tuple(t.shape) == want_shape and t.dtype == want_dtype and t.device == q.device
        assert t.stride() == torch.empty(want_shape).stride()
        assert not t.requires_grad and t.data_ptr() != q.data_ptr() or t.numel() == 0
    if q.numel():
        torch.testing.assert_close(out.float(), kernel.reference.attention(q, q, q, scale=0.25).float(),
                                   atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("shape", [(2, 7, 4, 16), (0, 7, 4, 16), (2, 0, 4, 16), (1, 1, 2, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bwd_op_outputs_are_contiguous_tensors_of_the_right_dtype(kernel, device, shape, dtype):
    """The backward's dq / dk / dv and its empty dbias / dtable come from the C shim too (new_contiguous): dk / dv
    shaped as the GQA k / v (half q's heads), contiguous, new tensors; the gradients those of the reference."""
    if device == "cuda" and dtype == torch.float32:
        dtype = torch.float16
    B, S, H, D = shape
    q = torch.randn(shape, device=device).to(dtype)
    k, v = (torch.randn(B, S, H // 2, D, device=device).to(dtype) for _ in range(2))
    g = torch.randn(shape, device=device).to(dtype)
    ops = kernel._ops.ops
    out, lse = ops.fwd(q, k, v, None, None, None, None, None, 0.25, False, -1, -1, False)
    dq, dk, dv, dbias, dtable = ops.bwd(g, q, k, v, out, lse, None, None, None, None, None, 0.25, False, -1, -1,
                                        False, False, False, None)
    for t, like in ((dq, q), (dk, k), (dv, v)):
        assert t.shape == like.shape and t.dtype == dtype and t.device == q.device
        assert t.stride() == torch.empty(like.shape).stride()
        assert not t.requires_grad and (t.numel() == 0 or t.data_ptr() not in (q.data_ptr(), g.data_ptr()))
    for t in (dbias, dtable):
        assert t.shape == (0,) and t.dtype == torch.float32 and t.device == q.device
    if q.numel():
        leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
        kernel.reference.attention(*leaves, scale=0.25).backward(g.float())
        for got, leaf in zip((dq, dk, dv), leaves):
            torch.testing.assert_close(got.float(), leaf.grad, atol=3e-2, rtol=3e-2)


def test_bench_host_times_forward_and_backward(kernel, device):
    """benchmarks/bench_host.py's cases for this build's device run, its forward + backward one included (a smoke
    run: the timing itself is read on a quiet machine, RESULTS v5.10)."""
    from argparse import Namespace

    from repo_modules import load_repo_module

    bench = load_repo_module("benchmarks/bench_host.py")
    if device == "cuda":
        rows = bench.run_cuda(kernel, Namespace(rounds=1, calls=2, warmup=1, sleep_ms=1.0))
        fb, times = "short plain f+b", [(r["ours_host_us"], r.get("sdpa_host_us", 1.0)) for r in rows]
    else:
        threads = torch.get_num_threads()
        try:
            rows = bench.run_cpu(kernel, Namespace(threads=1, rounds=1, calls=2, warmup=1))
        finally:
            torch.set_num_threads(threads)
        fb, times = "plain f+b", [(r["ours_us"], r["sdpa_us"]) for r in rows]
    cases = {(r["case"], r["grad"]) for r in rows}
    assert (fb, True) in cases and (fb, False) not in cases
    assert all(ours > 0 and peer > 0 for ours, peer in times)


@pytest.mark.parametrize("isa", ["default", "avx2", "generic"])
def test_cpu_table_term_gather_reads_any_strides(kernel, monkeypatch, isa):
    """The table term is gathered W keys at a time (Vec::gather in kernel-src/cpu/simd_*.h) with the table's row
    stride and the index's column stride: a transposed table ([H, T].t(): row stride 1) and a transposed index
    (column stride N), with N = 49 keys (six vectors and a one-key tail), must match the reference, forward and
    gradients."""
    if kernel.interface.BUILD_DEVICE != "cpu":
        pytest.skip("CPU kernel code paths")
    if isa != "default":
        monkeypatch.setenv("WINATTN_CPU_ISA", isa)
    q, k, v, _ = _window_inputs(grad=True, batch=2)
    table = (torch.randn(H, ROWS) * 0.5).t().requires_grad_(True)
    # rows flipped (so a gather along the wrong dim reads other values), then stored transposed: column stride N
    index = torch.flip(_swin_index(), (0,)).t().contiguous().t()
    assert table.stride() == (1, ROWS) and index.stride() == (1, N)
    got = kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)
    want = kernel.reference.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    dout = torch.randn_like(got)
    g = torch.autograd.grad(got, (q, table), dout)
    w = torch.autograd.grad(want, (q, table), dout)
    for x, y in zip(g, w):
        torch.testing.assert_close(x, y, atol=1e-4, rtol=1e-4)


# ---- CPU: the op checks the index range, the API raises the IndexError -----------------------------------------


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_cpu_bad_index_is_the_index_error_of_every_build(kernel, monkeypatch, grad, index_dtype):
    """On the CPU build window_attention leaves the rel_pos_index range to the op (interface._OP_CHECKS_INDEX: it
    checks host memory on every call anyway) and turns its RuntimeError into check_rel_pos_index's IndexError:
    same type and message as the CUDA build, computed from the caller's tensor (an int32 index reaches the op as
    an int64 copy), without the op's error as context. Other op errors pass through unchanged."""
    if kernel.interface.BUILD_DEVICE != "cpu":
        pytest.skip("the CPU op's own index check")
    q, k, v, table = _window_inputs(grad=grad)
    index = _swin_index().to(index_dtype)
    kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)
    index[5, 17] = ROWS + 3
    with pytest.raises(IndexError, match=rf"value {ROWS + 3} at \(5, 17\).* {ROWS} rows") as info:
        kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)
    assert info.value.__context__ is None and info.value.__cause__ is None

    def boom(*args, **kwargs):
        raise RuntimeError("window_attention: something else")

    monkeypatch.setattr(kernel._autograd, "run_fwd", boom)
    index[5, 17] = 0
    with pytest.raises(RuntimeError, match="something else"):
        kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)

    def index_words(*args, **kwargs):  # an op error naming the index that the Python check does not confirm
        raise RuntimeError("window_attention: rel_pos_index must be [Sq, Sk]")

    monkeypatch.setattr(kernel._autograd, "run_fwd", index_words)
    with pytest.raises(RuntimeError, match=r"must be \[Sq, Sk\]"):
        kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index)
