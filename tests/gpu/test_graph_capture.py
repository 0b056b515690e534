"""CUDA graphs and torch.compile capture the ops (issue 16, "small calls"; marked `gpu`, skipped without a GPU).

A captured call costs no host time on replay, which is what small calls need most. Checked here:
- torch.cuda.graph capture + replay of a forward, and of a forward + backward, for the Swin W7 and W12 shapes
  (rel-pos table, shift mask) and a dense-bias long-sequence call (deterministic): replay on new input values gives bitwise the
  outputs and gradients that eager calls give on the same values.
- torch.compile(fullgraph=True) of a module calling each op gives the eager results (forward and gradients), and
  mode="reduce-overhead" (inductor's CUDA graphs) does so without skipping the graph.
- First sight of a rel_pos_index during capture is a clear RuntimeError asking for a warm-up call, not a broken
  capture (its range check needs a device -> host sync).

On replay no host code runs, so no argument check runs either: the graph keeps reading the captured tensors.
"""

import pytest
import torch
from swin_index import swin_relative_index

from ._helpers import rand

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16
WS, NW, H, D = 7, 64, 3, 32  # Swin-T stage 1: 7x7 windows, 64 windows per image, 3 heads of 32
N = WS * WS


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _swin_index(ws=WS):
    return swin_relative_index(ws, "cuda")


def _shift_mask(ws=WS, nw=NW):
    region = torch.randint(0, 4, (nw, ws * ws), device="cuda")
    return torch.where(region[:, :, None] == region[:, None, :], 0.0, -100.0)


def _swin_case(batch=4, ws=WS, nw=NW):
    """(leaves, call): q/k/v [batch * nW, N, H, D] bf16 and the fp32 table get gradients."""
    leaves = [rand(batch * nw, ws * ws, H, D, dtype=BF16, grad=True) for _ in range(3)]
    leaves.append((torch.randn((2 * ws - 1) ** 2, H, device="cuda") * 0.5).requires_grad_(True))
    index, mask = _swin_index(ws), _shift_mask(ws, nw)

    def call(kernel, q, k, v, table):
        return kernel.window_attention(q, k, v, rel_pos_table=table, rel_pos_index=index, mask=mask)

    return leaves, call


def _dense_case(S=2048, heads=4):
    leaves = [rand(1, S, heads, 64, dtype=BF16, grad=True) for _ in range(3)]
    leaves.append(rand(1, heads, S, S, dtype=BF16, grad=True))

    def call(kernel, q, k, v, bias):
        return kernel.attention(q, k, v, bias=bias, deterministic=True)

    return leaves, call


# swin_w12 / swin_w16: the wide-window kernels (N = 144: the 3-warpgroup backward with its TMA stages and named
# barriers; N = 256: the split one, a cluster launch)
CASES = {"swin_w7": _swin_case, "swin_w12": lambda: _swin_case(batch=2, ws=12, nw=16),
         "swin_w16": lambda: _swin_case(batch=2, ws=16, nw=4), "dense_bias": _dense_case}


def _step(kernel, call, leaves, dout, backward):
    out = call(kernel, *leaves)
    if not backward:
        return (out,)
    return (out, *torch.autograd.grad(out, leaves, dout))


def _capture(fn):
    """torch.cuda.graph capture of fn() after three warm-up calls on a side stream (as torch.cuda.graphs asks)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn()
    return graph, static_out


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd_bwd"])
@pytest.mark.parametrize("case", list(CASES))
def test_graph_replay_is_bitwise_eager(kernel, case, backward):
    leaves, call = CASES[case]()
    dout = torch.randn(leaves[0].shape, device="cuda").to(BF16)
    graph, static = _capture(lambda: _step(kernel, call, leaves, dout, backward))
    for trial in range(2):  # new values in the captured tensors, then replay
        with torch.no_grad():
            for t in leaves:
                t.copy_(torch.randn_like(t, dtype=torch.float32) * (0.5 if t.dim() == 2 else 1.0))
            dout.copy_(torch.randn_like(dout, dtype=torch.float32))
        graph.replay()
        eager = _step(kernel, call, leaves, dout, backward)
        torch.cuda.synchronize()
        names = ("out", "dq", "dk", "dv", "dtable" if case.startswith("swin") else "dbias")
        for name, got, want in zip(names, static, eager):
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert torch.equal(got, want), f"{case} trial {trial}: replayed {name} differs from eager"


def test_unseen_index_during_capture_asks_for_a_warm_up(kernel):
    leaves, _ = _swin_case(batch=1)
    fresh = _swin_index()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        kernel.window_attention(*leaves[:3], rel_pos_table=leaves[3], rel_pos_index=_swin_index())  # warm up
    torch.cuda.synchronize()
    with pytest.raises(RuntimeError, match="before capturing"):
        with torch.cuda.graph(graph):
            kernel.window_attention(*leaves[:3], rel_pos_table=leaves[3], rel_pos_index=fresh)
    torch.cuda.synchronize()  # the capture was abandoned cleanly: the context is still usable
    kernel.window_attention(*leaves[:3], rel_pos_table=leaves[3], rel_pos_index=fresh)
    torch.cuda.synchronize()


class _SwinBlockAttention(torch.nn.Module):
    """The op inside a module with its table, index and shift mask as parameter / buffers (as timm holds them)."""

    def __init__(self, kernel):
        super().__init__()
        self.kernel = kernel
        self.table = torch.nn.Parameter(torch.randn((2 * WS - 1) ** 2, H, device="cuda") * 0.5)
        self.register_buffer("index", _swin_index())
        self.register_buffer("mask", _shift_mask())

    def forward(self, q, k, v):
        return self.kernel.window_attention(q, k, v, rel_pos_table=self.table, rel_pos_index=self.index,
                                            mask=self.mask)


class _DenseBiasAttention(torch.nn.Module):
    def __init__(self, kernel):
        super().__init__()
        self.kernel = kernel

    def forward(self, q, k, v, bias):
        return self.kernel.attention(q, k, v, bias=bias, deterministic=True)


def _module_case(kernel, case):
    if case == "swin_w7":
        mod = _SwinBlockAttention(kernel)
        inputs = [rand(4 * NW, N, H, D, dtype=BF16, grad=True) for _ in range(3)]
        return mod, inputs, inputs + [mod.table]
    mod = _DenseBiasAttention(kernel)
    inputs = [rand(1, 2048, 4, 64, dtype=BF16, grad=True) for _ in range(3)]
    inputs.append(rand(1, 4, 2048, 2048, dtype=BF16, grad=True))
    return mod, inputs, inputs


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
@pytest.mark.parametrize("case", list(CASES))
def test_torch_compile_fullgraph_matches_eager(kernel, case, mode):
    mod, inputs, leaves = _module_case(kernel, case)
    dout = torch.randn(inputs[0].shape, device="cuda").to(BF16)
    want = mod(*inputs)
    want_grads = torch.autograd.grad(want, leaves, dout)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(mod, fullgraph=True, mode=mode)
    for _ in range(3):  # reduce-overhead: warm-up, record, then replay
        got = compiled(*inputs)
        got_grads = torch.autograd.grad(got, leaves, dout)
        torch.cuda.synchronize()
        assert torch.equal(got, want), f"{case} ({mode}): compiled forward differs from eager"
        for i, (g, w) in enumerate(zip(got_grads, want_grads)):
            assert torch.equal(g, w), f"{case} ({mode}): compiled gradient {i} differs from eager"
    if mode == "reduce-overhead":
        skips = dict(torch._dynamo.utils.counters["inductor"])
        assert not skips.get("cudagraph_skips"), f"inductor did not use CUDA graphs: {skips}"
