"""One forward (+ backward where the row trains) of ours per bench_shapes.py row inside a CUDA profiler range, for
Nsight Compute: the profile behind a row that misses its target.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy \
        --section WarpStateStats python3 benchmarks/profile_shapes.py --variant DIR --only vit_b16 sdxl_cross_4096

Warm-up calls run outside the range, so the range holds exactly one call of each kernel the row launches.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_cuda as bc  # noqa: E402
import bench_shapes as bs  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", required=True)
    ap.add_argument("--only", nargs="+", required=True, help="row names or classes (bench_shapes.py --list)")
    ap.add_argument("--impl", default="ours", help="ours or a peer of bench_shapes.py (cudnn, fa2, ...): the "
                    "peer's kernels on the same call, to compare their profiles with ours")
    ap.add_argument("--fwd-only", action="store_true", help="the forward alone, also on rows that train")
    args = ap.parse_args(argv)
    kern = bc.load_kernel(args.variant)
    peers = {p.name: p for p in bs.PEERS}
    for row in bs.select(bs.ROWS, args.only):
        torch.manual_seed(0)
        x = bs.make_inputs(row, "cuda")
        learn = bs.learnable(x)
        if args.impl == "ours":
            fwd, ctx, _ = bs.ours_call(kern, row, x, learn, "cuda")
        else:
            fwd, ctx, _ = peers[args.impl].call(row, x, learn, "cuda")
        leaves = [] if args.fwd_only else bs.grad_leaves(x, learn)

        def step():
            out = fwd()
            if leaves:
                torch.autograd.grad(out, leaves, torch.randn_like(out))

        with ctx():
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            step()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
        print(f"profiled {row.name} ({args.impl})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
