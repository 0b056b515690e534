"""One variant, built: `build(repo_root, backend, build_dir, ...) -> BuildResult` and `build_variant(...) -> Path`.

The single-variant build of `winattn build` (module docstring of `winattn.build`): compile with ninja, check the ABI
and the fatbinary, write the variant directory and its metadata.json. The matrix (`matrix.py`) runs it once per
entry; the CLI (`winattn.build`) sits on top of both. Nothing here imports upwards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BuildError
from . import compile as _compile
from . import layout as _layout
from . import toolchain as _tc
from .config import CUDA_SOURCE_SUFFIXES, check_backend, load_config
from .locking import FileLock

__all__ = ["BuildResult", "build", "build_variant", "compile_sources", "kernel_cuda_caps", "variant_name_for"]

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


def variant_name_for(cfg, backend: str, cuda: "_tc.CudaToolkit | None", torch_version: str | None = None) -> str:
    """The variant directory name a build makes (the one place that names it): stable-ABI
    `torch-stable-abi210-<cpu|cu130>-x86_64-linux`, or per-torch `torch213-cxx11-cpu-...` with `torch_version`."""
    tag = cuda.tag if backend == "cuda" and cuda is not None else "cpu"
    if torch_version is not None:
        return _tc.torch_variant_name(torch_version, tag)
    return _tc.variant_name(cfg.stable_abi_for(backend), tag)


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


@dataclass
class _Plan:
    """What a build of one variant decides before it compiles: shared by `build` and `compile_sources`."""
    root: Path
    cfg: object  # BuildConfig
    backend: str
    kernels: list
    stable_abi: str | None
    torch: _tc.TorchPaths
    cuda: _tc.CudaToolkit | None
    cuda_caps: dict[str, list[str]]
    toolchain: str
    git: object  # _tc.GitState | None
    ops_name: str
    variant: str
    obj_dir: Path
    archs: list[str]

    @property
    def so_name(self) -> str:
        return f"{self.ops_name}.abi3.so"


def _plan(repo_root, backend, cuda_archs, unique_id, obj_dir, cuda, torch, torch_version, log) -> _Plan:
    """The kernels, toolchain, capabilities, ops name, variant name and object dir of a build (see `build`)."""
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
        toolchain = f"nvcc {cuda.release or '.'.join(map(str, cuda.version))} ({cuda.source})"
    else:
        cuda = None
        toolchain = _cxx_version(_tc.find_cxx())

    git = _tc.git_state(root)
    uid = _tc.check_unique_id(unique_id or (git.unique_id if git else _tc.content_id(cfg)))
    ops_name = f"_{cfg.python_name}_{backend}_{uid}"
    variant = variant_name_for(cfg, backend, cuda, torch_version)
    obj_dir = Path(obj_dir).resolve() if obj_dir else root / "_build_obj" / variant
    archs = sorted({c for caps in cuda_caps.values() for c in caps}, key=lambda c: _tc.parse_capability(c)[:3])

    return _Plan(root=root, cfg=cfg, backend=backend, kernels=kernels, stable_abi=stable_abi, torch=torch, cuda=cuda,
                 cuda_caps=cuda_caps, toolchain=toolchain, git=git, ops_name=ops_name, variant=variant,
                 obj_dir=obj_dir, archs=archs)


def _write_ninja(plan: _Plan) -> list:
    """registration.h, manylinux_compat.cpp and build.ninja in the object dir; returns the units."""
    _compile.write_generated(plan.obj_dir)
    units = _compile.plan_units(plan.cfg, plan.backend, plan.kernels, plan.ops_name, plan.stable_abi, plan.obj_dir,
                                plan.cuda, plan.cuda_caps, plan.torch)
    ldflags = _compile.link_flags(plan.backend, plan.cuda, plan.obj_dir, plan.torch)
    _compile.write_build_ninja(plan.obj_dir, _tc.find_cxx(), plan.cuda, units, plan.so_name, ldflags)
    return units


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
    plan = _plan(repo_root, backend, cuda_archs, unique_id, obj_dir, cuda, torch, torch_version, log)
    cfg, cuda, torch, obj_dir = plan.cfg, plan.cuda, plan.torch, plan.obj_dir
    ops_name, variant, archs, git, toolchain = plan.ops_name, plan.variant, plan.archs, plan.git, plan.toolchain
    build_dir = Path(build_dir).resolve()
    variant_dir = build_dir / variant

    log(f"[build] {backend}: {variant} (ops namespace {ops_name})")
    # Concurrent builds of one variant wait instead of sharing ninja state.
    with FileLock(obj_dir / ".lock"):
        units = _write_ninja(plan)
        so_name = plan.so_name
        ninja = _tc.find_ninja()
        pending = _compile.run_ninja(ninja, obj_dir, so_name, log, dry_run=True)
        if pending.compiled or pending.linked:
            arch_note = f" for {', '.join(archs)}" if archs else ""
            log(f"[build] {backend}: compiling {len(pending.compiled)} of {len(units)} units{arch_note} ...")
            t1 = time.monotonic()
            run = _compile.run_ninja(ninja, obj_dir, so_name, log, jobs=jobs)
            log(f"[build] {backend}: compiled {len(run.compiled)} units, linked in {time.monotonic() - t1:.1f} s")
        else:
            run = pending
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
        builder_git = _tc.git_state(Path(__file__).resolve().parents[2])
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


def compile_sources(
    repo_root: Path,
    backend: str,
    sources: list[str],
    cuda_archs: list[str] | None = None,
    *,
    obj_dir: Path,
    jobs: int | None = None,
    log=print,
) -> list[str]:
    """Compile only `sources` (paths as build.toml names them) of the `backend` variant into `obj_dir`, with the
    exact flags a build uses; no link, no variant dir. Returns the sources compiled. CI's CUDA check uses it: every
    unit of the variant is ~15 minutes on 2 cores (docs/build-matrix.md "CI")."""
    plan = _plan(repo_root, backend, cuda_archs, "compile_only", obj_dir, None, None, None, log)
    with FileLock(plan.obj_dir / ".lock"):
        units = {u.rel: u for u in _write_ninja(plan)}
        unknown = [s for s in sources if s not in units]
        if unknown:
            raise BuildError(f"not a compiled source of the {backend} variant in build.toml: {', '.join(unknown)}")
        run = _compile.run_ninja(_tc.find_ninja(), plan.obj_dir, [units[s].obj for s in sources], log, jobs=jobs)
    return run.compiled


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
