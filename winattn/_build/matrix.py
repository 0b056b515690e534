"""`winattn build --matrix`: every variant this machine can make, each in isolation, checked, in one build dir.

    winattn build --matrix [--cuda cu124 cu130 cu132] [--torch 2.13 ...] [--backend cpu|cuda|all] [--clean]

The plan (docs/build-matrix.md):

* `torch-stable-abi210-cpu-<arch>-linux`: the host C++ compiler.
* one `torch-stable-abi210-cu<XY>-<arch>-linux` per CUDA toolkit of TOOLCHAINS (default DEFAULT_CUDA): the system
  nvcc, or a toolkit assembled in a throwaway environment under the toolchain cache
  (`$WINATTN_TOOLCHAIN_CACHE`, default `~/.cache/winattn/toolchains/<name>/`), downloaded only when missing.
* with `--torch 2.13 ...`, one per-torch `torch213-cxx11-cpu-<arch>-linux` per version, compiled against that
  torch's headers (this process's torch when the version matches, else a throwaway venv with that torch wheel).

Each variant has its own object dir (`_build_obj/matrix/<variant>/`), its own toolkit and torch paths (nothing is read from
the environment of another), and the checks are fatal: abi3 (Python 3.9), manylinux_2_28, every undefined symbol
resolvable, and for CUDA the fatbinary (`cuobjdump --list-elf/--list-ptx`, PyPI's nvidia-cuda-cuobjdump installed
into the toolchain env) holding exactly metadata.json's `backend.archs`. A failing variant is reported with its reason
and the others still build; the exit status is 1 if any failed.

Why the CUDA 12 toolkit is 12.4 (cu124) and not 12.6: PyPI's `nvidia-cuda-nvcc-cu12` wheels (12.0 ... 12.9) ship
ptxas, libnvvm, libdevice and the crt headers only (no nvcc driver, cicc, cudafe++, fatbinary, nvlink), so they
cannot compile a .cu file; the CUDA 13 wheels (`nvidia-cuda-nvcc` + `nvidia-cuda-crt` + `nvidia-nvvm`) are complete.
A CUDA 12 compiler driver is only packaged by Debian (non-free `nvidia-cuda-toolkit`, 12.4.1 in trixie, the
newest in a release; 12.5 in experimental only), so `cu124` takes nvcc/cicc/cudafe++/ptxas/fatbinary/nvlink from that
.deb and the headers, libcudart and CCCL from the matching PyPI 12.4 wheels. By the loader's CUDA-minor rule a cu124
variant serves every CUDA 12.x torch >= 12.4 (12.6, 12.8, 12.9).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import BuildError
from . import toolchain as _tc
from .locking import FileLock

CACHE_ENV = "WINATTN_TOOLCHAIN_CACHE"
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


@dataclass(frozen=True)
class ToolchainSpec:
    """A CUDA toolkit of the matrix. `source`:

    * "system": nvcc on PATH / CUDA_HOME, which must report `version`; the env only gets `pip` (cuobjdump).
    * "pypi": every part from PyPI wheels (`pip`), which install one CUDA tree under site-packages/`pypi_root`.
    * "debian+pypi": the compiler binaries from Debian `debs` (`apt_source`), headers and libraries from `pip`.
    """

    name: str  # the variant's backend tag: cu124
    version: tuple[int, int]
    source: str
    pip: tuple[str, ...] = ()
    debs: tuple[str, ...] = ()
    apt_source: str = ""
    pypi_root: str = ""  # for "pypi": the toolkit root inside site-packages (nvidia/cu13)
    note: str = ""

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


CUOBJDUMP = "nvidia-cuda-cuobjdump==13.2.86"  # no cu12 build on PyPI; the CUDA 13 one reads CUDA 12 fatbinaries

TOOLCHAINS: dict[str, ToolchainSpec] = {
    "cu124": ToolchainSpec(
        name="cu124",
        version=(12, 4),
        source="debian+pypi",
        debs=("nvidia-cuda-toolkit=12.4.131~12.4.1-2",),
        apt_source=f"deb [signed-by={DEBIAN_KEYRING}] http://deb.debian.org/debian trixie non-free",
        pip=(
            "nvidia-cuda-nvcc-cu12==12.4.131",  # crt/ headers, libdevice (its bin/ has ptxas only)
            "nvidia-cuda-runtime-cu12==12.4.127",  # cuda_runtime.h, cuda_fp16.h, ..., libcudart.so.12
            "nvidia-cuda-cccl-cu12==12.4.127.post1",  # cub/thrust/libcu++
            CUOBJDUMP,
        ),
        note="CUDA 12.4.1: nvcc from Debian trixie's nvidia-cuda-toolkit, headers/libcudart/CCCL from PyPI",
    ),
    "cu130": ToolchainSpec(
        name="cu130",
        version=(13, 0),
        source="system",
        pip=(CUOBJDUMP,),
        note="the system nvcc 13.0 (PATH / CUDA_HOME)",
    ),
    "cu132": ToolchainSpec(
        name="cu132",
        version=(13, 2),
        source="pypi",
        pypi_root="nvidia/cu13",
        pip=(
            "nvidia-cuda-nvcc==13.2.86",
            "nvidia-cuda-crt==13.2.86",
            "nvidia-nvvm==13.2.86",
            "nvidia-cuda-runtime==13.2.86",
            "nvidia-cuda-cccl==13.2.86",
            CUOBJDUMP,
        ),
        note="CUDA 13.2 entirely from PyPI wheels",
    ),
}
DEFAULT_CUDA = ("cu124", "cu130", "cu132")


class ToolchainUnavailable(BuildError):
    """The toolkit cannot be had on this machine (reported as `skipped`, not as a failure, unless asked for)."""


def cache_root() -> Path:
    """$WINATTN_TOOLCHAIN_CACHE, else $XDG_CACHE_HOME/winattn/toolchains, else ~/.cache/winattn/toolchains."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "winattn" / "toolchains"




def _run(cmd: list[str], what: str, **kw) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    except OSError as e:
        raise ToolchainUnavailable(f"{what}: cannot run {cmd[0]}: {e}") from None
    if r.returncode != 0:
        raise BuildError(f"{what} failed ({' '.join(cmd[:4])} ... exited {r.returncode}):\n"
                         + (r.stdout + r.stderr).strip()[-2000:])
    return r.stdout


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise BuildError(f"{venv}: no lib/python3*/site-packages")
    return found[0]


def make_venv(venv: Path, requirements: list[str], log, *, what: str) -> Path:
    """A throwaway venv (no pip of its own: the running pip installs into it with --python) holding exactly
    `requirements` (--no-deps: every part is pinned above). Returns its site-packages."""
    if venv.exists():
        shutil.rmtree(venv)
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], f"{what}: python -m venv")
    if requirements:
        log(f"[matrix]   pip install {' '.join(requirements)}")
        t0 = time.monotonic()
        _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
              "--disable-pip-version-check", *requirements], f"{what}: pip install")
        log(f"[matrix]   ... {time.monotonic() - t0:.0f} s")
    return _site_packages(venv)


def fetch_debs(spec: ToolchainSpec, dest: Path, apt_dir: Path, log) -> list[Path]:
    """`apt-get download` the pinned .debs with a private apt state (sources list, lists, cache under apt_dir): the
    system's apt configuration is neither read for sources nor changed. apt checks the archive signature against
    Debian's keyring and each .deb against the signed Packages index."""
    if shutil.which("apt-get") is None:
        raise ToolchainUnavailable(f"{spec.name}: apt-get not found (the CUDA 12 compiler comes from Debian's "
                                   f"nvidia-cuda-toolkit .deb)")
    if not Path(DEBIAN_KEYRING).is_file():
        raise ToolchainUnavailable(f"{spec.name}: {DEBIAN_KEYRING} missing (apt-get install debian-archive-keyring)")
    for d in ("lists/partial", "cache/archives/partial"):
        (apt_dir / d).mkdir(parents=True, exist_ok=True)
    (apt_dir / "sources.list").write_text(spec.apt_source + "\n")
    opts = [
        "-o", f"Dir::Etc::SourceList={apt_dir / 'sources.list'}", "-o", "Dir::Etc::SourceParts=/dev/null",
        "-o", f"Dir::State::Lists={apt_dir / 'lists'}", "-o", f"Dir::Cache={apt_dir / 'cache'}",
        "-o", "APT::Sandbox::User=root", "-o", "Debug::NoLocking=1", "-q",
    ]
    log(f"[matrix]   apt-get update ({spec.apt_source.split('] ', 1)[-1]})")
    _run(["apt-get", *opts, "update"], f"{spec.name}: apt-get update")
    dest.mkdir(parents=True, exist_ok=True)
    log(f"[matrix]   apt-get download {' '.join(spec.debs)}")
    _run(["apt-get", *opts, "download", *spec.debs], f"{spec.name}: apt-get download", cwd=dest)
    debs = sorted(dest.glob("*.deb"))
    if len(debs) != len(spec.debs):
        raise BuildError(f"{spec.name}: expected {len(spec.debs)} .deb files in {dest}, found {len(debs)}")
    return debs


NVCC_PROFILE = """\
# Written by winattn/_build/matrix.py: the standard layout of a CUDA toolkit rooted one level above this file.
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
"""


def _place(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_symlink():
        dst.symlink_to(os.readlink(src))
    elif src.is_dir():
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)


def assemble_debian_toolkit(spec: ToolchainSpec, debs: list[Path], site: Path, home: Path) -> None:
    """A CUDA home (bin/ nvvm/ include/ lib64/ like NVIDIA's installer makes) from Debian's nvidia-cuda-toolkit
    (compiler binaries: Debian keeps them in /usr/bin and /usr/lib/nvidia-cuda-toolkit) and the PyPI cu12 wheels
    (headers, libcudart, libdevice, CCCL). The binaries are copied, not linked: nvcc reads nvcc.profile from the
    directory it runs from."""
    if home.exists():
        shutil.rmtree(home)
    with tempfile.TemporaryDirectory(dir=home.parent) as tmp:
        x = Path(tmp)
        for deb in debs:
            _run(["dpkg-deb", "-x", str(deb), str(x)], f"{spec.name}: dpkg-deb -x {deb.name}")
        tk = x / "usr" / "lib" / "nvidia-cuda-toolkit"
        _place(tk / "bin" / "nvcc", home / "bin" / "nvcc")  # /usr/bin/nvcc is Debian's shell wrapper
        for tool in ("cudafe++", "fatbinary", "nvlink", "ptxas", "bin2c", "nvprune", "cu++filt", "cuobjdump"):
            if (x / "usr" / "bin" / tool).is_file():
                _place(x / "usr" / "bin" / tool, home / "bin" / tool)
        _place(tk / "bin" / "crt", home / "bin" / "crt")
        _place(tk / "bin" / "cicc", home / "nvvm" / "bin" / "cicc")
        _place(tk / "libdevice", home / "nvvm" / "libdevice")
    (home / "bin" / "nvcc.profile").write_text(NVCC_PROFILE)
    nv = site / "nvidia"
    for pkg in ("cuda_runtime", "cuda_nvcc", "cuda_cccl"):
        inc = nv / pkg / "include"
        if inc.is_dir():
            for item in inc.iterdir():
                if item.name != "__init__.py" and item.name != "__pycache__":
                    _place(item, home / "include" / item.name)
    if (nv / "cuda_nvcc" / "nvvm" / "lib64").is_dir():
        _place(nv / "cuda_nvcc" / "nvvm" / "lib64", home / "nvvm" / "lib64")
    lib = home / "lib64"
    lib.mkdir(parents=True, exist_ok=True)
    for so in sorted((nv / "cuda_runtime" / "lib").glob("libcudart.so*")):
        _place(so, lib / so.name)
    versioned = sorted(lib.glob("libcudart.so.*"))
    if not versioned:
        raise BuildError(f"{spec.name}: nvidia-cuda-runtime-cu12 has no libcudart.so.*")
    if not (lib / "libcudart.so").exists():
        (lib / "libcudart.so").symlink_to(versioned[0].name)
    missing = [p for p in ("bin/nvcc", "bin/ptxas", "bin/fatbinary", "bin/cudafe++", "nvvm/bin/cicc",
                           "include/cuda_runtime.h", "include/crt/host_config.h") if not (home / p).exists()]
    if missing:
        raise BuildError(f"{spec.name}: the assembled toolkit {home} lacks {', '.join(missing)}")


SMOKE_CU = """\
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
__global__ void winattn_smoke(__nv_bfloat16* x) { x[threadIdx.x] = __float2bfloat16(1.0f); }
"""


def _smoke_test(tk: _tc.CudaToolkit, where: Path) -> None:
    """Compile one kernel with the toolkit (headers, cicc, ptxas, fatbinary all found) for its lowest target."""
    src = where / "smoke.cu"
    src.write_text(SMOKE_CU)
    arch = tk.gpu_archs[0]
    cmd = [tk.nvcc, "-c", str(src), "-o", str(where / "smoke.o"), f"-gencode=arch=compute_{arch},code=sm_{arch}"]
    cmd += [f"-I{d}" for d in tk.include_dirs]
    if tk.ccbin:
        cmd.append(f"-ccbin={tk.ccbin}")
    _run(cmd, f"{tk.tag}: smoke compile")


def ensure_toolchain(spec: ToolchainSpec, root: Path | None = None, log=print) -> _tc.CudaToolkit:
    """The toolkit of `spec`, provisioned under <root>/<name>/ on first use (a stamp records the spec it was made
    from; a changed spec re-provisions). Raises ToolchainUnavailable if this machine cannot have it."""
    root = Path(root) if root else cache_root()
    d = root / spec.name
    stamp = d / "toolchain.json"
    with FileLock(root / f".{spec.name}.lock"):
        info = json.loads(stamp.read_text()) if stamp.is_file() else {}
        if info.get("spec") != spec.digest() or not Path(info.get("nvcc", "/nonexistent")).exists():
            t0 = time.monotonic()
            log(f"[matrix] {spec.name}: provisioning {spec.note or spec.source} in {d}")
            d.mkdir(parents=True, exist_ok=True)
            stamp.unlink(missing_ok=True)
            site = make_venv(d / "venv", list(spec.pip), log, what=spec.name)
            if spec.source == "system":
                system = _tc.find_cuda(required=False)
                if system is None:
                    raise ToolchainUnavailable(f"{spec.name}: no system nvcc (PATH, CUDA_HOME, /usr/local/cuda)")
                nvcc, home = system.nvcc, system.home
            elif spec.source == "pypi":
                home = site / spec.pypi_root
                nvcc = str(home / "bin" / "nvcc")
            elif spec.source == "debian+pypi":
                debs = fetch_debs(spec, d / "debs", d / "apt", log)
                home = d / "cuda"
                assemble_debian_toolkit(spec, debs, site, home)
                shutil.rmtree(d / "debs")  # the assembled home keeps what is needed; the .deb is 87 MB
                nvcc = str(home / "bin" / "nvcc")
            else:
                raise BuildError(f"{spec.name}: unknown toolchain source {spec.source!r}")
            if not Path(nvcc).is_file():
                raise BuildError(f"{spec.name}: {nvcc} missing after provisioning")
            cuobjdump = next((str(p) for p in sorted(site.glob("nvidia/*/bin/cuobjdump"))), None)
            info = {"spec": spec.digest(), "name": spec.name, "source": spec.source, "nvcc": nvcc, "home": str(home),
                    "cuobjdump": cuobjdump, "pip": list(spec.pip), "debs": list(spec.debs),
                    "seconds": round(time.monotonic() - t0, 1)}
            tk = _toolkit_from(info, spec)
            with tempfile.TemporaryDirectory(dir=d) as tmp:
                _smoke_test(tk, Path(tmp))
            stamp.write_text(json.dumps(info, indent=2) + "\n")
            log(f"[matrix] {spec.name}: ready in {info['seconds']:.0f} s (nvcc {tk.release})")
        return _toolkit_from(info, spec)


def _toolkit_from(info: dict, spec: ToolchainSpec) -> _tc.CudaToolkit:
    tk = _tc.probe_cuda(info["nvcc"], home=Path(info["home"]), source=spec.source, cuobjdump=info.get("cuobjdump"))
    if tk.version != spec.version:
        raise ToolchainUnavailable(
            f"{spec.name}: {info['nvcc']} is CUDA {tk.version[0]}.{tk.version[1]}, not {spec.version[0]}.{spec.version[1]}"
        )
    return tk


# ---------------------------------------------------------------------------------------------------------------
# Per-torch variants: that torch's headers and libraries


def torch_for(version: str, root: Path | None = None, log=print) -> _tc.TorchPaths:
    """Headers/libraries of torch `version` ("2.13"): this process's torch if it is that version, else a throwaway
    venv under the toolchain cache with `torch==<version>.*` (--no-deps; only its headers and libraries are used:
    nothing of it is imported). pip's own index decides which wheel that is (PyPI's default torch is a CUDA build)."""
    mine = _tc.torch_paths()
    if mine.version and ".".join(mine.version.split("+")[0].split(".")[:2]) == version:
        return mine
    root = Path(root) if root else cache_root()
    d = root / f"torch-{version}"
    with FileLock(root / f".torch-{version}.lock"):
        found = sorted(d.glob("venv/lib/python3*/site-packages/torch"))
        if not found or not (d / "ready").is_file():
            log(f"[matrix] torch {version}: provisioning a throwaway venv in {d}")
            site = make_venv(d / "venv", [f"torch=={version}.*"], log, what=f"torch {version}")
            found = [site / "torch"]
            (d / "ready").write_text(version + "\n")
        paths = _tc.torch_paths_at(found[0])
    if not paths.version or not paths.version.startswith(version + "."):
        raise BuildError(f"torch {version}: {found[0]} is torch {paths.version}")
    return paths


# ---------------------------------------------------------------------------------------------------------------
# The matrix


@dataclass
class MatrixEntry:
    backend: str  # cpu | cuda
    toolchain: str = ""  # CUDA: a TOOLCHAINS key
    torch_version: str | None = None  # per-torch variant; None = stable ABI

    @property
    def label(self) -> str:
        what = self.toolchain or "cpu"
        return what if self.torch_version is None else f"{what}, torch {self.torch_version}"


@dataclass
class MatrixRow:
    entry: MatrixEntry
    status: str  # ok | FAILED | skipped
    variant: str = ""
    seconds: float = 0.0  # compile + checks (toolchain provisioning excluded, see setup_seconds)
    setup_seconds: float = 0.0
    size: int = 0
    toolchain: str = ""
    abi3: str = ""
    manylinux: str = ""
    archs: list[str] = field(default_factory=list)
    fatbin: str = ""
    reason: str = ""


def plan(backends: list[str], cuda: list[str], torch_versions: list[str]) -> list[MatrixEntry]:
    entries = []
    if "cpu" in backends:
        entries.append(MatrixEntry("cpu"))
    if "cuda" in backends:
        for name in cuda:
            if name not in TOOLCHAINS:
                raise BuildError(f"--cuda {name}: unknown toolkit (known: {', '.join(TOOLCHAINS)})")
            entries.append(MatrixEntry("cuda", toolchain=name))
    for v in torch_versions:
        parts = v.split(".")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise BuildError(f"--torch {v}: expected a major.minor torch version such as 2.13")
        entries.append(MatrixEntry("cpu", torch_version=v))
    return entries


def variant_for(cfg, e: MatrixEntry, cuda: _tc.CudaToolkit | None) -> str:
    from .variant_build import variant_name_for

    return variant_name_for(cfg, e.backend, cuda, e.torch_version or None)


def run_matrix(
    repo_root: Path,
    build_dir: Path,
    entries: list[MatrixEntry],
    *,
    cuda_archs: list[str] | None = None,
    unique_id: str | None = None,
    jobs: int | None = None,
    toolchain_root: Path | None = None,
    obj_root: Path | None = None,
    log=print,
) -> list[MatrixRow]:
    from .config import load_config
    from .variant_build import build

    cfg = load_config(Path(repo_root))
    rows = []
    n = len(entries)
    for i, e in enumerate(entries, 1):
        head = f"[matrix] ({i}/{n}) {e.label}"
        log(f"{head}: start")
        t0 = time.monotonic()
        row = MatrixRow(entry=e, status="FAILED")
        try:
            cuda = torch = None
            if e.backend == "cuda":
                cuda = ensure_toolchain(TOOLCHAINS[e.toolchain], toolchain_root, log)
            if e.torch_version:
                torch = torch_for(e.torch_version, toolchain_root, log)
            row.setup_seconds = time.monotonic() - t0
            row.variant = variant_for(cfg, e, cuda)
            obj_dir = Path(obj_root) / row.variant if obj_root else None
            r = build(repo_root, e.backend, build_dir, cuda_archs if e.backend == "cuda" else None,
                      unique_id=unique_id, obj_dir=obj_dir, jobs=jobs, log=log, cuda=cuda, torch=torch,
                      torch_version=e.torch_version, strict=True)
            row.status = "ok"
            row.variant = r.variant
            row.seconds = r.seconds
            row.size = r.so_path.stat().st_size
            row.toolchain = r.toolchain
            row.abi3 = "pass"
            row.manylinux = "pass"
            row.archs = list(r.archs)
            if r.fatbin is not None:
                elf, ptx = r.fatbin
                row.fatbin = " ".join([f"sm_{a}" for a in elf] + [f"compute_{a}" for a in ptx])
        except ToolchainUnavailable as err:
            row.status = "skipped"
            row.reason = str(err)
        except BuildError as err:
            row.reason = str(err)
            stale = Path(build_dir) / row.variant if row.variant else None
            if stale is not None and stale.is_dir():
                # an older build of this variant must not be published as if it were this one
                shutil.rmtree(stale)
                row.reason += f"\n(removed the previous {row.variant} from {build_dir})"
        row.seconds = row.seconds or (time.monotonic() - t0 - row.setup_seconds)
        rows.append(row)
        end = {"ok": f"ok in {row.seconds:.1f} s", "skipped": "skipped", "FAILED": "FAILED"}[row.status]
        log(f"{head}: {row.variant or '-'}: {end}" + (f": {row.reason.splitlines()[0]}" if row.reason else ""))
    return rows


def summary_table(rows: list[MatrixRow]) -> str:
    """Markdown table: variant, toolchain, seconds, size, abi3, manylinux_2_28, archs / fatbinary."""
    head = ["variant", "toolchain", "status", "seconds", "size", "abi3 (3.9)", _tc.MANYLINUX_TARGET,
            "backend.archs = fatbinary"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        archs = ", ".join(r.archs) if r.archs else "-"
        if r.fatbin:
            archs += f" = {r.fatbin}"
        size = f"{r.size / 2**20:.1f} MiB" if r.size else "-"
        secs = f"{r.seconds:.1f}" + (f" (+{r.setup_seconds:.0f} setup)" if r.setup_seconds >= 1 else "")
        cells = [r.variant or f"({r.entry.label})", r.toolchain or "-", r.status, secs if r.status == "ok" else "-",
                 size, r.abi3 or "-", r.manylinux or "-", archs]
        lines.append("| " + " | ".join(cells) + " |")
    for r in rows:
        if r.reason:
            lines.append(f"\n{r.variant or r.entry.label}: {r.status}: {r.reason}")
    return "\n".join(lines)


def write_summary(rows: list[MatrixRow], path: Path) -> None:
    data = []
    for r in rows:
        d = asdict(r)
        d["entry"] = asdict(r.entry)
        data.append(d)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
