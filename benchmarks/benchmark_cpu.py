"""CPU benchmark of the window-attention kernel against plain PyTorch.

    python benchmarks/benchmark_cpu.py [--json out.json] [--build] [--build-dir build] [--dtypes fp32 bf16]
                                       [-B 8 -H 8 -S 1024 -D 64] [--repeats 5] [--warmup 2] [--threads N]
                                       [--clock wall|thread]

Loads the built CPU variant the way users do (`kernels.get_local_kernel(build_dir)`; `--build` runs
`winattn build` first) and times, for an additive bias of shape [1, H, S, S]:

  * fwd      forward only, under torch.no_grad()
  * fwd+bwd  forward + backward, gradients for q, k, v and the bias

for three implementations on the same inputs:

  * kernel     window_attention.attention(q, k, v, bias=bias)            (q/k/v [B, S, H, D])
  * composite  softmax(q k^T * scale + bias) v with autograd              (q/k/v [B, H, S, D], their best layout)
  * sdpa       torch.nn.functional.scaled_dot_product_attention(attn_mask=bias)

Implementations are timed round-robin (one run of each per round, so load on a shared machine affects all of
them alike). Reported: median (and min) wall time over `--repeats` rounds after `--warmup`, GFLOP/s with the usual
attention count (fwd 4*B*H*S*S*D, bwd 2.5x fwd: recomputation not counted), and the kernel's speedup over each
baseline. `--json` writes every measurement plus the machine/thread/torch details.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def load_kernel(build_dir: Path, build: bool):
    if build:
        sys.path.insert(0, str(REPO_ROOT))
        from winattn.build import build_variant

        build_variant(REPO_ROOT, backend="cpu", build_dir=build_dir)
    from kernels import get_local_kernel

    return get_local_kernel(build_dir)


def time_interleaved(fns: dict, repeats: int, warmup: int, clock=time.perf_counter) -> dict:
    """Round-robin timing: each round runs every implementation once, so load changes on a shared machine hit
    all of them alike instead of whichever happened to be running."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = clock()
            fn()
            times[name].append(clock() - t0)
    return times


def make_cases(kernel, B, H, S, D, dtype):
    """Returns {impl: (fwd_fn, fwd_bwd_fn)} over shared random inputs."""
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    q, k, v = rnd(B, S, H, D), rnd(B, S, H, D), rnd(B, S, H, D)
    bias = rnd(1, H, S, S)
    grad = rnd(B, S, H, D)
    scale = D**-0.5
    # Baselines get [B, H, S, D] contiguous tensors (their natural layout), converted outside the timing.
    qh, kh, vh = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    grad_h = grad.transpose(1, 2).contiguous()

    def leaves(*ts):
        return [t.detach().requires_grad_() for t in ts]

    kq, kk, kv, kb = leaves(q, k, v, bias)
    cq, ck, cv, cb = leaves(qh, kh, vh, bias)
    sq, sk, sv, sb = leaves(qh, kh, vh, bias)

    def kernel_fwd(q, k, v, b):
        return kernel.attention(q, k, v, bias=b)

    def composite_fwd(q, k, v, b):
        s = torch.matmul(q, k.transpose(-1, -2)) * scale + b
        return torch.matmul(torch.softmax(s, dim=-1), v)

    def sdpa_fwd(q, k, v, b):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=b, scale=scale)

    def pair(f, args, g):
        def fwd():
            with torch.no_grad():
                f(*args)

        def fwd_bwd():
            for t in args:
                t.grad = None
            f(*args).backward(g)

        return fwd, fwd_bwd

    return {
        "kernel": pair(kernel_fwd, (kq, kk, kv, kb), grad),
        "composite": pair(composite_fwd, (cq, ck, cv, cb), grad_h),
        "sdpa": pair(sdpa_fwd, (sq, sk, sv, sb), grad_h),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--build-dir", type=Path, default=REPO_ROOT / "build")
    ap.add_argument("--build", action="store_true", help="run `winattn build` for the CPU variant first")
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    ap.add_argument("-B", type=int, default=8)
    ap.add_argument("-H", type=int, default=8)
    ap.add_argument("-S", type=int, default=1024)
    ap.add_argument("-D", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--impls", nargs="+", default=["kernel", "composite", "sdpa"])
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    ap.add_argument("--clock", choices=["wall", "thread"], default="wall",
                    help="thread: CPU time of the calling thread (needs --threads 1); insensitive to other "
                         "processes sharing the cores")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "thread" and torch.get_num_threads() != 1:
        ap.error("--clock thread measures one thread: pass --threads 1")
    clock = time.thread_time if args.clock == "thread" else time.perf_counter

    kernel = load_kernel(args.build_dir, args.build)
    B, H, S, D = args.B, args.H, args.S, args.D
    fwd_flops = 4 * B * H * S * S * D
    flops = {"fwd": fwd_flops, "fwd+bwd": fwd_flops * 3.5}

    results = []
    for dname in args.dtypes:
        cases = make_cases(kernel, B, H, S, D, DTYPES[dname])
        for mode_i, mode in enumerate(("fwd", "fwd+bwd")):
            all_times = time_interleaved({impl: cases[impl][mode_i] for impl in args.impls}, args.repeats,
                                         args.warmup, clock)
            for impl in args.impls:
                times = all_times[impl]
                med = statistics.median(times)
                results.append({
                    "impl": impl, "dtype": dname, "mode": mode, "median_ms": med * 1e3, "min_ms": min(times) * 1e3,
                    "times_ms": [t * 1e3 for t in times], "gflops": flops[mode] / med / 1e9,
                })
                print(f"  measured {dname:4s} {mode:7s} {impl:9s} {med * 1e3:9.1f} ms", file=sys.stderr, flush=True)
        del cases

    def kernel_row(r):
        for x in results:
            if x["impl"] == "kernel" and x["dtype"] == r["dtype"] and x["mode"] == r["mode"]:
                return x
        return None

    title = f"window-attention CPU benchmark: B={B} H={H} S={S} D={D}, bias [1, H, S, S], " \
            f"{torch.get_num_threads()} threads, {args.clock} clock, torch {torch.__version__}"
    print(title)
    header = (f"{'dtype':5s} {'mode':8s} {'impl':10s} {'median ms':>10s} {'min ms':>9s} {'GFLOP/s':>8s} "
              f"{'kernel speedup (median / min)':>30s}")
    print(header)
    print("-" * len(header))
    for r in results:
        k = kernel_row(r)
        r["kernel_speedup"] = None if k is None else r["median_ms"] / k["median_ms"]
        r["kernel_speedup_min"] = None if k is None else r["min_ms"] / k["min_ms"]
        speed = "" if r["impl"] == "kernel" or k is None else \
            f"{r['kernel_speedup']:.2f}x / {r['kernel_speedup_min']:.2f}x"
        print(f"{r['dtype']:5s} {r['mode']:8s} {r['impl']:10s} {r['median_ms']:10.1f} {r['min_ms']:9.1f} "
              f"{r['gflops']:8.1f} {speed:>30s}")

    if args.json:
        meta = {
            "shape": {"B": B, "H": H, "S": S, "D": D, "bias": [1, H, S, S]},
            "threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "processor": platform.processor(), "cpu_count": os.cpu_count(),
            "repeats": args.repeats, "warmup": args.warmup, "clock": args.clock,
            "kernel_isa": os.environ.get("WINATTN_CPU_ISA", "auto"),
            "flops_convention": "fwd 4*B*H*S*S*D, fwd+bwd 3.5x fwd",
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
