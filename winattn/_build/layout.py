"""The variant directory (kernel-builder's flat layout, kernels-loader.md §2.4) and the checks of its binary.

    build/<variant>/
        __init__.py, ... every pyext file of torch-ext/<python_name>/ (recursively, no __pycache__)
        _ops.py                                    generated: binds torch.ops.<ops name>
        _<name>_<backend>_<id>.abi3.so
        metadata.json                              id, name, version, license, python-depends, backend, digest,
                                                   provenance
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from ..errors import BuildError
from ..variant import is_bytecode
from .config import BuildConfig

OPS_PY = '''\
import torch
from . import {ops}
ops = torch.ops.{ops}


def add_op_namespace_prefix(op_name: str):
    """Prefix op by namespace."""
    return f"{ops}::{{op_name}}"
'''


def python_files(cfg: BuildConfig) -> dict[str, Path]:
    """Relative path -> source of every pyext file of the Python package (the generated _ops.py excluded)."""
    suffixes = tuple("." + ext.lstrip(".") for ext in cfg.pyext)
    files = {}
    for p in sorted(cfg.python_dir.rglob("*")):
        rel = p.relative_to(cfg.python_dir)
        if is_bytecode(rel.as_posix()) or not p.is_file() or not p.name.endswith(suffixes):
            continue
        if rel.as_posix() == "_ops.py":
            continue  # generated per build
        files[rel.as_posix()] = p
    return files


def _replace_atomically(dst: Path, write) -> None:
    """Write through a temporary file and rename: a process that has the old .so mapped keeps a valid file."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()


def _install_file(src: Path, dst: Path) -> None:
    if dst.is_file() and not dst.is_symlink() and filecmp.cmp(src, dst, shallow=False):
        return
    if dst.is_symlink() or dst.is_dir():
        _remove(dst)
    _replace_atomically(dst, lambda tmp: shutil.copy2(src, tmp))


def _install_text(text: str, dst: Path) -> None:
    if dst.is_file() and not dst.is_symlink() and dst.read_text() == text:
        return
    if dst.is_symlink() or dst.is_dir():
        _remove(dst)
    _replace_atomically(dst, lambda tmp: tmp.write_text(text))


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink()


def remove_stale(variant_dir: Path, keep: set[str]) -> list[str]:
    """Delete every file (and __pycache__, empty folder) of variant_dir whose relative path is not in `keep`."""
    removed = []
    if not variant_dir.exists():
        return removed
    for root, dirs, files in os.walk(variant_dir, topdown=False):
        r = Path(root)
        for name in files + [d for d in dirs if (r / d).is_symlink()]:
            rel = (r / name).relative_to(variant_dir).as_posix()
            if rel not in keep or is_bytecode(rel):
                (r / name).unlink()
                removed.append(rel)
        for d in dirs:
            p = r / d
            if not p.is_symlink() and p.is_dir() and (is_bytecode(d) or not any(p.iterdir())):
                shutil.rmtree(p)
    return removed


def install_variant(
    cfg: BuildConfig, variant_dir: Path, ops_name: str, so_path: Path, metadata: dict
) -> tuple[Path, list[str]]:
    """Make variant_dir hold exactly the package files, _ops.py, the .so and metadata.json (digest added last)."""
    py = python_files(cfg)
    so_name = f"{ops_name}.abi3.so"
    keep = set(py) | {"_ops.py", so_name, "metadata.json"}
    for rel in (so_name, "metadata.json"):
        if rel in py:
            raise BuildError(f"torch-ext/{cfg.python_name}/{rel} collides with a generated file of the variant")
    variant_dir.mkdir(parents=True, exist_ok=True)
    removed = remove_stale(variant_dir, keep)
    for rel, src in py.items():
        _install_file(src, variant_dir / rel)
    _install_text(OPS_PY.format(ops=ops_name), variant_dir / "_ops.py")
    _install_file(so_path, variant_dir / so_name)

    from kernels import Metadata

    from ..digest import check_digest, compute_digest

    # The same hashing the loader checks against: every file but metadata.json(.sigstore) and bytecode.
    metadata = dict(metadata, digest=compute_digest(variant_dir))
    meta_path = variant_dir / "metadata.json"
    _install_text(json.dumps(metadata, indent=2) + "\n", meta_path)
    try:
        Metadata.read_from_file(str(meta_path))
        check_digest(variant_dir)
    except Exception as e:  # noqa: BLE001 - any failure here is a builder bug, report it as a build error
        raise BuildError(f"{meta_path}: the written metadata does not validate with kernels: {e}") from None
    return variant_dir / so_name, removed


# ---------------------------------------------------------------------------------------------------------------
# Checks of the built .so


@dataclass
class AbiReport:
    abi3: list[str] = field(default_factory=list)  # violations of the Python 3.9 limited API
    manylinux: list[str] = field(default_factory=list)  # symbols newer than manylinux_2_28 allows
    exported: list[str] = field(default_factory=list)  # defined dynamic symbols (should be PyInit_<ops> alone)
    unresolved: list[str] = field(default_factory=list)  # undefined and found in no linked library


def abi_check(so: Path, py_abi: str, manylinux: str) -> AbiReport:
    from ..variant import abi3_violations

    try:
        from kernel_abi_check import ObjectFile
    except ImportError:
        raise BuildError("kernel-abi-check is not installed: pip install kernel-abi-check==0.14.1") from None
    try:
        abi3 = abi3_violations(so, py_abi)
        ml = ObjectFile(str(so)).check_manylinux(manylinux)
    except ValueError as e:
        raise BuildError(f"{so}: kernel-abi-check failed: {e}") from None
    report = AbiReport(abi3=abi3)
    for v in ml:
        report.manylinux.append(f"{v.name}@{v.dep}_{v.version}")
    return report


def _nm(path: Path, *args: str) -> list[str]:
    nm = shutil.which("nm")
    if nm is None:
        return []
    r = subprocess.run([nm, "-D", *args, str(path)], capture_output=True, text=True)
    return r.stdout.splitlines() if r.returncode == 0 else []


@lru_cache(maxsize=16)
def _defined_symbols(lib: str, mtime: float) -> frozenset:
    return frozenset(line.split()[-1].split("@")[0] for line in _nm(Path(lib), "--defined-only") if line.split())


def symbol_check(so: Path, libs: list[Path], report: AbiReport, allow_prefixes: tuple[str, ...] = ()) -> None:
    """Fill `exported` and `unresolved`: an undefined, unversioned, non-weak symbol that no linked library defines
    (Python's C API excepted) fails the import later (e.g. a backend entry point that was never compiled)."""
    if shutil.which("nm") is None:
        return
    for line in _nm(so, "--defined-only"):
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDBRVWiu":
            report.exported.append(parts[2])
    available = set()
    for lib in libs:
        available |= _defined_symbols(str(lib), lib.stat().st_mtime)
    missing = []
    for line in _nm(so, "--undefined-only"):
        parts = line.split()
        if len(parts) != 2 or parts[0] != "U":
            continue  # weak references (w, v) may stay unresolved
        name = parts[1]
        if "@" in name or name.startswith(("Py", "_Py")) or name.startswith(allow_prefixes) or name in available:
            continue
        missing.append(name)
    if missing:
        demangled = subprocess.run(["c++filt"], input="\n".join(missing), capture_output=True, text=True)
        report.unresolved = demangled.stdout.split("\n")[: len(missing)] if demangled.returncode == 0 else missing
