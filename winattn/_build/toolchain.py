"""Compilers and paths (torch, Python, CUDA), variant names, the unique id and git provenance.

A CUDA toolkit is either the system's (nvcc on PATH / CUDA_HOME) or one assembled by the build matrix
(winattn/_build/matrix.py) in a throwaway environment: `probe_cuda(nvcc, ...)` describes either. A torch is either the
one this process imports (`torch_paths()`) or another version's package dir (`torch_paths_at(dir)`), whose headers and
libraries a per-torch variant is compiled and linked against without importing it.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..errors import BuildError
from .config import BuildConfig, parse_capability

# Py_LIMITED_API value of the abi3 target (CPython 3.9), as kernel-builder's `USE_SABI 3` targets 3.9+.
PY_LIMITED_API = 0x03090000
PY_ABI_TARGET = "3.9"
MANYLINUX_TARGET = "manylinux_2_28"


def torch_target_version(stable_abi: str) -> str:
    """TORCH_TARGET_VERSION for 'M.m': torch/headeronly/version.h encodes MAJ<<56 | MIN<<48 | PATCH<<40 | ABI_TAG."""
    major, minor = (int(x) for x in stable_abi.split("."))
    return f"0x{(major << 56) | (minor << 48):016x}"


def machine_arch() -> str:
    m = platform.machine()
    return {"AMD64": "x86_64", "arm64": "aarch64"}.get(m, m)


def variant_name(stable_abi: str, backend_tag: str) -> str:
    """torch-stable-abi210-cpu-x86_64-linux / torch-stable-abi210-cu130-x86_64-linux."""
    return f"torch-stable-abi{stable_abi.replace('.', '')}-{backend_tag}-{machine_arch()}-{platform.system().lower()}"


def torch_variant_name(torch_version: str, backend_tag: str, cxx11_abi: bool = True) -> str:
    """Per-torch (non stable-ABI) variant: torch213-cxx11-cpu-x86_64-linux. Linux names carry the C++ ABI tag, as
    kernel-builder's (kernel-builder.md §3 "Naming"); macOS/Windows names have none."""
    major, minor = (int(x) for x in torch_version.split(".")[:2])
    system = platform.system().lower()
    abi = ("-cxx11" if cxx11_abi else "-cxx98") if system == "linux" else ""
    return f"torch{major}{minor}{abi}-{backend_tag}-{machine_arch()}-{system}"


@dataclass
class TorchPaths:
    include_dirs: list[Path]
    lib_dir: Path
    version: str | None = None  # "2.13.0+cpu" (from torch/version.py), when known


def _read_torch_version(base: Path) -> str | None:
    m = re.search(r"^__version__\s*=\s*'([^']+)'", (base / "version.py").read_text(), re.M) \
        if (base / "version.py").is_file() else None
    return m.group(1) if m else None


def torch_paths_at(base: Path) -> TorchPaths:
    """Headers and libraries of the torch package dir `base` (site-packages/torch), without importing it."""
    base = Path(base).resolve()
    include = base / "include"
    if not (include / "torch" / "csrc" / "stable" / "library.h").is_file():
        raise BuildError(f"{include}: torch's stable-ABI headers (torch/csrc/stable/library.h) are missing")
    lib = base / "lib"
    if not (lib / "libtorch_cpu.so").is_file():
        raise BuildError(f"{lib}: libtorch_cpu.so not found")
    # torch/include/torch/csrc/api/include holds the full (ATen) C++ frontend: not needed by a stable-ABI binding.
    return TorchPaths(include_dirs=[include], lib_dir=lib, version=_read_torch_version(base))


@lru_cache(maxsize=1)
def torch_paths() -> TorchPaths:
    """The torch this process imports (the stable-ABI headers of every stable variant come from it).

    $WINATTN_TORCH_INCLUDE names another torch `include/` directory for the headers (the libraries still come from
    the importable torch): a GPU machine whose torch predates the stable-ABI macros the binding uses (torch 2.11
    lacks STABLE_TORCH_ERROR_CODE_CHECK) can then build the same torch-stable-abi210 variant with a newer torch's
    headers carried over, on its own cores instead of this project's 2-core build machine."""
    try:
        import torch
    except ImportError as e:
        raise BuildError(f"torch is not importable ({e}); install torch>=2.10 in this environment") from None
    paths = torch_paths_at(Path(torch.__file__).resolve().parent)
    include = os.environ.get("WINATTN_TORCH_INCLUDE")
    if include:
        inc = Path(include).resolve()
        if not (inc / "torch" / "csrc" / "stable" / "library.h").is_file():
            raise BuildError(f"WINATTN_TORCH_INCLUDE={include}: torch's stable-ABI headers "
                             "(torch/csrc/stable/library.h) are not under it")
        paths = TorchPaths(include_dirs=[inc], lib_dir=paths.lib_dir, version=paths.version)
    return paths


def python_include() -> Path:
    inc = Path(sysconfig.get_paths()["include"])
    if not (inc / "Python.h").is_file():
        raise BuildError(f"{inc}: Python.h not found (install the Python development headers)")
    return inc


def find_cxx() -> str:
    cxx = os.environ.get("CXX") or "g++"
    path = shutil.which(cxx)
    if not path:
        raise BuildError(f"C++ compiler '{cxx}' not found on PATH (set CXX)")
    return path


def find_ninja() -> str:
    """pip's ninja (the `ninja` package of this environment) first, then PATH."""
    try:
        import ninja  # type: ignore

        path = Path(ninja.BIN_DIR) / "ninja"
        if path.is_file():
            return str(path)
    except ImportError:
        pass
    exe = Path(sys.executable).parent / "ninja"
    if exe.is_file():
        return str(exe)
    path = shutil.which("ninja")
    if not path:
        raise BuildError("ninja not found: pip install ninja (the `tools` extra of winattn)")
    return path


@dataclass
class CudaToolkit:
    nvcc: str
    version: tuple[int, int]
    home: Path
    gpu_archs: list[str]  # "75", "80", ... from `nvcc --list-gpu-code` (sm_XX)
    release: str = ""  # "13.0.88" (nvcc --version's V...)
    source: str = "system"  # where it came from: "system", "pypi", "debian+pypi" (matrix toolchains)
    cuobjdump: str | None = None  # lists the fatbinary's ELF/PTX entries (the matrix checks backend.archs with it)
    ccbin: str | None = None  # host compiler for nvcc (-ccbin); None = CXX if set, else nvcc's default (g++)

    @property
    def tag(self) -> str:
        return f"cu{self.version[0]}{self.version[1]}"

    @property
    def include_dir(self) -> Path:
        return self.home / "include"

    @property
    def include_dirs(self) -> list[Path]:
        """include/ and, for CUDA >= 13 (CCCL moved to include/cccl, added by nvcc.profile as -isystem), its cccl."""
        dirs = [self.home / "include"]
        if (self.home / "include" / "cccl").is_dir():
            dirs.append(self.home / "include" / "cccl")
        return dirs

    @property
    def lib_dir(self) -> Path:
        for d in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
            if (self.home / d / "libcudart.so").exists() or (self.home / d / "libcudart_static.a").is_file():
                return self.home / d
        raise BuildError(f"{self.home}: the CUDA runtime (lib64/libcudart.so) was not found")


def find_cuda(required: bool = True) -> CudaToolkit | None:
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    if not nvcc:
        for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            if home and (Path(home) / "bin" / "nvcc").is_file():
                nvcc = str(Path(home) / "bin" / "nvcc")
                break
    if not nvcc:
        if required:
            raise BuildError("nvcc not found on PATH (or in CUDA_HOME): needed for the cuda backend")
        return None
    return _probe_cuda(nvcc)


def probe_cuda(nvcc: str, *, home: Path | None = None, source: str = "system", cuobjdump: str | None = None,
               ccbin: str | None = None) -> CudaToolkit:
    """Describe the toolkit of `nvcc` (version, targets); `home` overrides the toolkit root guessed from its path."""
    tk = _probe_cuda(str(nvcc))
    return CudaToolkit(
        nvcc=tk.nvcc, version=tk.version, home=Path(home) if home else tk.home, gpu_archs=list(tk.gpu_archs),
        release=tk.release, source=source, cuobjdump=cuobjdump or tk.cuobjdump, ccbin=ccbin,
    )


@lru_cache(maxsize=8)
def _probe_cuda(nvcc: str) -> CudaToolkit:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
        codes = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise BuildError(f"{nvcc} --version failed: {e}") from None
    m = re.search(r"release (\d+)\.(\d+)", out)
    if not m:
        raise BuildError(f"cannot read the CUDA version from `{nvcc} --version`: {out.strip()[-200:]}")
    rel = re.search(r", V(\d+\.\d+\.\d+)", out)
    archs = sorted({c[3:] for c in codes.split() if re.fullmatch(r"sm_\d+[af]?", c) and c[-1].isdigit()}, key=int)
    home = Path(os.path.realpath(nvcc)).parent.parent
    if not (home / "include" / "cuda_runtime.h").is_file() and Path("/usr/local/cuda/include/cuda_runtime.h").is_file():
        home = Path("/usr/local/cuda")
    cuobjdump = next((str(p) for p in (Path(nvcc).parent / "cuobjdump", home / "bin" / "cuobjdump") if p.is_file()),
                     None) or shutil.which("cuobjdump")
    return CudaToolkit(nvcc=nvcc, version=(int(m.group(1)), int(m.group(2))), home=home, gpu_archs=archs,
                       release=rel.group(1) if rel else "", cuobjdump=cuobjdump)


def select_cuda_archs(requested: list[str], toolkit: CudaToolkit, key: str) -> list[str]:
    """Loose intersection of capabilities ('8.0', '9.0a', '12.0+PTX') with what nvcc can target."""
    kept = []
    for cap in requested:
        major, minor, _suffix, _ptx = parse_capability(cap, key)
        if f"{major}{minor}" in toolkit.gpu_archs:
            if cap not in kept:
                kept.append(cap)
    if not kept:
        raise BuildError(
            f"{key} = {requested}: none is supported by nvcc {toolkit.version[0]}.{toolkit.version[1]} "
            f"(it targets {', '.join(a[:-1] + '.' + a[-1] for a in toolkit.gpu_archs)})"
        )
    return kept


def loose_intersection(requested: list[str], defaults: list[str]) -> list[str]:
    """kernel-builder's cuda_archs_loose_intersection (kernel-builder.md §3): keep each requested capability whose
    base arch (major.minor) is in the toolkit's default list; '9.0a' / '10.0f' survive if 9.0 / 10.0 do; a requested
    '+PTX' is kept. Order and duplicates follow `requested`."""
    base = {parse_capability(c)[:2] for c in defaults}
    kept = []
    for cap in requested:
        if parse_capability(cap)[:2] in base and cap not in kept:
            kept.append(cap)
    return kept


def fatbin_archs(so: Path, cuobjdump: str) -> tuple[list[str], list[str]]:
    """(SASS archs, PTX archs) embedded in `so`, from `cuobjdump --list-elf` / `--list-ptx`: e.g. (['80', '90a'],
    ['90']). Entries look like `ELF file    1: name.1.sm_80.cubin` / `PTX file    1: name.1.sm_90.ptx`."""
    out = {}
    for kind, flag in (("elf", "--list-elf"), ("ptx", "--list-ptx")):
        try:
            r = subprocess.run([cuobjdump, flag, str(so)], capture_output=True, text=True)
        except OSError as e:
            raise BuildError(f"cannot run {cuobjdump}: {e}") from None
        text = r.stdout + r.stderr
        if r.returncode != 0 and "does not contain" not in text:
            raise BuildError(f"{cuobjdump} {flag} {so.name} failed ({r.returncode}): {text.strip()[-300:]}")
        found = re.findall(r"\bsm_(\d+[af]?)\.(?:cubin|ptx)\b", text)
        out[kind] = sorted(set(found), key=lambda a: (int(re.sub(r"\D", "", a)), a))
    return out["elf"], out["ptx"]


def expected_fatbin(caps: list[str]) -> tuple[list[str], list[str]]:
    """What gencode_flags(caps) puts in the fatbinary: SASS for every cap, PTX for the '+PTX' ones."""
    elf, ptx = set(), set()
    for cap in caps:
        major, minor, suffix, with_ptx = parse_capability(cap)
        elf.add(f"{major}{minor}{suffix}")
        if with_ptx:
            ptx.add(f"{major}{minor}{suffix}")

    def key(a):
        return (int(re.sub(r"\D", "", a)), a)

    return sorted(elf, key=key), sorted(ptx, key=key)


def gencode_flags(caps: list[str]) -> list[str]:
    flags = []
    for cap in caps:
        major, minor, suffix, ptx = parse_capability(cap)
        arch = f"{major}{minor}{suffix}"
        flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{arch},code=compute_{arch}")
    return flags


# ---------------------------------------------------------------------------------------------------------------
# Git: unique id and provenance


@dataclass
class GitState:
    commit: str  # HEAD, 40 hex
    tree: str  # HEAD^{tree}
    dirty: bool

    @property
    def unique_id(self) -> str:
        return self.tree[:7] + ("_dirty" if self.dirty else "")


def _git(root: Path, *args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    except OSError:
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def git_state(root: Path) -> GitState | None:
    """HEAD commit/tree and whether tracked files differ from HEAD; None outside a git work tree."""
    commit = _git(root, "rev-parse", "HEAD")
    tree = _git(root, "rev-parse", "HEAD^{tree}")
    if not commit or not tree:
        return None
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return GitState(commit=commit, tree=tree, dirty=bool(status))


def content_id(cfg: BuildConfig) -> str:
    """Id of a kernel tree outside git: 7 hex of a hash over build.toml, the sources and the Python package."""
    h = hashlib.sha256()
    files = [cfg.root / "build.toml"] + [cfg.root / s for s in cfg.torch_src]
    for k in cfg.kernels:
        files += [cfg.root / s for s in k.src]
    files += sorted(p for p in cfg.python_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for f in files:
        if f.is_file():
            h.update(str(f.relative_to(cfg.root)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:7] + "_nogit"


def check_unique_id(uid: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_]+", uid):
        raise BuildError(f"unique id '{uid}' must be letters, digits and '_' (it becomes a C identifier)")
    return uid
