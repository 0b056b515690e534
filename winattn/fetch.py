"""Install a located variant (`winattn.sources.Candidate`) as a `LocalVariant` and verify it once, before anything of
it is imported.

`install` puts a Hub variant into the cache (downloaded through `winattn.download`, under a per-variant file lock
that concurrent processes share, `variant_lock`); vendored and cached variants are already where they are.

Every file is copied into a private directory while it is hashed (`winattn.importer.private_copy_dir`): the copy is
what `winattn.load` imports. A cached Hub copy that fails for a reason a download can fix (changed bytes) is
downloaded once more; a wrong key, a signature binding that does not hold, or an unsigned build under
`require_signature` never cost a download (the publication itself is so). Offline, the publisher is trusted only by
this call's opt-in or by the verdict an earlier online verification of this same cache entry recorded.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import cache_layout, safe_fs, sources, untrusted
from .errors import UntrustedKernelError, VerificationError
from .trust import TrustKind, recorded_kind
from .variant import METADATA_FILENAME

logger = logging.getLogger("winattn")

# A re-fetch heals a cache whose bytes changed (files, digest, metadata, lock).
_REPAIRABLE = {"files", "digest", "metadata", "lock"}


@dataclass(frozen=True)
class LocalVariant:
    """A located variant's directory on disk (downloaded into the cache, cached, or vendored), not verified yet, with
    what its verification must hold it to (its source's `winattn.sources.Terms`, for this variant).

    Attributes:
        path: the variant's directory.
        lock_entry: the vendor lock's entry for it (vendored only).
        origin: what a successful verification records in the receipt.
        expect: what the signed statement must name.
    """

    path: Path
    lock_entry: Optional[dict]
    origin: Optional[dict]
    expect: dict


def _verify_copy(local: LocalVariant, keys, require_signature):
    """`verify_variant` with a private copy made while hashing; the copy is discarded unless verification passed."""
    from .importer import discard, private_copy_dir
    from .verify import verify_variant

    copy = private_copy_dir(local.path.name)
    try:
        report = verify_variant(local.path, bytecode="purge", copy_to=copy, public_keys=keys,
                                require_signature=require_signature, lock_entry=local.lock_entry, origin=local.origin,
                                expect=local.expect)
    except BaseException:
        discard(copy)
        raise
    if not report.ok or report.copy_path is None:
        discard(copy)
    return report


def _repairable(report) -> bool:
    """A failure a fresh download can fix: changed bytes, or a signature that no longer matches its bytes."""
    for check in report.failures:
        if check.name in _REPAIRABLE:
            return True
        if check.name == "signature" and "bad signature" in check.detail:
            return True
    return False


def install_verified(candidate: "sources.Candidate", keys, require_signature):
    """Install and verify `candidate` once, under its variant lock; a cached Hub copy that fails repairably is
    downloaded once more (a corrupted cache heals, a bad publication does not). Returns (the `LocalVariant`, the
    report). Raises `VerificationError`."""
    with variant_lock(candidate):
        cached = (_variant_dir(candidate) / METADATA_FILENAME).is_file()
        local = install(candidate)
        report = _verify_copy(local, keys, require_signature)
        if not report.ok and cached and _remote(candidate) is not None and _repairable(report):
            logger.warning(
                "cached copy of %s (%s) failed verification (%s); downloading it again",
                candidate.variant, candidate.what, "; ".join(f"{c.name}: {c.detail}" for c in report.failures),
            )
            local = install(candidate, force=True)
            report = _verify_copy(local, keys, require_signature)
    if not report.ok:
        raise verification_error(candidate.label, report)
    remote = _remote(candidate)
    if remote is not None and candidate.revision != candidate.commit:
        _write_ref(remote.pin)  # offline loads resolve the revision to the commit verified here
    return local, report


def variant_lock(candidate: "sources.Candidate"):
    """A per-variant file lock around install + verify (concurrent processes share one download)."""
    if candidate.source == "vendored" or candidate.commit is None:
        return contextlib.nullcontext()
    return _variant_lock(candidate.repo_id, candidate.commit, candidate.variant)


def install(candidate: "sources.Candidate", *, force: bool = False) -> LocalVariant:
    """The candidate's directory on disk: a Hub variant not in the cache yet is downloaded there first. `force` (Hub
    variants only) removes the cached copy and downloads it again: a corrupted cache heals."""
    path = _variant_dir(candidate)
    remote = _remote(candidate)
    if remote is not None:
        if force:
            _remove_snapshot_variant(path)  # snapshot links only; blobs are re-fetched by force
        if force or not (path / METADATA_FILENAME).is_file():
            path = _download(remote.api, remote.pin, candidate.variant, force=force)
    terms = candidate.terms
    return LocalVariant(path, terms.lock_entry(candidate.variant), terms.origin, terms.expect)


def _remote(candidate: "sources.Candidate") -> "Optional[sources.Remote]":
    return candidate.files if isinstance(candidate.files, sources.Remote) else None


def _variant_dir(candidate: "sources.Candidate") -> Path:
    """Where the variant's files are: in the cache for a Hub variant (once installed), else in its source's
    directory."""
    if _remote(candidate) is not None:
        return cache_layout.cache_variant_dir(candidate.repo_id, candidate.commit, candidate.variant)
    return Path(candidate.files) / candidate.variant


def trust_reason(candidate: "sources.Candidate", report) -> str:
    """Why the publisher is trusted. Offline without an opt-in: only because an earlier online verification of
    this same cache entry found a trusted publisher (the receipt's origin); an earlier opt-in is never remembered."""
    if candidate.trust is not None:
        return candidate.trust.reason
    earlier = report.origin or {}
    if earlier.get("repo_id") != candidate.repo_id or earlier.get("commit") != candidate.commit \
            or recorded_kind(earlier.get("trust")) is not TrustKind.PUBLISHER:
        from .importer import discard

        discard(report.copy_path)
        raise UntrustedKernelError(
            f"Kernel repository '{candidate.repo_id}' ({candidate.what}): publisher "
            "trust cannot be checked in offline mode (HF_HUB_OFFLINE) and no online winattn.load of this cache entry "
            "found it to come from a trusted publisher (an earlier trust_remote_code / allowlist opt-in is not "
            f"remembered). Load it online from a trusted publisher, or pass trust_remote_code=True / an allowlist "
            f"containing '{candidate.repo_id}'."
        )
    logger.warning(
        "Skipping publisher trust check for '%s' because Hugging Face Hub is in offline mode: the cached "
        "variant %s was verified online before and its publisher was trusted (%s).",
        candidate.repo_id, candidate.variant, earlier["trust"],
    )
    return f"offline: {earlier['trust']}"


def verification_error(what: str, report) -> VerificationError:
    failures = "\n".join(f"  {c.line()}" for c in report.failures)
    return VerificationError(
        f"refusing to import {what}: verification failed (nothing was imported):\n{failures}", checks=report.checks
    )


# ----------------------------------------------------------------------------------------------------------------------
# The Hub cache


def _variant_lock(repo_id: str, commit: str, variant: str):
    """A file lock in the cache's `.locks/`, named after a checked commit and variant, created without following a
    link (a link planted there would otherwise be created or touched through)."""
    from filelock import FileLock

    folder = cache_layout.repo_cache_folder(repo_id)
    locks = Path(cache_layout.cache_dir()) / ".locks" / folder.name
    name = f"winattn-{untrusted.commit_id(commit, source='the pinned commit')}-" \
           f"{untrusted.name(variant, source='the variant name')}.lock"
    lock_path = locks / name
    try:
        locks.mkdir(parents=True, exist_ok=True)
        untrusted.contained(cache_layout.cache_dir(), locks, source="the cache's lock directory")
        safe_fs.touch_lock(lock_path)
    except (OSError, VerificationError) as e:  # read-only cache (offline use), or a link out: nothing written there
        logger.debug("no lock for %s: %s", lock_path, e)
        return contextlib.nullcontext()
    return FileLock(str(lock_path))


def _download(api, pin, variant: str, *, force: bool) -> Path:
    """Download the variant into the cache: listed, checked and guarded (`winattn.download`)."""
    from .download import download

    snapshot = download(api, pin, [variant], cache_dir=cache_layout.cache_dir(), force=force)
    return snapshot / "build" / variant


def _remove_snapshot_variant(variant_dir: Path) -> None:
    """Remove a cached variant directory without following anything in it (links, FIFOs and all), iteratively."""
    try:
        safe_fs.remove_tree(variant_dir)
    except OSError as e:
        logger.warning("cannot remove %s before downloading it again: %s", variant_dir, e)


def _write_ref(pin) -> None:
    """Record `refs/<revision>` -> commit in the cache (what `hf_hub_download(revision=<branch>)` writes), so that an
    offline load (kernels' or ours) can resolve `version=N` to the commit verified here. Written atomically, through a
    fresh temporary file, never through a link (`safe_fs.write_atomic`), and only under `refs/`."""
    refs = cache_layout.repo_cache_folder(pin.repo_id) / "refs"
    ref = refs / untrusted.ref_name(pin.revision, source="the revision")
    try:
        ref.parent.mkdir(parents=True, exist_ok=True)
        # the directory written into must resolve under refs/; the ref itself is replaced, a link there included
        untrusted.contained(refs, ref.parent, source=f"the ref {pin.revision}")
        safe_fs.write_atomic(ref, untrusted.commit_id(pin.commit, source="the pinned commit").encode())
    except (OSError, VerificationError) as e:
        logger.debug("cannot write %s: %s", ref, e)
