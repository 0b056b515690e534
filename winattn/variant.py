"""What a kernel variant is, in one place: its names, the files it is made of, its digest and its ABI.

Everything that builds, publishes, vendors, verifies or loads a variant asks this module, so a rule has one home:

- names: the Hub repository and its type, `metadata.json`, `metadata.json.sigstore`, the vendor lock;
- the bytecode rule: `__pycache__/` and `*.pyc` are never part of a variant (kernels' digest skips them, uploads and
  downloads leave them out, the verifier refuses or purges them);
- listing: which directories of a build dir are variants (`list_variants`) and which files a variant consists of
  (`variant_files`);
- the digest: `compute_digest` writes what `check_digest` checks. Checking is the loader's streaming hasher
  (`winattn.verify`: no link followed, every file read once in 1 MiB chunks) for every caller, so the publisher, the
  signer and the vendor refuse exactly what a load would refuse;
- the abi3 rule: shared objects use only the Python 3.9 stable ABI (`abi3_violations`).

It imports nothing heavy at import time (kernels, kernel-abi-check are imported inside the functions).
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


class DigestMismatch(ValueError):
    """A variant's files do not match its metadata.json `digest`; `violations` names each file."""

    def __init__(self, message: str, violations: list):
        super().__init__(message)
        self.violations = violations


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


def compute_digest(variant_dir: Path) -> dict:
    """`{"algorithm": "sha256", "files": {rel: base64 sha256}}` of every file but metadata.json, its signature and
    bytecode: kernels' own hashing (`Digest.hash_variant`), so `kernels` and winattn agree on what a build is."""
    from ._kernels_private import Digest, DigestAlgorithm

    digest = Digest.hash_variant(DigestAlgorithm.SHA256, str(variant_dir))
    return {"algorithm": "sha256", "files": dict(sorted(digest.files.items()))}


def check_digest(variant_dir: Path, *, follow_file_links: bool = True) -> None:
    """Check the variant's files against metadata.json's `digest`, the way a load checks them.

    `follow_file_links` (default, for the publisher's and signer's own files, e.g. an HF-cache-like copy whose files
    are links into blobs/) reads a link to a regular file as that file, as kernels' hashing does; loads never do.

    Raises:
        DigestMismatch (a ValueError): metadata.json is missing or invalid, has no digest, the variant holds entries
            the digest cannot cover (links, FIFOs, stray bytecode is ignored), or a file is missing, extra or
            different; the message starts with "digest mismatch: " and names every file.
    """
    from .verify import digest_violations

    violations = digest_violations(Path(variant_dir), follow_file_links=follow_file_links)
    if violations:
        raise DigestMismatch("digest mismatch: " + "; ".join(violations), violations)


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
