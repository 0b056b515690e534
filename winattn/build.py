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
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ._build import compile as _compile
from ._build import layout as _layout
from ._build import toolchain as _tc
from ._build.locking import FileLock
from ._build.config import CUDA_SOURCE_SUFFIXES, BuildConfig, check_backend, load_config
from .errors import BuildError

__all__ = ["BuildResult", "build", "build_variant", "register"]

# kernel-builder's CUDA_DEFAULT_KERNEL_ARCHS (reference/kernel-builder.md §3), for kernels without cuda-capabilities.
_DEFAULT_CUDA_CAPS = {
    (13, 0): ["7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "11.0", "12.0", "12.1+PTX"],
    (12, 8): ["7.0", "7.2", "7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "10.1", "12.0+PTX"],
    (0, 0): ["7.0", "7.2", "7.5", "8.0", "8.6", "8.7", "8.9", "9.0+PTX"],
}


@dataclass
class BuildResult:
    backend: str
    variant: str  # torch-stable-abi210-cpu-x86_64-linux
    variant_dir: Path
    ops_name: str  # _window_attention_cpu_<id> = metadata id = torch.ops namespace
    so_path: Path  # inside variant_dir
    obj_dir: Path
    compiled: list[str] = field(default_factory=list)  # sources compiled by this call (empty: up to date)
    linked: bool = False
    archs: list[str] = field(default_factory=list)  # CUDA capabilities compiled
    abi: _layout.AbiReport = field(default_factory=_layout.AbiReport)
    fatbin: tuple[list[str], list[str]] | None = None  # (SASS, PTX) archs cuobjdump found; None = not checked
    toolchain: str = ""  # "g++ 12.2.0" / "nvcc 13.0.88 (system)"
    removed: list[str] = field(default_factory=list)  # stale files deleted from the variant dir
    seconds: float = 0.0


def _default_caps(version: tuple[int, int]) -> list[str]:
    for floor in sorted(_DEFAULT_CUDA_CAPS, reverse=True):
        if version >= floor:
            return _DEFAULT_CUDA_CAPS[floor]
    return _DEFAULT_CUDA_CAPS[(0, 0)]


def _version_tuple(v: str, key: str) -> tuple[int, int]:
    try:
        major, minor = v.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        raise BuildError(f"build.toml: {key} must be a 'major.minor' CUDA version, got {v!r}") from None


def _builder_version() -> str:
    try:
        from importlib.metadata import version

        return f"winattn-build {version('winattn')}"
    except Exception:  # noqa: BLE001 - not installed as a distribution (PYTHONPATH checkout)
        return "winattn-build"


def kernel_cuda_caps(k, cuda: _tc.CudaToolkit, cuda_archs: list[str] | None = None) -> list[str]:
    """Capabilities the kernel `k` is compiled for with `cuda`: --cuda-archs (see below), else build.toml's
    cuda-capabilities loosely intersected with kernel-builder's defaults for that nvcc version (kernel-builder.md §3:
    < 12.8 up to 9.0, 12.8 adds 10.0/10.1/12.0, 13.0 has 7.5 ... 12.1), else those defaults; then what nvcc targets."""
    version = f"{cuda.version[0]}.{cuda.version[1]}"
    if cuda_archs:
        # --cuda-archs picks the base archs; a kernel's own arch-specific form of one of them survives ('9.0' keeps
        # the sm90 kernel's '9.0a'). A kernel none of whose capabilities is requested is compiled for the requested
        # list as given (the sm90 kernels then compile to stubs the planner never launches).
        requested = list(cuda_archs)
        kept = _tc.loose_intersection(k.cuda_capabilities, requested) if k.cuda_capabilities else []
        return _tc.select_cuda_archs(kept or requested, cuda, "--cuda-archs")
    defaults = _default_caps(cuda.version)
    if k.cuda_capabilities is None:
        return _tc.select_cuda_archs(defaults, cuda, f"nvcc {version} default archs")
    key = f"build.toml {k.key} cuda-capabilities"
    kept = _tc.loose_intersection(k.cuda_capabilities, defaults)
    if not kept:
        raise BuildError(f"{key} = {k.cuda_capabilities}: none is among nvcc {version}'s supported capabilities "
                         f"({', '.join(defaults)})")
    return _tc.select_cuda_archs(kept, cuda, key)


def _cxx_version(cxx: str) -> str:
    import subprocess

    try:
        out = subprocess.run([cxx, "-dumpfullversion", "-dumpversion"], capture_output=True, text=True).stdout.strip()
    except OSError:
        out = ""
    return f"{Path(cxx).name} {out}".strip()


def build(
    repo_root: Path,
    backend: str,
    build_dir: Path,
    cuda_archs: list[str] | None = None,
    *,
    unique_id: str | None = None,
    obj_dir: Path | None = None,
    jobs: int | None = None,
    log=print,
    cuda: _tc.CudaToolkit | None = None,
    torch: _tc.TorchPaths | None = None,
    torch_version: str | None = None,
    strict: bool = False,
) -> BuildResult:
    """Build one variant; see the module docstring. `unique_id` overrides the git-derived id (tests load two
    builds side by side with it); `obj_dir` defaults to <repo_root>/_build_obj/<variant>.

    The matrix passes the rest: `cuda` = the toolkit to use (default: nvcc on PATH); `torch_version` ("2.13") makes
    a per-torch variant (torch213-cxx11-...) compiled against `torch`'s headers (default this process's torch)
    without TORCH_TARGET_VERSION; `strict` makes a manylinux_2_28 violation, a fatbinary that does not hold exactly
    the compiled capabilities, or a missing cuobjdump a BuildError (abi3 violations always are)."""
    t0 = time.monotonic()
    root = Path(repo_root).resolve()
    cfg = load_config(root)
    kernels = check_backend(cfg, backend)
    stable_abi = cfg.stable_abi_for(backend) if torch_version is None else None
    torch = torch or _tc.torch_paths()

    cuda_caps: dict[str, list[str]] = {}
    if backend == "cuda":
        cuda = cuda or _tc.find_cuda(required=True)
        kept = []
        for k in kernels:
            if k.cuda_minver and cuda.version < _version_tuple(k.cuda_minver, f"{k.key} cuda-minver"):
                log(f"[build] cuda: skipping {k.key} (cuda-minver {k.cuda_minver} > nvcc {cuda.version[0]}.{cuda.version[1]})")
                continue
            cuda_caps[k.name] = kernel_cuda_caps(k, cuda, cuda_archs)
            kept.append(k)
        kernels = kept
        if not any(s.endswith(CUDA_SOURCE_SUFFIXES) for k in kernels for s in k.src):
            raise BuildError("build.toml: no cuda kernel lists a .cu source to compile")
        backend_tag = cuda.tag
        toolchain = f"nvcc {cuda.release or '.'.join(map(str, cuda.version))} ({cuda.source})"
    else:
        cuda = None
        backend_tag = "cpu"
        toolchain = _cxx_version(_tc.find_cxx())

    git = _tc.git_state(root)
    uid = _tc.check_unique_id(unique_id or (git.unique_id if git else _tc.content_id(cfg)))
    ops_name = f"_{cfg.python_name}_{backend}_{uid}"
    if torch_version is None:
        variant = _tc.variant_name(stable_abi, backend_tag)
    else:
        variant = _tc.torch_variant_name(torch_version, backend_tag)
    build_dir = Path(build_dir).resolve()
    variant_dir = build_dir / variant
    obj_dir = Path(obj_dir).resolve() if obj_dir else root / "_build_obj" / variant
    archs = sorted({c for caps in cuda_caps.values() for c in caps}, key=lambda c: _tc.parse_capability(c)[:3])

    log(f"[build] {backend}: {variant} (ops namespace {ops_name})")
    # Concurrent builds of one variant wait instead of sharing ninja state.
    with FileLock(obj_dir / ".lock"):
        _compile.write_generated(obj_dir)
        units = _compile.plan_units(cfg, backend, kernels, ops_name, stable_abi, obj_dir, cuda, cuda_caps, torch)
        so_name = f"{ops_name}.abi3.so"
        ldflags = _compile.link_flags(backend, cuda, obj_dir, torch)
        _compile.write_build_ninja(obj_dir, _tc.find_cxx(), cuda, units, so_name, ldflags)
        ninja = _tc.find_ninja()
        plan = _compile.run_ninja(ninja, obj_dir, so_name, log, dry_run=True)
        if plan.compiled or plan.linked:
            arch_note = f" for {', '.join(archs)}" if archs else ""
            log(f"[build] {backend}: compiling {len(plan.compiled)} of {len(units)} units{arch_note} ...")
            t1 = time.monotonic()
            run = _compile.run_ninja(ninja, obj_dir, so_name, log, jobs=jobs)
            log(f"[build] {backend}: compiled {len(run.compiled)} units, linked in {time.monotonic() - t1:.1f} s")
        else:
            run = plan
            log(f"[build] {backend}: {len(units)} units up to date (nothing to compile)")
        built_so = obj_dir / so_name

        report = _layout.abi_check(built_so, _tc.PY_ABI_TARGET, _tc.MANYLINUX_TARGET)
        tp = torch
        names = ("libtorch.so", "libtorch_cpu.so", "libc10.so", "libtorch_cuda.so")
        libs = [tp.lib_dir / n for n in names if (tp.lib_dir / n).is_file()]
        # The CUDA shims (aoti_torch_get_current_cuda_stream, ...) live in libtorch_cuda.so; building with a
        # CPU-only torch, they can only be resolved when the variant is loaded by a CUDA torch.
        lenient = backend == "cuda" and not (tp.lib_dir / "libtorch_cuda.so").is_file()
        _layout.symbol_check(built_so, libs, report, ("aoti_torch_", "torch_") if lenient else ())
        if report.abi3:
            raise BuildError(
                f"{built_so.name}: not abi3-clean for Python {_tc.PY_ABI_TARGET}: " + ", ".join(report.abi3)
            )
        if report.unresolved:
            raise BuildError(
                f"{built_so.name}: undefined symbols found in no linked library (a source missing from build.toml "
                "src?): " + "; ".join(report.unresolved[:20])
            )
        if strict and report.manylinux:
            raise BuildError(
                f"{built_so.name}: not {_tc.MANYLINUX_TARGET}-clean ({len(report.manylinux)} symbols): "
                + ", ".join(report.manylinux)
            )
        fatbin = None
        if backend == "cuda":
            fatbin = _check_fatbin(built_so, cuda, archs, strict, log)

        metadata = {
            "id": ops_name,
            "name": cfg.name,
            "version": cfg.version,
            "license": cfg.license,
            "python-depends": cfg.python_depends_for(backend),
            "backend": {"type": backend, **({"archs": archs} if backend == "cuda" else {})},
        }
        for key in ("upstream", "source"):
            if getattr(cfg, key):
                metadata[key] = getattr(cfg, key)
        builder = {"version": _builder_version()}
        builder_git = _tc.git_state(Path(__file__).resolve().parents[1])
        if builder_git:
            builder.update(commit=builder_git.commit, dirty=builder_git.dirty)
        provenance: dict = {"kernel-builder": builder}
        if git:
            provenance["kernel"] = {"commit": git.commit, "dirty": git.dirty}
        metadata["provenance"] = provenance

        so_path, removed = _layout.install_variant(cfg, variant_dir, ops_name, built_so, metadata)

    result = BuildResult(
        backend=backend, variant=variant, variant_dir=variant_dir, ops_name=ops_name, so_path=so_path,
        obj_dir=obj_dir, compiled=run.compiled, linked=run.linked,
        archs=archs, abi=report, removed=removed, seconds=time.monotonic() - t0, fatbin=fatbin, toolchain=toolchain,
    )
    _summary(result, log)
    return result


def _check_fatbin(so: Path, cuda: _tc.CudaToolkit, archs: list[str], strict: bool, log):
    """metadata.json backend.archs must be what the fatbinary holds: SASS for every capability (sm_90a for 9.0a),
    PTX for the +PTX ones, nothing else."""
    if not cuda.cuobjdump:
        if strict:
            raise BuildError(f"{so.name}: cuobjdump not found: cannot check the fatbinary against backend.archs "
                             "(the matrix installs nvidia-cuda-cuobjdump into the toolchain env)")
        log("[build] cuda: fatbinary not checked (no cuobjdump; `winattn build --matrix` installs one)")
        return None
    elf, ptx = _tc.fatbin_archs(so, cuda.cuobjdump)
    want_elf, want_ptx = _tc.expected_fatbin(archs)
    if (elf, ptx) != (want_elf, want_ptx):
        raise BuildError(
            f"{so.name}: the fatbinary holds SASS {elf or 'none'} and PTX {ptx or 'none'}, but backend.archs "
            f"{archs} means SASS {want_elf} and PTX {want_ptx or 'none'} (cuobjdump {cuda.cuobjdump})"
        )
    return elf, ptx


def _summary(r: BuildResult, log) -> None:
    b = r.backend
    if r.removed:
        log(f"[build] {b}: removed stale {', '.join(r.removed)}")
    log(f"[build] {b}: abi3 (Python {_tc.PY_ABI_TARGET}): pass")
    if r.fatbin is not None:
        elf, ptx = r.fatbin
        log(f"[build] {b}: fatbinary (cuobjdump): SASS {', '.join('sm_' + a for a in elf)}"
            + (f", PTX {', '.join('compute_' + a for a in ptx)}" if ptx else "") + f" = backend.archs {r.archs}")
    if r.abi.manylinux:
        log(f"[build] {b}: {_tc.MANYLINUX_TARGET}: FAIL ({len(r.abi.manylinux)} symbols): {', '.join(r.abi.manylinux)}")
    else:
        log(f"[build] {b}: {_tc.MANYLINUX_TARGET}: pass")
    extra = [s for s in r.abi.exported if s != f"PyInit_{r.ops_name}"]
    if extra:
        log(f"[build] {b}: warning: exports more than PyInit_{r.ops_name}: {', '.join(extra[:10])}")
    size = r.so_path.stat().st_size / 2**20
    try:
        shown = r.variant_dir.relative_to(Path.cwd())
    except ValueError:
        shown = r.variant_dir
    log(f"[build] {b}: done in {r.seconds:.1f} s -> {shown} ({r.so_path.name}, {size:.1f} MiB)")


def build_variant(
    repo_root: Path,
    backend: str,
    build_dir: Path,
    cuda_archs: list[str] | None = None,
    *,
    unique_id: str | None = None,
    obj_dir: Path | None = None,
    log=print,
) -> Path:
    """Build (incrementally) the `backend` variant of the kernel at repo_root into build_dir; returns its dir."""
    return build(repo_root, backend, build_dir, cuda_archs, unique_id=unique_id, obj_dir=obj_dir, log=log).variant_dir


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
