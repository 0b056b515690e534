"""Device time and host time per call of a bench_shapes.py row, for ours (optionally also with a forced kernel) and
SDPA's cuDNN / efficient backends: which side of a short row is slow, the kernels or the host.

    python3 benchmarks/kernel_time.py --variant DIR [--force fwd_v3_short [--b-first]] --only vit_b16 sdxl_cross_4096

bench_shapes.py times each call between device events with the calls queued back to back. On rows of ~0.1 ms that
reads the host's pace whenever the host issues a call more slowly than the GPU runs it, and the H200's host is
bimodal run to run. Here, per call:
  * kernels: the sum of the device time of every kernel (and memset / memcpy) the call launched, from torch.profiler
    (CUPTI), over `--reps` calls: what the GPU spends, whatever the host does;
  * host: the wall time to issue one call with the GPU kept busy (a sleep kernel queued first), so the host never
    waits for the GPU: what the Python + dispatch path costs;
  * the row's kernels by device time (the three longest), to see which one a change should go after;
  * with --host-profile, where the host time goes: torch.profiler's CPU events of the same issue loop (the op, its
    allocations, each CUDA runtime call: launches, attribute and device queries), self time per call, longest
    first, and what no event covers (Python, the dispatcher's boxing, the profiler's own cost). Events under
    ~2 us are inflated by the profiler; compare ours with a peer in the same run rather than reading absolutes.
"""

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_cuda as bc  # noqa: E402
import bench_shapes as bs  # noqa: E402


def host_ms(step, reps):
    """Wall ms to issue one call while a sleep kernel keeps the GPU busy (the host never waits on it)."""
    step()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e8))  # ~0.1 s of GPU cycles queued ahead of the calls: the queue never drains
    t0 = time.perf_counter()
    for _ in range(reps):
        step()
    ms = (time.perf_counter() - t0) * 1e3 / reps
    torch.cuda.synchronize()
    return ms


def host_events(step, reps):
    """([(event, self us per call, calls per call)] longest first, wall us per call) of `reps` issues of step() with
    the GPU kept busy, from torch.profiler's CPU events (with CUDA activity on, so that the runtime API calls are
    events too)."""
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.cuda._sleep(int(2e8))
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        wall_us = (time.perf_counter() - t0) * 1e6 / reps
    torch.cuda.synchronize()
    events = [(e.key, e.self_cpu_time_total / reps, e.count / reps) for e in prof.key_averages()
              if e.self_cpu_time_total > 0 and e.key != "cudaDeviceSynchronize"]
    return sorted(events, key=lambda ev: -ev[1]), wall_us


def format_host_events(events, wall_us, top=6) -> str:
    """One line: the `top` host events (name, us per call, x calls when more than one) and the wall time no event
    covers."""
    parts = [f"{short_name(name)} {us:.1f}" + (f" x{n:g}" if n > 1.05 else "") for name, us, n in events[:top]]
    covered = sum(us for _, us, _ in events)
    return f"host {wall_us:.1f} us: " + ", ".join(parts) + f"; outside events {max(wall_us - covered, 0.0):.1f}"


def short_name(kernel: str) -> str:
    name = kernel.split("(")[0].split("<")[0]
    return name.replace("void ", "").split("::")[-1][:40]


def ours_labels(force: str, b_first: bool) -> list[str]:
    """The order ours runs in: "ours" (the table's kernels), and with a forced kernel "ours_b" after it, or before it
    with --b-first. The first position reads differently from the second on some rows (RESULTS v5.9: the same
    backward 0.3-7% slower first, dense D128 16k 20.6 vs 19.2 ms), so a forced A/B is timed in both orders."""
    if not force:
        return ["ours"]
    return ["ours_b", "ours"] if b_first else ["ours", "ours_b"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", required=True)
    ap.add_argument("--force", default="", help="also run ours with WINATTN_FORCE_KERNEL set to this")
    ap.add_argument("--b-first", action="store_true", help="with --force: the forced run (ours_b) first")
    ap.add_argument("--only", nargs="+", required=True, help="row names or classes (bench_shapes.py --list)")
    ap.add_argument("--peers", default="cudnn,efficient")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--host-profile", action="store_true", help="also a line per pass saying where the host time "
                    "goes (torch.profiler CPU events)")
    args = ap.parse_args(argv)
    kern = bc.load_kernel(args.variant)
    bc.warm_up_gpu()
    peers = [p for p in bs.PEERS if p.name in args.peers.split(",")]
    print(f"{'row':26s} {'impl':10s} {'pass':4s} {'kernels ms':>10s} {'host ms':>8s}  longest kernels (ms per call)")
    for row in bs.select(bs.ROWS, args.only):
        torch.manual_seed(0)
        x = bs.make_inputs(row, "cuda")
        learn = bs.learnable(x)
        leaves = bs.grad_leaves(x, learn)
        ours = {"ours": lambda: bs.ours_call(kern, row, x, learn, "cuda"),
                "ours_b": lambda: bs.ours_call(kern, row, x, learn, "cuda", {"WINATTN_FORCE_KERNEL": args.force})}
        impls = [(label, ours[label]) for label in ours_labels(args.force, args.b_first)]
        impls += [(p.name, lambda p=p: p.call(row, x, learn, "cuda")) for p in peers]
        for i, (label, make) in enumerate(impls):
            try:
                fwd, ctx, _ = make()
                with ctx():
                    passes = [("fwd", fwd)] + ([("f+b", bs.fb_step(fwd, leaves))] if leaves else [])
                    for pname, step in passes:
                        if i == 0:  # a discarded burst first: a row's first timed run reads fast (bench_shapes.py
                            bc.device_ms(step, args.reps)  # timing_order), which would favour whatever runs first
                        dev, kernels = bc.device_ms(step, args.reps)
                        host = host_ms(step, args.reps)
                        top = ", ".join(f"{short_name(k)} {ms:.3f}" for k, ms in kernels[:3])
                        print(f"{row.name:26s} {label:10s} {pname:4s} {dev:10.3f} {host:8.3f}  {top}", flush=True)
                        if args.host_profile:
                            where = format_host_events(*host_events(step, args.reps))
                            print(f"{'':26s} {label:10s} {pname:4s} {where}", flush=True)
            except Exception as e:  # a row an implementation cannot run is reported, not fatal
                print(f"{row.name:26s} {label:10s} error: {bs.one_line(e)}", flush=True)
                torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
