"""`kernels benchmark` workloads of window-attention (CUDA): the four v1 target shapes.

    kernels benchmark winattn/window-attention --version 1          # against the published repo
    kernels benchmark <local build dir>                              # or a local build

Each workload is a setup_/benchmark_/verify_ triple of `kernels.benchmark.Benchmark` (`self.kernel` and
`self.device` are injected by the runner; `verify_*` returns the reference the runner compares with `self.out`).
Forward workloads time one call; `*_fwd_bwd` workloads time forward + backward (with dTable / dBias) and compare the
forward output. The same shapes, with the peers measured in the same run, are in benchmarks/bench_cuda.py.
"""

import torch

try:
    from kernels.benchmark import Benchmark
except ImportError:  # importable without the `kernels` package (e.g. on a bare GPU image)
    class Benchmark:  # type: ignore[no-redef]
        seed = None
        device = "cpu"

        def __init__(self):
            self.kernel = None
            self.out = None


BF16 = torch.bfloat16


def _swin_inputs(win, windows, heads=4, head_dim=32, n_shift_windows=64, device="cuda"):
    N = win * win
    q, k, v = (torch.randn(windows, N, heads, head_dim, device=device, dtype=BF16) for _ in range(3))
    coords = torch.stack(torch.meshgrid(torch.arange(win), torch.arange(win), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (win - 1)
    index = (rel[..., 0] * (2 * win - 1) + rel[..., 1]).to(device)
    table = torch.randn((2 * win - 1) ** 2, heads, device=device) * 0.02
    region = torch.randint(0, 4, (n_shift_windows, N), device=device)
    mask = torch.where(region[:, :, None] == region[:, None, :], 0.0, -100.0)
    return q, k, v, table, index, mask


class WindowAttentionBenchmark(Benchmark):
    seed = 0

    # ---- Swin W7: 16384 windows, H=4, N=49, D=32, relative-position table + shift mask --------------------------
    def setup_swin_w7(self):
        self.q, self.k, self.v, self.table, self.index, self.mask = _swin_inputs(7, 16384, device=self.device)

    def benchmark_swin_w7(self):
        self.out = self.kernel.window_attention(self.q, self.k, self.v, rel_pos_table=self.table,
                                                rel_pos_index=self.index, mask=self.mask)

    def verify_swin_w7(self):
        return self.kernel.reference.window_attention(self.q, self.k, self.v, rel_pos_table=self.table,
                                                      rel_pos_index=self.index, mask=self.mask)

    def setup_swin_w7_fwd_bwd(self):
        self.setup_swin_w7()
        for t in (self.q, self.k, self.v, self.table):
            t.requires_grad_(True)
        self.dout = torch.randn_like(self.q)

    def benchmark_swin_w7_fwd_bwd(self):
        out = self.kernel.window_attention(self.q, self.k, self.v, rel_pos_table=self.table,
                                           rel_pos_index=self.index, mask=self.mask)
        torch.autograd.grad(out, (self.q, self.k, self.v, self.table), self.dout)
        self.out = out.detach()

    def verify_swin_w7_fwd_bwd(self):
        with torch.no_grad():
            return self.verify_swin_w7()

    # ---- Swin W12: 8192 windows, N=144 ---------------------------------------------------------------------------
    def setup_swin_w12(self):
        self.q, self.k, self.v, self.table, self.index, self.mask = _swin_inputs(12, 8192, device=self.device)

    benchmark_swin_w12 = benchmark_swin_w7
    verify_swin_w12 = verify_swin_w7

    def setup_swin_w12_fwd_bwd(self):
        self.setup_swin_w12()
        for t in (self.q, self.k, self.v, self.table):
            t.requires_grad_(True)
        self.dout = torch.randn_like(self.q)

    benchmark_swin_w12_fwd_bwd = benchmark_swin_w7_fwd_bwd
    verify_swin_w12_fwd_bwd = verify_swin_w7_fwd_bwd

    # ---- dense bias [1, H, S, S], B=2, H=16, S=4096, D=64 ---------------------------------------------------------
    def setup_dense_bias(self):
        B, H, S, D = 2, 16, 4096, 64
        self.q, self.k, self.v = (torch.randn(B, S, H, D, device=self.device, dtype=BF16) for _ in range(3))
        self.bias = torch.randn(1, H, S, S, device=self.device, dtype=BF16)

    def benchmark_dense_bias(self):
        self.out = self.kernel.attention(self.q, self.k, self.v, bias=self.bias)

    def verify_dense_bias(self):
        qt, kt, vt = (x.transpose(1, 2) for x in (self.q, self.k, self.v))
        return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=self.bias).transpose(1, 2)

    def setup_dense_bias_fwd_bwd(self):
        self.setup_dense_bias()
        for t in (self.q, self.k, self.v, self.bias):
            t.requires_grad_(True)
        self.dout = torch.randn_like(self.q)

    def benchmark_dense_bias_fwd_bwd(self):
        out = self.kernel.attention(self.q, self.k, self.v, bias=self.bias)
        torch.autograd.grad(out, (self.q, self.k, self.v, self.bias), self.dout)
        self.out = out.detach()

    def verify_dense_bias_fwd_bwd(self):
        with torch.no_grad():
            return self.verify_dense_bias()

    # ---- no bias, D=128, S=16k (B=1, H=16) ------------------------------------------------------------------------
    def setup_nobias_d128(self):
        B, H, S, D = 1, 16, 16384, 128
        self.q, self.k, self.v = (torch.randn(B, S, H, D, device=self.device, dtype=BF16) for _ in range(3))

    def benchmark_nobias_d128(self):
        self.out = self.kernel.attention(self.q, self.k, self.v)

    def verify_nobias_d128(self):
        qt, kt, vt = (x.transpose(1, 2) for x in (self.q, self.k, self.v))
        return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt).transpose(1, 2)
