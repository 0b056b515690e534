"""Where a kernel comes from: revision pinning and variant selection, delegated to `kernels` 0.17.2.

Selection is never re-implemented here: the variants of a Hub revision are listed with `kernels.variants.get_variants`
(the `build/` tree), local ones with `kernels.variants.get_variants_local`, and the choice and the per-variant
acceptance/rejection reasons come from `kernels.variants.resolve_variant` (the function behind `get_kernel`,
`get_kernel_variants` and `kernels info`). The only difference with `kernels` is that every Hub call goes through
the caller's `HfApi` (endpoint, token), and that a `version` is pinned to its commit once, here, for the whole load.
"""

from __future__ import annotations

import logging
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import safe_fs, untrusted
from .errors import KernelNotFoundError, OfflineError
from .variant import DEFAULT_VERSION, REPO_TYPE

logger = logging.getLogger(__name__)

_VERSION_BRANCH = re.compile(r"(?:refs/heads/)?v(\d+)")
MAX_REF_BYTES = 4096  # a cache ref file holds one commit id


def is_commit(revision: Optional[str]) -> bool:
    return untrusted.is_commit(revision)


def branch_version(revision: Optional[str]) -> Optional[int]:
    """N when `revision` names the version branch `v<N>` (`"v1"`, `"refs/heads/v1"`), else None."""
    m = _VERSION_BRANCH.fullmatch(revision) if isinstance(revision, str) else None
    return int(m.group(1)) if m else None


def expected_version(version: Optional[int], revision: Optional[str]) -> int:
    """The version a signed build must be signed for, however it was asked for: `version=N`; a branch `v<N>`
    (`revision="v1"` or `"refs/heads/v1"`); else, for a commit id or any other ref, the default version 1 (pass
    `version=` with `revision=` to expect another one)."""
    if version is not None:
        return version
    return branch_version(revision) if branch_version(revision) is not None else DEFAULT_VERSION


@dataclass(frozen=True)
class Pin:
    """A revision pinned to a commit.

    Attributes:
        repo_id: the repository.
        version: the requested major version (branch `v<N>`), or None.
        revision: the requested revision, or `v<N>` for a version.
        commit: the 40-hex commit every download of this load uses.
    """

    repo_id: str
    version: Optional[int]
    revision: str
    commit: str

    def describe(self) -> str:
        if self.revision == self.commit:
            return f"{self.repo_id}@{self.commit[:12]}"
        return f"{self.repo_id} {self.revision} (commit {self.commit[:12]})"


@dataclass(frozen=True)
class Selection:
    """The outcome of variant resolution: the chosen variant name (or None) and kernels' decisions for all."""

    variant: Optional[str]
    decisions: list  # kernels.variants.VariantAccepted | VariantRejected, most preferred first

    @property
    def rejected(self) -> list:
        """[(variant, reason)] for every rejected variant."""
        from kernels.variants import VariantRejected

        return [(d.variant.variant_str, d.reason) for d in self.decisions if isinstance(d, VariantRejected)]

    @property
    def accepted(self) -> list:
        from kernels.variants import VariantAccepted

        return [d.variant.variant_str for d in self.decisions if isinstance(d, VariantAccepted)]

    def trace(self) -> str:
        """kernels' own one-line-per-variant description (`variants_trace_str`)."""
        from kernels.variants import variants_trace_str

        return variants_trace_str(self.decisions) if self.decisions else "(no variants)"


def make_api(endpoint: Optional[str] = None, token=None):
    """The `HfApi` of a load: the caller's endpoint/token, else huggingface_hub's defaults (HF_ENDPOINT, HF_TOKEN)."""
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint, token=token, library_name="winattn", library_version=_winattn_version())


def _winattn_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("winattn")
    except PackageNotFoundError:
        return "0+unknown"


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


def system_description(backend: Optional[str] = None) -> str:
    """e.g. "backend cpu, torch 2.13, x86_64-linux" (what the variants were matched against)."""
    from kernels.backends import _select_backend

    try:
        import torch

        torch_version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    except ImportError:
        torch_version = "none"
    return f"backend {_select_backend(backend).variant_str}, torch {torch_version}, " \
           f"{platform.machine()}-{platform.system().lower()}"


def check_version_args(version, revision, *, both: bool = False):
    """ValueError unless exactly one of `version` (a non-negative int) and `revision` (a branch, tag or 40-hex
    commit: a git ref name, it becomes a path under the cache's `refs/`) is given. With `both`, the two may come
    together ("this revision, which must be that version"), but a `v<N>` branch must then be version N."""
    if version is not None and revision is not None and not both:
        raise ValueError("pass either version= or revision=, not both")
    if version is None and revision is None:
        raise ValueError("a kernel version (version=<major>) or a revision (revision=<branch/tag/commit>) is needed")
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
        raise ValueError(f"version must be a non-negative integer (branch v<N>), got {version!r}")
    if revision is not None and not untrusted.is_revision(revision):
        raise ValueError(f"revision must be a branch, tag or 40-hex commit id (a git ref name: no '..', no component "
                         f"starting with '.', no control character or space), got {untrusted.shown(repr(revision))}")
    if version is not None and branch_version(revision) not in (None, version):
        raise ValueError(f"revision {revision!r} is the branch of version {branch_version(revision)}, not version "
                         f"{version}")


def pin(api, repo_id: str, *, version: Optional[int], revision: Optional[str]) -> Pin:
    """Resolve `version` (branch `v<N>`, as kernels' `_versions`) or `revision` to a commit, online. Every commit the
    Hub answers with is checked to be a commit id before it is used (`RemoteValueError` otherwise).

    Raises:
        KernelNotFoundError: no such repository, version branch or revision (`winattn.hub_errors.network_step`).
        DownloadError: the Hub cannot be reached.
        RemoteValueError: the Hub answered with something that is not a commit id.
    """
    from .hub_errors import network_step

    check_version_args(version, revision)
    if version is None and is_commit(revision):
        return Pin(repo_id, None, revision, revision)
    asked = f"v{version}" if version is not None else revision
    source = f"the Hub at {api.endpoint} (refs of {repo_id})"
    with network_step(f"resolving {repo_id} {asked}", repo_id=repo_id, endpoint=api.endpoint):
        refs = api.list_repo_refs(repo_id, repo_type=REPO_TYPE)
        if version is not None:
            versions = {}
            for branch in refs.branches:
                m = re.fullmatch(r"v(\d+)", branch.name)
                if m:
                    versions[int(m.group(1))] = branch
            if version not in versions:
                available = ", ".join(f"v{v}" for v in sorted(versions)) or "none"
                raise KernelNotFoundError(
                    f"version {version} of '{repo_id}' not found (no branch v{version}); available versions: "
                    f"{available}"
                )
            newest = max(versions)
            if newest > version:
                logger.warning("You are using version %d of '%s', but version %d is available.", version, repo_id,
                               newest)
            commit = untrusted.commit_id(versions[version].target_commit, source=f"{source}, branch v{version}")
            return Pin(repo_id, version, f"v{version}", commit)
        for ref in list(refs.branches) + list(refs.tags):
            if revision in (ref.name, ref.ref):
                return Pin(repo_id, None, revision,
                           untrusted.commit_id(ref.target_commit, source=f"{source}, {untrusted.shown(ref.ref)}"))
        info = api.repo_info(repo_id, repo_type=REPO_TYPE, revision=revision)
    return Pin(repo_id, None, revision,
               untrusted.commit_id(info.sha, source=f"the Hub at {api.endpoint} (revision {revision} of {repo_id})"))


def pin_offline(repo_id: str, *, version: Optional[int], revision: Optional[str]) -> Pin:
    """Resolve from the cache only (`refs/` written by earlier downloads), as kernels' offline resolvers. The revision
    is checked before it becomes a path under `refs/`, the ref file is read without following a link, and what it
    holds must be a commit id (`RemoteValueError`: anyone who can write the cache writes these files)."""
    from kernels._versions import _get_available_versions_from_cache

    check_version_args(version, revision)
    if version is None and is_commit(revision):
        return Pin(repo_id, None, revision, revision)
    refs = repo_cache_folder(repo_id) / "refs"
    if version is not None:
        versions = _get_available_versions_from_cache(repo_id)
        if version not in versions:
            raise OfflineError(
                f"version {version} of '{repo_id}' is not in the local cache ({cache_dir()}) and the Hub is in "
                f"offline mode (HF_HUB_OFFLINE); load it once online, or pass revision=<commit>"
            )
        commit = untrusted.commit_id(versions[version].target_commit, source=f"the cache ref {refs / f'v{version}'}")
        return Pin(repo_id, version, f"v{version}", commit)
    ref_file = untrusted.contained(refs, refs / revision, source=f"revision= {revision!r}")
    try:
        commit = safe_fs.read_small(ref_file, MAX_REF_BYTES).decode("utf-8", "replace").strip()
    except OSError:
        raise OfflineError(
            f"revision '{revision}' of '{repo_id}' is not in the local cache ({cache_dir()}) and the Hub is in "
            f"offline mode (HF_HUB_OFFLINE)"
        ) from None
    return Pin(repo_id, None, revision, untrusted.commit_id(commit, source=f"the cache ref {ref_file}"))


def select(variant_names_or_variants, backend: Optional[str] = None) -> Selection:
    """kernels' variant resolution over a list of variants (or variant names)."""
    from kernels.variants import parse_variant, resolve_variant

    variants = []
    for v in variant_names_or_variants:
        if isinstance(v, str):
            try:
                v = parse_variant(v)
            except ValueError:
                continue
        variants.append(v)
    variant, decisions = resolve_variant(variants, backend)
    return Selection(variant.variant_str if variant is not None else None, list(decisions))


def select_hub(api, pin_: Pin, backend: Optional[str] = None) -> Selection:
    """List the `build/` variants of the pinned commit on the Hub and resolve them (kernels' rules)."""
    from huggingface_hub.errors import EntryNotFoundError
    from kernels.variants import get_variants

    try:
        variants = get_variants(api, repo_id=pin_.repo_id, revision=pin_.commit)
    except EntryNotFoundError:
        variants = []
    return select(variants, backend)


def select_local(build_dir: Path, backend: Optional[str] = None) -> Selection:
    """Resolve the variant directories of a local `build/` (or vendored) directory (kernels' rules)."""
    from kernels.variants import get_variants_local

    return select(get_variants_local(Path(build_dir)), backend)


def not_found_message(what: str, selection: Selection, backend: Optional[str] = None) -> str:
    return (
        f"no variant of {what} fits this machine ({system_description(backend)}):\n"
        f"{selection.trace()}"
    )
