"""Download variants from a Hub that may lie: list them, check the listing, then fetch exactly what was listed.

The loader (`winattn.sources`, into the Hugging Face cache) and `winattn vendor` (into a staging directory) both
download here, with the real `huggingface_hub.snapshot_download`, at a commit already checked to be a commit id:

1. list `build/<variant>/` at that commit; every file name must be a relative path inside the variant and every
   size a non-negative integer (`winattn.untrusted`), and the variant must fit `WINATTN_MAX_VARIANT_BYTES` (checked
   before a byte is downloaded);
2. download only the listed names (as exact patterns: a name a second listing adds is not fetched), under
   `winattn.hub_guard.guarded`, which holds every header and body of the Hub to the commit and the listed sizes;
3. check that the directory huggingface_hub returns lies under the cache or staging root it was given.

Nothing here verifies a digest or a signature: `winattn.verify` does, on what was downloaded.
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Optional

from . import untrusted
from .errors import KernelNotFoundError, VerificationError
from .hub_errors import network_step
from .variant import BYTECODE_IGNORE_PATTERNS, REPO_TYPE, is_bytecode

MAX_FILES = 10_000  # files of one variant (a build has tens)


def list_variant(api, pin, variant: str) -> dict:
    """{path in the repository: size} of `build/<variant>/` at the pinned commit, bytecode left out, every name and
    size checked (`RemoteValueError`), the total within the variant size limit (`VerificationError`)."""
    from huggingface_hub.hf_api import RepoFile

    from .file_reader import max_variant_bytes

    untrusted.name(variant, source=f"the variant listing of {pin.describe()}")
    where = f"build/{variant}"
    source = f"the Hub's file listing of {pin.describe()}, {where}/"
    limit = max_variant_bytes()
    files = {}
    entries = api.list_repo_tree(pin.repo_id, path_in_repo=where, recursive=True, revision=pin.commit,
                                 repo_type=REPO_TYPE)
    for entry in entries:
        if not isinstance(entry, RepoFile):
            continue
        path = untrusted.repo_path(entry.path, source=source, under=where)
        if is_bytecode(path):
            continue
        files[path] = untrusted.size(entry.size, source=f"{source} (size of {untrusted.shown(path)})", limit=limit)
        if len(files) > MAX_FILES:
            raise VerificationError(f"{pin.describe()}: variant {variant} lists more than {MAX_FILES} files; refused "
                                    "before downloading any", checks=[("files", False, f"more than {MAX_FILES} files")])
    total = sum(files.values())
    if total > limit:
        raise VerificationError(
            f"{pin.describe()}: variant {variant} lists {total} bytes of files, more than the limit of {limit} "
            "(WINATTN_MAX_VARIANT_BYTES); refused before downloading any",
            checks=[("digest", False, f"{total} bytes listed, limit {limit}")])
    return files


def download(api, pin, variants: list, *, cache_dir: Optional[str] = None, local_dir: Optional[Path] = None,
             force: bool = False) -> Path:
    """Download `build/<variant>/` of each of `variants` at `pin.commit` into the HF cache (`cache_dir`) or a plain
    directory (`local_dir`); returns the snapshot directory (the one holding `build/`).

    Raises:
        RemoteValueError: the Hub lied (a name, size, commit, ETag, redirect or body: see `winattn.hub_guard`).
        VerificationError: the listing is over the size or file-count limit.
        KernelNotFoundError / DownloadError: the Hub said no or failed (`winattn.hub_errors.network_step`).
    """
    from huggingface_hub import hf_hub_url

    from .hub_guard import guarded

    what = f"downloading {', '.join(variants)} of {pin.describe()}"
    with network_step(what, repo_id=pin.repo_id, endpoint=api.endpoint):
        files = {}
        for variant in variants:
            listed = list_variant(api, pin, variant)
            if not listed:
                raise KernelNotFoundError(f"variant {variant} of {pin.describe()} has no files")
            files.update(listed)
        sizes = {hf_hub_url(pin.repo_id, path, repo_type=REPO_TYPE, revision=pin.commit, endpoint=api.endpoint): n
                 for path, n in files.items()}
        with guarded(api.endpoint, commit=pin.commit, sizes=sizes):
            snapshot = api.snapshot_download(
                pin.repo_id,
                repo_type=REPO_TYPE,
                revision=pin.commit,
                allow_patterns=[glob.escape(path) for path in files],
                ignore_patterns=BYTECODE_IGNORE_PATTERNS,
                cache_dir=cache_dir,
                local_dir=local_dir,
                force_download=force,
            )
    root = local_dir if local_dir is not None else cache_dir
    if root is None:
        return Path(snapshot)
    return untrusted.contained(root, snapshot, source=f"huggingface_hub's download of {pin.describe()}")
