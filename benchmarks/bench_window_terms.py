"""Window-shaped calls of `attention` with a learnable bias and with masks (Swin W12 / W16 shapes, bf16, H200).

Many short sequences (8192 windows of 144 tokens, 4096 of 256; H=4, D=32) with a bf16 [1, H, N, N] bias broadcast
over the windows, alone, with a key-padding mask (10% of the keys), with a bool mask shared by the windows
([1, 1, N, N]) or with a per-window one ([B, 1, N, N]). Prints the forward / backward medians (bench_cuda.measure:
device events after warm-up) and the kernels that ran, so the path each call takes is visible: the wide window
kernels in every case, with mask_bits_kernel before them for the per-window mask (benchmarks/RESULTS.md v3.4, v3.5).

    python3 benchmarks/bench_window_terms.py build/torch-stable-abi210-cu130-x86_64-linux
"""
import sys

import torch

sys.path.insert(0, "benchmarks")
import bench_cuda as bc  # noqa: E402

BF16 = torch.bfloat16


def main(variant):
    kern = bc.load_kernel(variant)
    bc.warm_up_gpu()
    for win, nwin in ((12, 8192), (16, 4096)):
        N, H, D = win * win, 4, 32
        q, k, v = (torch.randn(nwin, N, H, D, device="cuda", dtype=BF16).requires_grad_(True) for _ in range(3))
        bias = (torch.randn(1, H, N, N, device="cuda") * 0.5).to(BF16).requires_grad_(True)
        kpm = torch.rand(nwin, N, device="cuda") > 0.1
        bmask = torch.rand(nwin, 1, N, N, device="cuda") > 0.2
        shared_mask = torch.rand(1, 1, N, N, device="cuda") > 0.2
        cases = {
            "bias": lambda: kern.attention(q, k, v, bias=bias),
            "bias+key_padding": lambda: kern.attention(q, k, v, bias=bias, key_padding_mask=kpm),
            "bias+shared_mask": lambda: kern.attention(q, k, v, bias=bias, mask=shared_mask),
            "bias+window_mask": lambda: kern.attention(q, k, v, bias=bias, mask=bmask),
        }
        for name, f in cases.items():
            tf, tb, _ = bc.measure(f, bc.autograd_grads([q, k, v, bias]), 20)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                f().sum().backward()
                torch.cuda.synchronize()
            names = sorted({e.name.split("<")[0] for e in prof.events()
                            if e.device_type == torch.autograd.DeviceType.CUDA and "kernel" in e.name})
            print(f"W{win} {name:18s} fwd {tf:.3f} bwd {tb:.3f} ms  kernels {names}")


if __name__ == "__main__":
    main(sys.argv[1])
