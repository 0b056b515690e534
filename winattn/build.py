"""`winattn build`: compile the torch-stable-ABI variants of the kernel without Nix.

    winattn build [--backend cpu|cuda|all] [--build-dir build] [--cuda-archs 8.0 9.0 ...] [--unique-id ID]
    winattn build --matrix [--cuda cu124 cu130 cu132] [--torch 2.13 ...]    (docs/build-matrix.md)

Python API: `build_variant(repo_root, backend, build_dir, cuda_archs=None) -> Path` (the variant directory), or
`build(...) -> BuildResult` for the details. Every failure raises `winattn.errors.BuildError` naming the key or file.

What it makes is kernel-builder's layout (reference/kernel-builder.md §2.4): `build/<variant>/` with the Python
package of torch-ext/, a generated `_ops.py`, `_<name>_<backend>_<id>.abi3.so` and `metadata.json` (digest and
provenance checked with the `kernels` parser). Variant names: `torch-stable-abi210-cpu-x86_64-linux` and
`torch-stable-abi210-cu130-x86_64-linux` (CUDA version of the nvcc used). Objects and generated sources go to
`_build_obj/<variant>/` (git-ignored); ninja rebuilds only what changed. Differences from a Nix build: the host
toolchain (not the manylinux_2_28 one: a generated compat unit keeps the .so within manylinux_2_28, and the result
is reported), one variant per backend. `--matrix` (winattn/_build/matrix.py) builds every variant this machine can
make: the CPU one, one per CUDA toolkit (the system's and throwaway ones from PyPI/Debian) and optionally per-torch
variants, each in its own object dir, with the ABI and fatbinary checks made fatal.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ._build import toolchain as _tc
from ._build.config import BuildConfig, load_config
from ._build.variant_build import (  # noqa: F401  (the API)
    BuildResult, build, build_variant, compile_sources, kernel_cuda_caps,
)
from ._build.variant_build import _check_fatbin  # noqa: F401  (tests check it directly)
from .errors import BuildError

__all__ = ["BuildResult", "build", "build_variant", "register"]

# ---------------------------------------------------------------------------------------------------------------
# CLI


def _find_repo_root(start: Path) -> Path:
    for d in (start, *start.parents):
        if (d / "build.toml").is_file():
            return d
    raise BuildError(f"no build.toml in {start} or its parents (pass --repo-root)")


def _run_matrix(args: argparse.Namespace, root: Path, build_dir: Path) -> int:
    from ._build import matrix as _matrix

    cfg = load_config(root)
    if args.backend == "all":
        backends = [b for b in cfg.backends if b in ("cpu", "cuda")]
    else:
        backends = [args.backend]
    torch_versions = list(args.torch or [])
    if args.no_stable:
        backends = []  # per-torch variants only
    entries = _matrix.plan(backends, list(args.cuda or _matrix.DEFAULT_CUDA), torch_versions)
    if not entries:
        raise BuildError("--matrix: nothing to build (check --backend / --no-stable / --torch)")
    print(f"[matrix] {len(entries)} variants: {', '.join(e.label for e in entries)} -> {build_dir}")
    t0 = time.monotonic()
    # Object dirs of their own (_build_obj/matrix/<variant>/): `winattn build`, `make build-cuda CUDA_ARCHS=...` and
    # the tests' builds keep theirs, so neither side recompiles everything after the other ran with other flags.
    obj_root = root / "_build_obj" / "matrix"
    rows = _matrix.run_matrix(root, build_dir, entries, cuda_archs=args.cuda_archs, unique_id=args.unique_id,
                              jobs=args.jobs, obj_root=obj_root, log=print)
    built = {r.variant for r in rows if r.status == "ok"}
    others = sorted(d.name for d in Path(build_dir).glob("torch*") if d.is_dir() and d.name not in built)
    if others and args.clean:
        import shutil

        for name in others:
            shutil.rmtree(Path(build_dir) / name)
        print(f"[matrix] --clean: removed {', '.join(others)} from {build_dir}")
    elif others:
        print(f"[matrix] note: {build_dir} also holds {', '.join(others)} (not built by this run; `winattn publish` "
              "uploads them too; --clean removes them)")
    summary = obj_root / "matrix.json"
    _matrix.write_summary(rows, summary)
    print(f"[matrix] summary ({time.monotonic() - t0:.0f} s in all; {summary}):")
    print(_matrix.summary_table(rows))
    failed = [r for r in rows if r.status == "FAILED"]
    if failed:
        print(f"[matrix] {len(failed)} variant(s) failed: {', '.join(r.variant or r.entry.label for r in failed)}",
              file=sys.stderr)
    return 1 if failed or not built else 0


def _run(args: argparse.Namespace) -> int:
    root = Path(args.repo_root).resolve() if args.repo_root else _find_repo_root(Path.cwd())
    build_dir = Path(args.build_dir) if args.build_dir else root / "build"
    if args.matrix:
        return _run_matrix(args, root, build_dir)
    if args.torch or args.cuda or args.clean or args.no_stable:
        raise BuildError("--torch, --cuda, --clean and --no-stable go with --matrix")
    if args.backend == "all":
        cfg: BuildConfig = load_config(root)
        backends = [b for b in cfg.backends if b in ("cpu", "cuda")]
        if "cuda" in backends and _tc.find_cuda(required=False) is None:
            print("[build] cuda: skipped (nvcc not found; pass --backend cuda to make this an error)")
            backends.remove("cuda")
    else:
        backends = [args.backend]
    if args.cuda_archs and "cuda" not in backends:
        raise BuildError("--cuda-archs given but no cuda build selected")
    results = []
    for b in backends:
        results.append(build(root, b, build_dir, args.cuda_archs if b == "cuda" else None,
                             unique_id=args.unique_id, jobs=args.jobs))
    if len(results) > 1:
        print("[build] summary:")
        for r in results:
            ml = "pass" if not r.abi.manylinux else f"FAIL ({len(r.abi.manylinux)})"
            print(f"[build]   {r.variant}: {r.seconds:.1f} s, {r.so_path.stat().st_size / 2**20:.1f} MiB, "
                  f"abi3 pass, {_tc.MANYLINUX_TARGET} {ml}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "build",
        help="compile the stable-ABI variants into build/ (no Nix)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--backend", choices=["cpu", "cuda", "all"], default="all",
                   help="variant to build; all = every backend of build.toml this machine can compile (default)")
    p.add_argument("--build-dir", default=None, help="output directory (default: <repo>/build)")
    p.add_argument("--cuda-archs", nargs="+", metavar="CAP", default=None,
                   help="CUDA capabilities to compile (e.g. 9.0), replacing build.toml's cuda-capabilities")
    p.add_argument("--unique-id", default=None, help="id part of the ops namespace (default: git tree hash)")
    p.add_argument("--repo-root", default=None, help="kernel repository (default: nearest build.toml upwards)")
    p.add_argument("-j", "--jobs", type=int, default=None, help="parallel compile jobs (default: ninja's)")
    m = p.add_argument_group("build matrix (docs/build-matrix.md)")
    m.add_argument("--matrix", action="store_true",
                   help="build every variant this machine can make (CPU, each CUDA toolkit of --cuda, --torch "
                        "versions), each isolated, ABI/manylinux/fatbinary checks fatal, then print a summary table")
    m.add_argument("--cuda", nargs="+", metavar="TOOLKIT", default=None,
                   help="CUDA toolkits of the matrix (default: cu124 cu130 cu132); toolkits other than "
                        "the system's are provisioned under ~/.cache/winattn/toolchains ($WINATTN_TOOLCHAIN_CACHE)")
    m.add_argument("--torch", nargs="+", metavar="VERSION", default=None,
                   help="also build per-torch CPU variants (torch213-cxx11-cpu-...) against these torch versions")
    m.add_argument("--no-stable", action="store_true", help="with --torch: only the per-torch variants")
    m.add_argument("--clean", action="store_true",
                   help="remove variant dirs of the build dir that this run did not build (publish uploads all)")
    p.set_defaults(func=_run)


if __name__ == "__main__":  # python -m winattn.build
    from .cli import main

    sys.exit(main(["build", *sys.argv[1:]]))
