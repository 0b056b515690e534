"""What a kernel variant is, in one place: its names, the files it is made of and its ABI.

Everything that builds, publishes, vendors, verifies or loads a variant asks this module, so a rule has one home:

- names: the Hub repository and its type, `metadata.json`, `metadata.json.sigstore`, the vendor lock;
- the bytecode rule: `__pycache__/` and `*.pyc` are never part of a variant (kernels' digest skips them, uploads and
  downloads leave them out, the verifier refuses or purges them);
- listing: which directories of a build dir are variants (`list_variants`) and which files a variant consists of
  (`variant_files`);
- the digest lives in `winattn.digest` (`compute_digest` writes what `check_digest` checks), which reads files through
  `winattn.file_reader`; both import this module, never the other way round;
- the abi3 rule: shared objects use only the Python 3.9 stable ABI (`abi3_violations`).

It imports nothing of winattn, and nothing heavy at import time (kernels, kernel-abi-check are imported inside
the functions).
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_REPO = "winattn/window-attention"
DEFAULT_VERSION = 1
REPO_TYPE = "kernel"
METADATA_FILENAME = "metadata.json"
SIGNATURE_FILENAME = "metadata.json.sigstore"  # the name kernels' digest skips, and kernels.verify reads
LOCK_FILENAME = "window-attention.lock"
ABI3_TARGET = "3.9"  # the stable ABI of torch's stable-ABI variants (kernel-builder.md §6)
# The kernel package API (`window_attention.API_VERSION`, torch-ext/window_attention/__init__.py) this winattn speaks:
# the integrations call only names of the kernel's `__all__`, and a fetched kernel of another API version is refused.
KERNEL_API_VERSION = 1
# Bytecode as glob patterns for `snapshot_download(ignore_patterns=...)`, the same patterns kernels' resolver uses.
BYTECODE_IGNORE_PATTERNS = ["*.pyc", "**/__pycache__/**"]


def is_bytecode(rel: str) -> bool:
    """Is the POSIX relative path `rel` bytecode (a `*.pyc`, or anything under a `__pycache__/`)?"""
    return rel.endswith(".pyc") or "__pycache__" in rel.split("/")


def is_variant_name(name: str) -> bool:
    """Does `name` parse as a kernels variant (`torch…`, `tvm-ffi…`)? kernels' own parser decides."""
    from kernels.variants import parse_variant

    try:
        parse_variant(name)
    except ValueError:
        return False
    return True


def list_variants(build_dir: Path) -> list:
    """The variant directories of `build_dir`, sorted; other directories and files are ignored."""
    build_dir = Path(build_dir)
    if not build_dir.is_dir():
        return []
    return [p for p in sorted(build_dir.iterdir()) if p.is_dir() and not p.is_symlink() and is_variant_name(p.name)]


def variant_files(variant_dir: Path) -> list:
    """Files of a variant, relative to it (sorted `Path`s): everything but bytecode and directories."""
    variant_dir = Path(variant_dir)
    out = []
    for path in sorted(variant_dir.rglob("*")):
        rel = path.relative_to(variant_dir)
        if is_bytecode(rel.as_posix()) or path.is_dir():
            continue
        out.append(rel)
    return out


def abi3_violations(so_path: Path, target: str = ABI3_TARGET) -> list:
    """One line per symbol of the shared object outside the Python `target` stable ABI ([] when clean).

    Raises:
        ImportError: kernel-abi-check is not installed.
        ValueError: the file cannot be read as a shared object.
    """
    import kernel_abi_check

    violations = kernel_abi_check.ObjectFile(str(so_path)).check_python_abi(target)
    lines = []
    for v in violations:
        added = getattr(v, "version_added", None)
        name = getattr(v, "name", v)
        lines.append(f"{name} (added in Python {added})" if added else f"{name} (not in the limited API)")
    return lines
