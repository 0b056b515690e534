"""`winattn.load`: resolve, trust, download one variant, verify it, and only then import it.

Order of a Hub load (each step raises a typed error naming the repository, the revision and the cause):

1. trust      `winattn.trust.check_trust` (kernels' policy: Hub `trustedKernelPublisher`, `trust_remote_code=True`,
              or an allowlist of repository ids) -> `UntrustedKernelError`, before anything is downloaded.
2. pin        `version=N` (branch `v<N>`) or `revision=` is pinned to one commit (`list_repo_refs`); every later
              request of this load uses that commit, so a branch moved mid-load cannot mix two builds.
3. select     kernels' variant resolution on the commit's `build/` listing; none fits -> `KernelNotFoundError`
              listing every variant and why it was rejected (or the reference with `fallback="reference"`).
4. download   only `build/<variant>/*` at the pinned commit (`snapshot_download`), under a per-variant file lock so
              concurrent processes share one download -> `DownloadError` when the Hub fails mid-way.
5. verify     `winattn.verify.verify_variant` (files, signature and what it is signed for, metadata, digest,
              kernels-minver, arch, python-depends) -> `VerificationError` with every check; nothing has been
              imported at that point. Every file is copied into a private directory while it is hashed
              (`winattn.importer.private_copy_dir`). A cached copy that fails is downloaded once more (a corrupted
              cache heals, a bad publication does not).
6. import     the private copy's own `__init__.py`, source only (`winattn.importer.import_package`): what is
              imported is what was hashed, whatever happens to the cache meanwhile.
7. smoke test a tiny `attention` call on the variant's device against the kernel's own `reference`
              -> `VerificationError` on mismatch. After any failed import or smoke test, `<id>` and `<id>.*` leave
              `sys.modules`, and that op namespace is not loaded again in the process (`StaleKernelError`).

`HF_HUB_OFFLINE=1`: the revision comes from the cache's refs, nothing touches the network, and the publisher check is
skipped (with a warning) only for cache entries that an earlier online load verified AND found to come from a
trusted publisher (their receipt). An earlier opt-in (`trust_remote_code`, an allowlist) is never remembered: offline,
the caller must opt in again. `vendored=DIR`: a `winattn vendor` directory, checked against its lock file, with zero
network access.

The returned module carries `__winattn_info__` (a `LoadInfo`: repo, version, commit, variant, source, checks) and the
same is logged at INFO level.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

from .errors import (
    DownloadError,
    KernelNotFoundError,
    OfflineError,
    StaleKernelError,
    UntrustedKernelError,
    VerificationError,
    WinattnError,
)

logger = logging.getLogger("winattn")

DEFAULT_REPO = "winattn/window-attention"
DEFAULT_VERSION = 1
LOCK_FILENAME = "window-attention.lock"

_IMPORT_LOCK = threading.RLock()
_BYTECODE_IGNORE_PATTERNS = ["*.pyc", "**/__pycache__/**"]  # as kernels.resolver


@dataclass(frozen=True)
class LoadInfo:
    """What `winattn.load` loaded and why it trusted it (`module.__winattn_info__`).

    Attributes:
        repo_id: repository id.
        version: requested major version, or None.
        revision: requested revision (`v<N>` for a version).
        commit: commit the variant was downloaded from (from the lock for vendored loads), None for the reference.
        variant: variant name, e.g. `torch-stable-abi210-cpu-x86_64-linux`; None for the reference.
        variant_path: the verified directory (cache snapshot, vendored or local variant).
        source: "hub" (downloaded or cached), "offline-cache", "vendored" or "reference".
        trust: why the publisher was trusted.
        checks: the verification checks (`winattn.verify.Check`), then the smoke test.
        rejected: [(variant, reason)] for every variant kernels rejected on this machine.
        receipt_hit: the digest check reused an unchanged verified-receipt.
        reused_from: the path of an identical build already imported in this process, when that module was reused.
        signer: the public key that verified the signature, if any.
        digest_files: metadata.json's digest of the imported variant (relative path -> base64 sha256).
        import_path: the private copy of `variant_path` that was hashed and imported (None when reused).
        statement: what the verified signature vouches for (repo_id, version, variant), if signed and checked.
    """

    repo_id: str
    version: Optional[int]
    revision: Optional[str]
    commit: Optional[str]
    variant: Optional[str]
    variant_path: Optional[str]
    source: str
    trust: Optional[str] = None
    checks: tuple = ()
    rejected: tuple = ()
    receipt_hit: bool = False
    reused_from: Optional[str] = None
    signer: Optional[str] = None
    digest_files: Optional[dict] = field(default=None, repr=False, compare=False)
    import_path: Optional[str] = None
    statement: Optional[dict] = field(default=None, repr=False, compare=False)

    def check(self, name: str):
        """The check called `name` (e.g. "signature", "digest", "smoke-test"), or None."""
        return next((c for c in self.checks if c.name == name), None)

    def describe(self) -> str:
        where = f"{self.repo_id} {self.revision or ''}".strip()
        if self.commit:
            where += f" @ {self.commit[:12]}"
        checks = ", ".join(f"{c.name} {c.status}" for c in self.checks)
        return f"{where}: variant {self.variant} from {self.source} ({self.variant_path}); checks: {checks}"


# ----------------------------------------------------------------------------------------------------------------------


def load(
    repo_id: str = DEFAULT_REPO,
    *,
    version: Optional[int] = None,
    revision: Optional[str] = None,
    trust_remote_code: Union[bool, Sequence[str]] = False,
    public_keys: Optional[Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]] = None,
    require_signature: bool = False,
    fallback: Optional[str] = None,
    vendored: Optional[Union[str, os.PathLike]] = None,
    endpoint: Optional[str] = None,
    token: Optional[str] = None,
    backend: Optional[str] = None,
):
    """Load the window-attention kernel for this machine, verified before it is imported.

    Args:
        repo_id: Hub repository ("<org>/<name>", repo type `kernel`).
        version: major version = branch `v<N>` (default 1 when no `revision` is given).
        revision: branch, tag or 40-hex commit instead of `version`.
        trust_remote_code: True (any publisher), False (only Hub trusted publishers), or a list of repository ids
            allowed in addition to trusted publishers.
        public_keys: trusted public key file(s); a variant's signature, when present, must verify with one of them.
        require_signature: refuse unsigned variants (needs `public_keys`).
        fallback: "reference" returns the pure-PyTorch reference when no variant fits this machine (never when
            verification fails) instead of raising `KernelNotFoundError`.
        vendored: a `winattn vendor` directory to load from with zero network access.
        endpoint / token: the Hub to use (default: HF_ENDPOINT / HF_TOKEN).
        backend: kernels' `backend=` ("cpu" or the backend torch was built for; default: detected).

    Returns:
        The kernel module (`attention`, `window_attention`, `reference`), with `__winattn_info__`.

    Raises:
        UntrustedKernelError, KernelNotFoundError, DownloadError, OfflineError, VerificationError,
        StaleKernelError (a build of this op namespace failed to load earlier in the process).
    """
    if fallback not in (None, "reference"):
        raise ValueError(f"fallback must be None or 'reference', got {fallback!r}")
    if version is not None and revision is not None:
        raise ValueError("pass either version= or revision=, not both")
    requested_version = version  # a vendored lock is only held to an explicitly requested version
    if version is None and revision is None:
        version = DEFAULT_VERSION
    from .trust import normalize as normalize_trust

    normalize_trust(trust_remote_code)  # TypeError for a wrong type before any lookup
    keys = _normalize_keys(public_keys)
    if require_signature and not keys:
        raise ValueError("require_signature=True needs public_keys=[...] (the keys signatures must verify with)")

    from huggingface_hub import constants

    try:
        if vendored is not None:
            return _load_vendored(Path(vendored), repo_id, requested_version, revision, keys, require_signature,
                                  backend)
        if constants.is_offline_mode():
            return _load_offline(repo_id, version, revision, trust_remote_code, keys, require_signature, backend)
        return _load_hub(repo_id, version, revision, trust_remote_code, keys, require_signature, backend,
                         endpoint, token)
    except _NoVariant as e:
        if fallback != "reference":
            raise KernelNotFoundError(e.message) from None
        logger.warning("%s\nUsing the pure-PyTorch reference implementation (fallback='reference').", e.message)
        return _reference_module(e)


def _normalize_keys(public_keys) -> list:
    if public_keys is None:
        return []
    if isinstance(public_keys, (str, os.PathLike)):
        public_keys = [public_keys]
    keys = [Path(k) for k in public_keys]
    for k in keys:
        if not k.is_file():
            raise FileNotFoundError(f"public key {k} does not exist")
    return keys


class _NoVariant(Exception):
    def __init__(self, message, repo_id, version, revision, commit, selection):
        super().__init__(message)
        self.message = message
        self.repo_id, self.version, self.revision, self.commit = repo_id, version, revision, commit
        self.selection = selection


def _reference_module(e: _NoVariant):
    from .reference_kernel import load_reference

    module = load_reference()
    module.__winattn_info__ = LoadInfo(
        repo_id=e.repo_id, version=e.version, revision=e.revision, commit=e.commit, variant=None,
        variant_path=None, source="reference", rejected=tuple(e.selection.rejected),
    )
    return module


def _network_step(what: str):
    """Turn a transport/HTTP failure during `what` into a DownloadError naming it."""

    @contextlib.contextmanager
    def step():
        try:
            import httpx2 as httpx
        except ImportError:  # huggingface_hub < 2
            import httpx

        try:
            yield
        except WinattnError:
            raise
        except (OSError, httpx.HTTPError) as e:
            from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

            if isinstance(e, (RepositoryNotFoundError, RevisionNotFoundError)):
                raise KernelNotFoundError(f"{what}: {e}") from e
            raise DownloadError(f"{what} failed: {type(e).__name__}: {e}. Nothing was imported; retry.") from e

    return step()


# ----------------------------------------------------------------------------------------------------------------------
# Hub


def _load_hub(repo_id, version, revision, trust_remote_code, keys, require_signature, backend, endpoint, token):
    from . import resolve
    from .trust import check_trust

    api = resolve.make_api(endpoint, token)
    requested = f"v{version}" if version is not None else revision
    with _network_step(f"checking publisher trust of '{repo_id}'"):
        try:
            trust = check_trust(repo_id, trust_remote_code, api=api)
        except UntrustedKernelError as e:
            raise UntrustedKernelError(f"{e} (refused {repo_id} {requested} before downloading anything)") from None
    with _network_step(f"resolving {repo_id} {requested}"):
        pin = resolve.pin(api, repo_id, version=version, revision=revision)
    with _network_step(f"listing the variants of {pin.describe()}"):
        selection = resolve.select_hub(api, pin, backend)
    if selection.variant is None:
        raise _NoVariant(resolve.not_found_message(pin.describe(), selection, backend), repo_id, version,
                         pin.revision, pin.commit, selection)
    # Only a publisher verdict is recorded for offline loads; an opt-in is the caller's, for this call only.
    origin = {"repo_id": repo_id, "commit": pin.commit, "trust": trust.reason} if _publisher_verdict(trust.reason) \
        else None
    variant_dir, report = _fetch_and_verify(api, pin, selection.variant, keys, require_signature, origin,
                                            {"repo_id": repo_id, "version": version})
    return _import_verified(variant_dir, report, LoadInfo(
        repo_id=repo_id, version=version, revision=pin.revision, commit=pin.commit, variant=selection.variant,
        variant_path=str(variant_dir), source="hub", trust=trust.reason, rejected=tuple(selection.rejected),
    ))


def _snapshot_variant_dir(repo_id: str, commit: str, variant: str) -> Path:
    from .resolve import repo_cache_folder

    return repo_cache_folder(repo_id) / "snapshots" / commit / "build" / variant


def _variant_lock(repo_id: str, commit: str, variant: str):
    from filelock import FileLock

    from .resolve import cache_dir, repo_cache_folder

    folder = repo_cache_folder(repo_id)
    lock_path = Path(cache_dir()) / ".locks" / folder.name / f"winattn-{commit}-{variant}.lock"
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock_path.touch(exist_ok=True)
    except OSError as e:  # read-only cache (offline use): nothing will be written, so nothing to serialize
        logger.debug("no lock for %s: %s", lock_path, e)
        return contextlib.nullcontext()
    return FileLock(str(lock_path))


def _download(api, pin, variant: str, *, force: bool) -> Path:
    from .resolve import cache_dir

    what = f"downloading variant {variant} of {pin.describe()}"
    with _network_step(what):
        snapshot = api.snapshot_download(
            pin.repo_id,
            repo_type="kernel",
            revision=pin.commit,
            allow_patterns=[f"build/{variant}/*"],
            ignore_patterns=_BYTECODE_IGNORE_PATTERNS,
            cache_dir=cache_dir(),
            force_download=force,
        )
    return Path(snapshot) / "build" / variant


_REPAIRABLE = {"files", "digest", "metadata", "signature", "lock"}


def _publisher_verdict(reason) -> bool:
    return isinstance(reason, str) and reason.startswith("trusted publisher ")


def _verify_copy(variant_dir: Path, **kwargs):
    """`verify_variant` with a private copy made while hashing; the copy is discarded unless verification passed."""
    from .importer import discard, private_copy_dir
    from .verify import verify_variant

    copy = private_copy_dir(variant_dir.name)
    try:
        report = verify_variant(variant_dir, bytecode="purge", copy_to=copy, **kwargs)
    except BaseException:
        discard(copy)
        raise
    if not report.ok or report.copy_path is None:
        discard(copy)
    return report


def _fetch_and_verify(api, pin, variant, keys, require_signature, origin, expect):
    variant_dir = _snapshot_variant_dir(pin.repo_id, pin.commit, variant)
    common = dict(public_keys=keys, require_signature=require_signature, origin=origin, expect=expect)
    with _variant_lock(pin.repo_id, pin.commit, variant):
        cached = (variant_dir / "metadata.json").is_file()
        if not cached:
            variant_dir = _download(api, pin, variant, force=False)
        report = _verify_copy(variant_dir, **common)
        if not report.ok and cached and {c.name for c in report.failures} & _REPAIRABLE:
            logger.warning(
                "cached copy of %s (%s) failed verification (%s); downloading it again",
                variant, pin.describe(), "; ".join(f"{c.name}: {c.detail}" for c in report.failures),
            )
            _remove_snapshot_variant(variant_dir)  # snapshot links only; blobs are re-fetched by force
            variant_dir = _download(api, pin, variant, force=True)
            report = _verify_copy(variant_dir, **common)
    if not report.ok:
        raise _verification_error(f"{pin.describe()}, variant {variant}", report)
    if pin.revision != pin.commit:
        _write_ref(pin)
    return variant_dir, report


def _remove_snapshot_variant(variant_dir: Path) -> None:
    """Remove a cached variant directory without following anything in it (links, FIFOs and all)."""
    try:
        shutil.rmtree(variant_dir)
    except FileNotFoundError:
        pass
    except OSError as e:
        logger.warning("cannot remove %s before downloading it again: %s", variant_dir, e)


def _write_ref(pin) -> None:
    """Record `refs/<revision>` -> commit in the cache (what `hf_hub_download(revision=<branch>)` writes), so that an
    offline load (kernels' or ours) can resolve `version=N` to the commit verified here."""
    from .resolve import repo_cache_folder

    ref = repo_cache_folder(pin.repo_id) / "refs" / pin.revision
    tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
    try:
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(pin.commit)
        os.replace(tmp, ref)
    except OSError as e:
        logger.debug("cannot write %s: %s", ref, e)


def _verification_error(what: str, report) -> VerificationError:
    failures = "\n".join(f"  {c.line()}" for c in report.failures)
    return VerificationError(
        f"refusing to import {what}: verification failed (nothing was imported):\n{failures}", checks=report.checks
    )


# ----------------------------------------------------------------------------------------------------------------------
# Offline cache


def _load_offline(repo_id, version, revision, trust_remote_code, keys, require_signature, backend):
    from . import resolve
    from .trust import explicit_trust

    pin = resolve.pin_offline(repo_id, version=version, revision=revision)
    build_dir = resolve.repo_cache_folder(repo_id) / "snapshots" / pin.commit / "build"
    if not build_dir.is_dir():
        raise OfflineError(
            f"{pin.describe()} is not in the local cache ({resolve.cache_dir()}) and the Hub is in offline mode "
            "(HF_HUB_OFFLINE)"
        )
    selection = resolve.select_local(build_dir, backend)
    if selection.variant is None:
        raise _NoVariant(resolve.not_found_message(f"{pin.describe()} (local cache, offline)", selection, backend),
                         repo_id, version, pin.revision, pin.commit, selection)
    variant_dir = build_dir / selection.variant
    trust = explicit_trust(repo_id, trust_remote_code)
    with _variant_lock(repo_id, pin.commit, selection.variant):
        # origin=None: the receipt keeps what the online verification recorded; an offline opt-in is not recorded
        report = _verify_copy(variant_dir, public_keys=keys, require_signature=require_signature, origin=None,
                              expect={"repo_id": repo_id, "version": version})
    if not report.ok:
        raise _verification_error(f"{pin.describe()}, variant {selection.variant} (local cache, offline)", report)
    if trust is None:
        earlier = report.origin or {}
        if earlier.get("repo_id") != repo_id or earlier.get("commit") != pin.commit \
                or not _publisher_verdict(earlier.get("trust")):
            from .importer import discard

            discard(report.copy_path)
            raise UntrustedKernelError(
                f"Kernel repository '{repo_id}' ({pin.describe()}): publisher trust cannot be checked in offline mode "
                f"(HF_HUB_OFFLINE) and no online winattn.load of this cache entry found it to come from a trusted "
                f"publisher (an earlier trust_remote_code / allowlist opt-in is not remembered). Load it online from "
                f"a trusted publisher, or pass trust_remote_code=True / an allowlist containing '{repo_id}'."
            )
        logger.warning(
            "Skipping publisher trust check for '%s' because Hugging Face Hub is in offline mode: the cached "
            "variant %s was verified online before and its publisher was trusted (%s).",
            repo_id, selection.variant, earlier["trust"],
        )
        trust_reason = f"offline: {earlier['trust']}"
    else:
        trust_reason = trust.reason
    return _import_verified(variant_dir, report, LoadInfo(
        repo_id=repo_id, version=version, revision=pin.revision, commit=pin.commit, variant=selection.variant,
        variant_path=str(variant_dir), source="offline-cache", trust=trust_reason,
        rejected=tuple(selection.rejected),
    ))


# ----------------------------------------------------------------------------------------------------------------------
# Vendored


def read_vendor_lock(directory: Path) -> dict:
    """The vendor lock of `directory`, normalized to
    `{"repo_id", "version", "commit", "variants": {name: {"metadata_sha256", "signature_sha256"}}}`."""
    try:
        from .vendor import read_lock

        raw = read_lock(directory)
    except ImportError:
        import json

        raw = json.loads((directory / LOCK_FILENAME).read_text())
    return normalize_lock(raw)


def normalize_lock(raw: dict) -> dict:
    if not isinstance(raw, dict):
        raise ValueError("the lock is not a JSON object")
    repo_id = raw.get("repo_id") or raw.get("repo")
    variants = {}
    entries = raw.get("variants") or {}
    if isinstance(entries, list):
        entries = {e.get("variant") or e.get("name"): e for e in entries}
    for name, entry in entries.items():
        entry = entry or {}
        meta = entry.get("metadata_sha256") or entry.get("metadata.json") or entry.get("metadata")
        sig = entry.get("signature_sha256") or entry.get("metadata.json.sigstore") or entry.get("signature")
        variants[name] = {"metadata_sha256": meta, "signature_sha256": sig}
    version = raw.get("version")
    return {"repo_id": repo_id, "version": int(version) if version is not None else None,
            "commit": raw.get("commit"), "variants": variants}


def _load_vendored(directory, repo_id, version, revision, keys, require_signature, backend):
    from . import resolve

    if not directory.is_dir():
        raise OfflineError(f"vendored directory {directory} does not exist")
    if not (directory / LOCK_FILENAME).is_file():
        raise VerificationError(f"vendored directory {directory} has no {LOCK_FILENAME}; refusing to load it",
                                checks=[("lock", False, f"{LOCK_FILENAME} missing")])
    try:
        lock = read_vendor_lock(directory)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise VerificationError(f"vendored directory {directory}: unreadable {LOCK_FILENAME}: {e}",
                                checks=[("lock", False, str(e))]) from e
    what = f"{lock['repo_id']} v{lock['version']} @ {str(lock['commit'])[:12]} (vendored in {directory})"
    problems = []
    if lock["repo_id"] != repo_id:
        problems.append(f"the lock is for '{lock['repo_id']}', not '{repo_id}'")
    if version is not None and lock["version"] != version:
        problems.append(f"the lock pins version {lock['version']}, not {version}")
    if revision is not None and revision not in (lock["commit"], f"v{lock['version']}"):
        problems.append(f"the lock pins commit {lock['commit']}, not revision {revision}")
    if problems:
        raise VerificationError(f"refusing vendored {what}: " + "; ".join(problems),
                                checks=[("lock", False, p) for p in problems])

    selection = resolve.select_local(directory, backend)
    locked = set(lock["variants"])
    choice = next((v for v in selection.accepted if v in locked), None)
    unlocked = [v for v in selection.accepted if v not in locked]
    if unlocked:
        logger.warning("vendored %s: ignoring variant directories not in %s: %s", what, LOCK_FILENAME,
                       ", ".join(unlocked))
    if choice is None:
        message = resolve.not_found_message(what, selection, backend)
        if unlocked:
            message += f"\n(not in {LOCK_FILENAME}, so not loadable: {', '.join(unlocked)})"
        raise _NoVariant(message, repo_id, version, revision, lock["commit"], selection)
    variant_dir = directory / choice
    report = _verify_copy(variant_dir, public_keys=keys, require_signature=require_signature,
                          lock_entry=lock["variants"][choice],
                          origin={"repo_id": lock["repo_id"], "commit": lock["commit"], "trust": "vendored"},
                          expect={"repo_id": repo_id, "version": lock["version"]})
    if not report.ok:
        raise _verification_error(f"{what}, variant {choice}", report)
    rejected = list(selection.rejected) + [(v, f"not in {LOCK_FILENAME}") for v in unlocked]
    return _import_verified(variant_dir, report, LoadInfo(
        repo_id=repo_id, version=lock["version"], revision=revision or f"v{lock['version']}", commit=lock["commit"],
        variant=choice, variant_path=str(variant_dir), source="vendored", trust="vendored (lock file)",
        rejected=tuple(rejected),
    ))


# ----------------------------------------------------------------------------------------------------------------------
# Import


def _already_loaded(metadata_id: str):
    """A module of the same op namespace already imported (by winattn, kernels or anyone), as (module, path)."""
    from kernels import get_loaded_kernels

    for loaded in get_loaded_kernels():
        if loaded.metadata.id == metadata_id:
            module = loaded.module
            return module, Path(getattr(module, "__file__", "") or "").parent
    module = sys.modules.get(metadata_id)
    if module is not None:
        return module, Path(getattr(module, "__file__", "") or "").parent
    return None


def _same_build(module, other_path: Path, metadata) -> bool:
    """Is the already-imported `module` (from `other_path`) the build just verified, so that reusing it is reusing
    these bytes? Yes if winattn verified it with the same digest, else if its files match the verified digest now."""
    from kernels._rust import Digest, DigestValidationError

    earlier = getattr(module, "__winattn_info__", None)
    if earlier is not None and earlier.digest_files is not None and earlier.digest_files == dict(metadata.digest.files):
        return True
    try:
        metadata.digest.validate(Digest.hash_variant(metadata.digest.algorithm, str(other_path)))
    except (DigestValidationError, OSError, RuntimeError):
        return False
    return True


def _import_verified(variant_dir: Path, report, info: LoadInfo):
    import dataclasses

    from . import importer

    metadata = report.metadata
    copy = report.copy_path
    with _IMPORT_LOCK:
        if importer.refused(metadata.id):
            importer.discard(copy)
            raise StaleKernelError(f"refusing {info.describe()} (verified, not imported): "
                                   + importer.stale_message(metadata.id))
        if metadata.kernel_depends:
            importer.discard(copy)
            raise VerificationError(
                f"refusing {info.describe()}: it declares kernel dependencies "
                f"({', '.join(str(d) for d in metadata.kernel_depends)}), which winattn does not verify",
                checks=list(report.checks) + [("kernel-depends", False, "kernel dependencies are not verified")])
        reused = _already_loaded(metadata.id)
        if reused is not None:
            importer.discard(copy)  # the bytes in memory are the ones in use; the copy is not needed
            module, other = reused
            if not _same_build(module, other, metadata):
                raise WinattnError(
                    f"{info.describe()}: another build with the op namespace '{metadata.id}' is already imported "
                    f"from {other}; torch cannot register it twice. Restart the process to switch builds."
                )
            info = dataclasses.replace(info, reused_from=str(other))
        else:
            try:
                module = importer.import_package(copy, metadata.id)
            except Exception as e:
                if hasattr(e, "add_note"):
                    e.add_note(f"while importing verified {info.repo_id} {info.revision} "
                               f"(commit {info.commit}), variant {info.variant} from {variant_dir} "
                               f"(private copy {copy})")
                raise
            importer.register_loaded(copy, metadata, module)
            info = dataclasses.replace(info, import_path=str(copy))
        smoke = smoke_test(module, metadata)
        checks = tuple(report.checks) + (smoke,)
        info = dataclasses.replace(info, checks=checks, receipt_hit=report.receipt_hit, signer=report.signer,
                                   digest_files=dict(metadata.digest.files), statement=report.statement)
        if not smoke.passed:
            if reused is None:
                importer.forget(metadata.id, copy, f"{info.repo_id} {info.revision} (commit {info.commit}), variant "
                                                   f"{info.variant}: smoke test failed: {smoke.detail}")
            raise VerificationError(
                f"{info.repo_id} {info.revision} (commit {info.commit}), variant {info.variant}: smoke test failed: "
                f"{smoke.detail}", checks=checks,
            )
        module.__winattn_info__ = info
    logger.info("winattn: loaded %s", info.describe())
    return module


def _device_for(metadata) -> str:
    from kernels._rust import Backend

    return {
        Backend.CPU: "cpu", Backend.CUDA: "cuda", Backend.ROCm: "cuda", Backend.Metal: "mps", Backend.XPU: "xpu",
        Backend.CANN: "npu",
    }.get(metadata.backend.backend_type, "cpu")


def smoke_test(module, metadata):
    """A tiny `attention` call on the variant's device, compared with the kernel's own `reference.attention`."""
    import torch

    from .verify import Check

    device = _device_for(metadata)
    dtype = torch.float32 if device == "cpu" else torch.float16
    try:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 16, 2, 32, generator=g).to(device=device, dtype=dtype) for _ in range(3))
        out = module.attention(q, k, v, causal=True)
        ref = module.reference.attention(q, k, v, causal=True)
        if device != "cpu":
            torch.cuda.synchronize() if device == "cuda" else None
        err = (out.float() - ref.float()).abs().max().item()
    except Exception as e:
        return Check("smoke-test", False, f"attention on {device} raised {type(e).__name__}: {e}")
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    if not err <= tol:  # also catches NaN
        return Check("smoke-test", False, f"attention on {device} differs from reference.attention by {err:.3g} "
                                          f"(tolerance {tol:g})")
    return Check("smoke-test", True, f"attention on {device} ({str(dtype).replace('torch.', '')}) matches "
                                     f"reference.attention (max abs err {err:.2g})")
