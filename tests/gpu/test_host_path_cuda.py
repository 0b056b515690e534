"""The CUDA forward's host path (issue 16, "small calls"; marked `gpu`, skipped without a GPU).

- One plan per call: the plan made for fwd_workspace_bytes is reused by the fwd() launch that follows with the
  same params, device and environment (kernel-src/cuda/winattn_cuda.cu, FwdPlanMemo). Back-to-back calls whose
  params differ only in what the plan depends on (dtype; a table, which adds workspace; the window count) must each
  get their own plan: outputs match the reference call after call.
- The WINATTN_* knobs are read through a per-thread cache (kernel-src/cuda/host_env.h), which must still see every
  change made at run time: with monkeypatch.setenv / delenv and os.environ between two calls, the kernel that the
  profiler sees launched follows the variable each time.
"""

import os

import pytest
import torch
from swin_index import swin_relative_index

from ._helpers import kernels_run, rand

pytestmark = pytest.mark.gpu

BF16, FP16 = torch.bfloat16, torch.float16
WS, NW, H, D = 7, 16, 2, 32
N = WS * WS


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _swin(dtype, batch=2, nw=NW, table=True, mask=True):
    q, k, v = (rand(batch * nw, N, H, D, dtype=dtype) for _ in range(3))
    kw = {}
    if table:
        kw["rel_pos_table"] = torch.randn((2 * WS - 1) ** 2, H, device="cuda") * 0.5
        kw["rel_pos_index"] = swin_relative_index(WS, "cuda")
    if mask:
        region = torch.randint(0, 4, (nw, N), device="cuda")
        kw["mask"] = torch.where(region[:, :, None] == region[:, None, :], 0.0, -100.0)
    return q, k, v, kw


def _check(kernel, q, k, v, kw):
    out = kernel.window_attention(q, k, v, **kw)
    f64 = {n: (t.double() if t.is_floating_point() else t) for n, t in kw.items()}
    want = kernel.reference.window_attention(q.double(), k.double(), v.double(), **f64)
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)


def test_each_call_gets_the_plan_of_its_own_params(kernel):
    """Same shapes back to back with another dtype, with and without the table (the workspace of the table term
    appears and goes), and another window count: a plan carried over from the previous call would launch with the
    wrong element type, a missing or undersized workspace or the wrong window grouping."""
    cases = [
        _swin(BF16), _swin(FP16), _swin(BF16, table=False), _swin(BF16), _swin(BF16, nw=4, batch=8),
        _swin(FP16, mask=False), _swin(BF16, table=False, mask=False), _swin(BF16),
    ]
    for _ in range(2):
        for q, k, v, kw in cases:
            _check(kernel, q, k, v, kw)


def _names(kernel, q, k, v, kw):
    return kernels_run(lambda: kernel.window_attention(q, k, v, **kw))


def _is_sm90(names):
    return any("sm90" in n for n in names)


def test_knobs_changed_at_run_time_are_seen(kernel, monkeypatch):
    """WINATTN_FORCE_KERNEL=v1 runs the v1 kernels on Hopper. Flipped between calls, through monkeypatch and through
    os.environ (set, changed, deleted), the launched kernels follow the variable on every call: the environment
    cache (host_env.h) notices each change, and no plan made under the old value is reused."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the sm90 / v1 choice exists on Hopper")
    knob = "WINATTN_FORCE_KERNEL"
    monkeypatch.delenv(knob, raising=False)
    q, k, v, kw = _swin(BF16)
    assert _is_sm90(_names(kernel, q, k, v, kw))
    monkeypatch.setenv(knob, "v1")
    names = _names(kernel, q, k, v, kw)
    assert names and not _is_sm90(names), names
    _check(kernel, q, k, v, kw)
    monkeypatch.setenv(knob, "fwd_v3,bwd_v1")
    assert _is_sm90(_names(kernel, q, k, v, kw))
    os.environ[knob] = "v1"  # back to a value seen before (glibc may reuse that string)
    assert not _is_sm90(_names(kernel, q, k, v, kw))
    del os.environ[knob]
    assert _is_sm90(_names(kernel, q, k, v, kw))
    os.environ[knob] = ""  # empty = unset
    assert _is_sm90(_names(kernel, q, k, v, kw))
    del os.environ[knob]


def test_forced_kernel_errors_are_clear(kernel, monkeypatch):
    """An unknown name, a forced kernel that cannot take the call and a retired A/B switch each raise one clear error
    (never a silent fallback to another kernel)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the sm90 kernels")
    q, k, v, kw = _swin(BF16)
    monkeypatch.setenv("WINATTN_FORCE_KERNEL", "fwd_v9")
    with pytest.raises(Exception, match="unknown kernel 'fwd_v9'"):
        kernel.window_attention(q, k, v, **kw)
    monkeypatch.setenv("WINATTN_FORCE_KERNEL", "fwd_windows")
    big = torch.randn(2, 300, 2, 128, device="cuda", dtype=BF16)
    with pytest.raises(Exception, match="fwd_windows: this call cannot run it"):
        kernel.attention(big, big, big)
    monkeypatch.delenv("WINATTN_FORCE_KERNEL")
    monkeypatch.setenv("WINATTN_SM90", "0")
    with pytest.raises(Exception, match="WINATTN_SM90 is no longer read: use WINATTN_FORCE_KERNEL=v1"):
        kernel.attention(big, big, big)


def _grids(fn, path):
    """{kernel name: grid [x, y, z]} of the CUDA kernels fn launched (from the profiler's Chrome trace)."""
    import json

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    return {e["name"]: tuple(e["args"]["grid"]) for e in events
            if e.get("cat") == "kernel" and "grid" in e.get("args", {})}


def test_window_grouping_override_is_read_each_call(kernel, monkeypatch, tmp_path):
    """WINATTN_FWD_G (windows per CTA of the Hopper window kernel) sets the forward's grid: alternating between
    values and unset, each call's window-kernel grid follows the variable (G windows per CTA: 32 windows per
    window-count column -> ceil(32 / G) CTAs per column), and the result stays the reference one."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Hopper window kernel")
    monkeypatch.delenv("WINATTN_FORCE_KERNEL", raising=False)
    q, k, v, kw = _swin(BF16, batch=32)  # 32 * NW windows, the shift mask's period NW: 32 per column
    trace = tmp_path / "trace.json"
    sizes = {}
    for g in ("1", "8", None, "32", "8"):
        if g is None:
            monkeypatch.delenv("WINATTN_FWD_G", raising=False)
        else:
            monkeypatch.setenv("WINATTN_FWD_G", g)
        grids = _grids(lambda: kernel.window_attention(q, k, v, **kw), trace)
        win = [grid for name, grid in grids.items() if "windows_kernel_sm90" in name]
        assert len(win) == 1, grids
        size = win[0][0] * win[0][1] * win[0][2]
        if g is not None:
            assert size == H * NW * -(-32 // int(g)), (g, grids)
        sizes[g] = size
        _check(kernel, q, k, v, kw)
    assert sizes["1"] > sizes["8"] > sizes["32"]
