"""Where things live on disk: the Hugging Face cache kernels downloads into (repository folders, snapshots, blobs),
and winattn's own cache (`$WINATTN_CACHE`: receipts of directories outside the HF cache, private import copies).

Every path of those shapes is spelled here, so that the loader, the verifier and the receipts agree on them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from .variant import REPO_TYPE


def cache_dir() -> str:
    """The cache kernels downloads into: `KERNELS_CACHE`, else `HF_HUB_CACHE` (read now, not at import)."""
    from huggingface_hub import constants

    return os.environ.get("KERNELS_CACHE") or constants.HF_HUB_CACHE


def repo_cache_folder(repo_id: str) -> Path:
    from huggingface_hub.file_download import repo_folder_name

    return Path(cache_dir()) / repo_folder_name(repo_id=repo_id, repo_type=REPO_TYPE)


def cache_build_dir(repo_id: str, commit: str) -> Path:
    """`<repo cache>/snapshots/<commit>/build`: where `snapshot_download` puts a commit's variants (the one place
    that spells it)."""
    return repo_cache_folder(repo_id) / "snapshots" / commit / "build"


def cache_variant_dir(repo_id: str, commit: str, variant: str) -> Path:
    return cache_build_dir(repo_id, commit) / variant


def parse_cache_variant_dir(variant_path) -> Optional[tuple]:
    """(repo cache folder, commit) when `variant_path` is a cache snapshot's `build/<variant>` (`cache_build_dir`'s
    shape, in any cache), else None."""
    p = Path(os.path.abspath(variant_path))
    parents = p.parents
    if len(parents) >= 4 and parents[0].name == "build" and parents[2].name == "snapshots":
        return parents[3], parents[1].name
    return None


def blobs_dir(variant_path: Path) -> Optional[str]:
    """`<repo cache>/blobs` when `variant_path` is an HF cache snapshot's `build/<variant>`, else None."""
    snapshot = parse_cache_variant_dir(variant_path)
    return os.path.realpath(snapshot[0] / "blobs") if snapshot is not None else None


def winattn_cache_dir() -> Path:
    """winattn's own cache: `$WINATTN_CACHE`, else `$XDG_CACHE_HOME/winattn` (default `~/.cache/winattn`)."""
    if os.environ.get("WINATTN_CACHE"):
        return Path(os.environ["WINATTN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "winattn"
