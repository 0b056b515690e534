"""One-off (not committed): windows of 144 / 256 tokens with bool masks / key padding through `attention`."""
import sys, torch
sys.path.insert(0, "benchmarks")
import bench_cuda as bc
from torch.nn.attention import sdpa_kernel, SDPBackend
import torch.nn.functional as F
kern = bc.load_kernel(sys.argv[1])
bc.warm_up_gpu()
BF16 = torch.bfloat16
for win, nwin in ((12, 8192), (16, 4096)):
    N, H, D, nW = win * win, 4, 32, 64
    q, k, v = (torch.randn(nwin, N, H, D, device="cuda", dtype=BF16).requires_grad_(True) for _ in range(3))
    bias = (torch.randn(1, H, N, N, device="cuda") * 0.5).half().requires_grad_(True)
    kpm = torch.rand(nwin, N, device="cuda") > 0.1
    bmask = torch.rand(nwin, 1, N, N, device="cuda") > 0.2
    cases = {
        "bias": lambda: kern.attention(q, k, v, bias=bias),
        "bias+key_padding": lambda: kern.attention(q, k, v, bias=bias, key_padding_mask=kpm),
        "bias+bool_mask": lambda: kern.attention(q, k, v, bias=bias, mask=bmask),
    }
    for name, f in cases.items():
        try:
            tf, tb, mem = bc.measure(f, bc.autograd_grads([q, k, v, bias]), 20)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                out = f(); out.sum().backward(); torch.cuda.synchronize()
            names = sorted({e.name.split("<")[0][:40] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "kernel" in e.name and "window_attention" not in e.name[:0]})
            print(f"W{win} {name:18s} fwd {tf:.3f} bwd {tb:.3f} ms  kernels {[n for n in names if 'fwd' in n or 'bwd' in n]}")
        except Exception as e:
            print(f"W{win} {name}: {type(e).__name__}: {str(e)[:200]}")
