"""Where a variant comes from: the vendored directory, the verified offline cache and the Hub, as one chain.

Each source answers `locate(request)` the way `kernels`' resolvers do (style.md §4):

- a `Found`: the variant this machine would load, pinned to a commit, with where its files are (or will be, once
  `winattn.fetch.install`ed from its `remote`) and what its verification must hold it to (lock entry, signed
  statement, receipt origin);
- a `NoVariant`: the source is the right one, but no variant of it fits this machine (with kernels' reasons);
- None: not mine (the vendored source without a directory, the offline cache while online), try the next.

`chain(...)` composes them in that order. `winattn.load`, `winattn info`, `winattn verify REPO` and `winattn vendor`
all locate through it, so what `info` reports is what `load` imports. Nothing here fetches, verifies or imports: a
`Found` is a candidate; `winattn.fetch` installs and verifies it once (a Hub copy once more after a repairable
failure).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from . import cache_layout, resolve, untrusted
from .errors import OfflineError, UntrustedKernelError, VerificationError
from .hub_errors import network_step
from .trust import TrustDecision, TrustKind, check_trust, explicit_trust, vendored_trust
from .variant import LOCK_FILENAME

logger = logging.getLogger("winattn")


@dataclass(frozen=True)
class Request:
    """What is asked for.

    Attributes:
        repo_id: the repository.
        version / revision: the pinned revision (`version` already defaulted to 1 when neither was given).
        requested_version: the version the caller named explicitly (a vendored lock is held only to that one).
        backend: kernels' `backend=` (None: detected).
        trust_remote_code: as `winattn.load`.
        enforce_trust: raise `UntrustedKernelError` before anything is fetched (loads); False records the verdict in
            `Found.trust_error` instead (`winattn info`/`verify` report it).
    """

    repo_id: str
    version: Optional[int]
    revision: Optional[str]
    requested_version: Optional[int] = None
    backend: Optional[str] = None
    trust_remote_code: Any = False
    enforce_trust: bool = True

    @property
    def asked(self) -> str:
        return f"v{self.version}" if self.version is not None else str(self.revision)

    @property
    def expected_version(self) -> int:
        """The version a signature must name, however the build was asked for (`resolve.expected_version`)."""
        return resolve.expected_version(self.requested_version if self.revision is not None else self.version,
                                        self.revision)


@dataclass(frozen=True)
class Remote:
    """Where a Hub variant is fetched from (`winattn.fetch.install`): the load's `HfApi` and the pinned commit."""

    api: Any
    pin: resolve.Pin


@dataclass(frozen=True)
class Found:
    """A variant located by a source (not yet verified).

    Attributes:
        source: "vendored", "offline-cache" or "hub" (`LoadInfo.source`).
        repo_id, version, revision, commit, variant: what it is.
        variant_dir: its directory (for the Hub: where `fetch` puts it in the cache).
        what: a description for messages ("<repo> v1 (commit abc…)"), `where` a suffix (" (local cache, offline)").
        rejected: [(variant, reason)] of every other variant.
        accepted: the compatible variants, most preferred first (the chosen one first).
        trust: why the publisher is trusted (`winattn.trust.TrustDecision`), or None when it is decided after
            verification (offline, from the receipt's origin) or could not be established (`trust_error`).
        trust_error: why the publisher is not trusted (only with `enforce_trust=False`).
        lock_entry: the vendor lock's entry for the variant.
        origin: what a successful verification records in the receipt (publisher verdicts only).
        expect: what the signed statement must name (`winattn.verify.verify_variant(expect=...)`).
        variants: every variant name of the listing (compatible or not).
        remote: for a Hub variant, where `winattn.fetch` downloads it from (None: its files are local).
    """

    source: str
    repo_id: str
    version: Optional[int]
    revision: Optional[str]
    commit: Optional[str]
    variant: str
    variant_dir: Path
    what: str
    rejected: tuple = ()
    accepted: tuple = ()
    trust: Optional[TrustDecision] = None
    trust_error: Optional[str] = None
    where: str = ""
    lock_entry: Optional[dict] = None
    origin: Optional[dict] = None
    expect: dict = field(default_factory=dict)
    variants: tuple = ()
    remote: Optional[Remote] = field(default=None, repr=False, compare=False)
    _make: Any = field(default=None, repr=False, compare=False)

    def for_variant(self, name: str) -> "Found":
        """The same source and commit, another of its variants (`winattn verify REPO --all-variants`)."""
        return self._make(name)

    @property
    def label(self) -> str:
        return f"{self.what}, variant {self.variant}{self.where}"


@dataclass(frozen=True)
class NoVariant:
    """The source holds the kernel, but no variant fits this machine."""

    source: str
    message: str
    repo_id: str
    version: Optional[int]
    revision: Optional[str]
    commit: Optional[str]
    selection: Any
    _make: Any = field(default=None, repr=False, compare=False)

    @property
    def rejected(self) -> tuple:
        return tuple(self.selection.rejected)

    @property
    def variants(self) -> tuple:
        return _names(self.selection)

    def for_variant(self, name: str) -> Found:
        return self._make(name)


def _names(selection) -> tuple:
    return tuple(d.variant.variant_str for d in selection.decisions)


# ----------------------------------------------------------------------------------------------------------------------
# Sources


@dataclass
class HubSource:
    """The Hub: trust (before anything is downloaded), pin the revision to a commit, select on its `build/` listing."""

    endpoint: Optional[str] = None
    token: Any = None

    def locate(self, request: Request):
        """Every answer of the Hub here is held to `winattn.hub_guard`'s rules (sizes, depth, redirects, headers)."""
        from .hub_guard import guarded

        api = resolve.make_api(self.endpoint, self.token)
        with guarded(api.endpoint):
            return self._locate(api, request)

    def _locate(self, api, request: Request):
        repo_id = request.repo_id
        trust = trust_error = None
        with network_step(f"checking publisher trust of '{repo_id}'", repo_id=repo_id, endpoint=api.endpoint):
            try:
                trust = check_trust(repo_id, request.trust_remote_code, api=api)
            except UntrustedKernelError as e:
                if request.enforce_trust:
                    raise UntrustedKernelError(f"{e} (refused {repo_id} {request.asked} before downloading "
                                               "anything)") from None
                trust_error = str(e)
        pin = resolve.pin(api, repo_id, version=request.version, revision=request.revision)
        with network_step(f"listing the variants of {pin.describe()}", repo_id=repo_id, endpoint=api.endpoint):
            selection = resolve.select_hub(api, pin, request.backend)
        # Only a publisher verdict is recorded for offline loads; an opt-in is the caller's, for this call only.
        origin = {"repo_id": repo_id, "commit": pin.commit, "trust": trust.reason} \
            if trust is not None and trust.kind is TrustKind.PUBLISHER else None

        def make(name):
            return Found(
                "hub", repo_id, request.version, pin.revision, pin.commit, name,
                cache_layout.cache_variant_dir(repo_id, pin.commit, name), pin.describe(),
                rejected=tuple(selection.rejected), accepted=tuple(selection.accepted), trust=trust,
                trust_error=trust_error, origin=origin,
                expect={"repo_id": repo_id, "version": request.expected_version},
                variants=_names(selection), remote=Remote(api, pin), _make=make,
            )

        for name in _names(selection):  # names from the Hub: each becomes a directory of the cache
            untrusted.name(name, source=f"the Hub's variant listing of {pin.describe()}")
        if selection.variant is None:
            return NoVariant("hub", resolve.not_found_message(pin.describe(), selection, request.backend), repo_id,
                             request.version, pin.revision, pin.commit, selection, make)
        return make(selection.variant)


@dataclass
class OfflineCacheSource:
    """The local cache while `HF_HUB_OFFLINE=1`: the revision from the cache's refs, nothing from the network.

    The publisher is trusted only by an explicit opt-in of this call, or by the verdict an earlier online
    verification of this same cache entry recorded (decided by `winattn.load` after verification: `trust` None).
    """

    def locate(self, request: Request):
        from huggingface_hub import constants

        if not constants.is_offline_mode():
            return None
        repo_id = request.repo_id
        pin = resolve.pin_offline(repo_id, version=request.version, revision=request.revision)
        build_dir = cache_layout.cache_build_dir(repo_id, pin.commit)
        if not build_dir.is_dir():
            raise OfflineError(
                f"{pin.describe()} is not in the local cache ({cache_layout.cache_dir()}) and the Hub is in offline "
                "mode (HF_HUB_OFFLINE)"
            )
        where = " (local cache, offline)"
        selection = resolve.select_local(build_dir, request.backend)
        trust = explicit_trust(repo_id, request.trust_remote_code)

        def make(name):
            return Found(
                "offline-cache", repo_id, request.version, pin.revision, pin.commit, name, build_dir / name,
                pin.describe(), where=where, rejected=tuple(selection.rejected), accepted=tuple(selection.accepted),
                trust=trust,
                # origin=None: the receipt keeps what the online verification recorded; an offline opt-in is not
                # recorded
                origin=None, expect={"repo_id": repo_id, "version": request.expected_version},
                variants=_names(selection),
                _make=make,
            )

        if selection.variant is None:
            message = resolve.not_found_message(pin.describe() + where, selection, request.backend)
            return NoVariant("offline-cache", message, repo_id, request.version, pin.revision, pin.commit, selection,
                             make)
        return make(selection.variant)


@dataclass
class VendoredSource:
    """A `winattn vendor` directory: only the variants its lock file lists, checked against the lock, no network.
    `lock_sha256` (hex) pins the lock itself from outside the directory."""

    directory: Optional[Path] = None
    lock_sha256: Optional[str] = None

    def locate(self, request: Request):
        if self.directory is None:
            return None
        directory = Path(self.directory)
        lock = read_checked_lock(directory, sha256=self.lock_sha256)
        what = vendored_what(lock, directory)
        problems = []
        if lock["repo_id"] != request.repo_id:
            problems.append(f"the lock is for '{lock['repo_id']}', not '{request.repo_id}'")
        if request.requested_version is not None and lock["version"] != request.requested_version:
            problems.append(f"the lock pins version {lock['version']}, not {request.requested_version}")
        if request.revision is not None and request.revision not in (lock["commit"], f"v{lock['version']}"):
            problems.append(f"the lock pins commit {lock['commit']}, not revision {request.revision}")
        if problems:
            raise VerificationError(f"refusing vendored {what}: " + "; ".join(problems),
                                    checks=[("lock", False, p) for p in problems])
        selection = resolve.select_local(directory, request.backend)
        locked = set(lock["variants"])
        accepted = [v for v in selection.accepted if v in locked]
        unlocked = [v for v in selection.accepted if v not in locked]
        if unlocked:
            logger.warning("vendored %s: ignoring variant directories not in %s: %s", what, LOCK_FILENAME,
                           ", ".join(unlocked))
        revision = request.revision or f"v{lock['version']}"
        rejected = list(selection.rejected) + [(v, f"not in {LOCK_FILENAME}") for v in unlocked]

        def make(name):
            return Found(
                "vendored", request.repo_id, lock["version"], revision, lock["commit"], name, directory / name, what,
                rejected=tuple(rejected), accepted=tuple(accepted), trust=vendored_trust(request.repo_id),
                # a variant the lock does not list gets an entry no file can match: it never verifies
                lock_entry=lock["variants"].get(name, {"metadata_sha256": None, "signature_sha256": None}),
                origin={"repo_id": lock["repo_id"], "commit": lock["commit"], "trust": "vendored"},
                expect={"repo_id": request.repo_id, "version": lock["version"] if lock["version"] is not None
                        else request.expected_version},
                variants=_names(selection),
                _make=make,
            )

        if not accepted:
            message = resolve.not_found_message(what, selection, request.backend)
            if unlocked:
                message += f"\n(not in {LOCK_FILENAME}, so not loadable: {', '.join(unlocked)})"
            return NoVariant("vendored", message, request.repo_id, request.requested_version, request.revision,
                             lock["commit"], selection, make)
        return make(accepted[0])


@dataclass
class Chain:
    """Sources in order; the first that does not answer "not mine" decides (kernels' `SequentialResolver`)."""

    sources: list

    def locate(self, request: Request):
        for source in self.sources:
            found = source.locate(request)
            if found is not None:
                return found
        raise OfflineError(f"no source for {request.repo_id} {request.asked}")  # the Hub always answers


def chain(*, vendored=None, lock_sha256=None, endpoint: Optional[str] = None, token=None) -> Chain:
    """The loader's chain: the vendored directory (when given), the offline cache (when offline), the Hub."""
    if vendored is not None:
        return Chain([VendoredSource(Path(vendored), lock_sha256)])  # zero network access: nothing after it
    return Chain([OfflineCacheSource(), HubSource(endpoint, token)])


def locate(repo_id: str, *, version=None, revision=None, requested_version=None, backend=None,
           trust_remote_code=False, enforce_trust=True, vendored=None, lock_sha256=None, endpoint=None, token=None):
    """`chain(...).locate(Request(...))`: a `Found` or a `NoVariant` (see the module docstring)."""
    request = Request(repo_id, version, revision, requested_version, backend, trust_remote_code, enforce_trust)
    return chain(vendored=vendored, lock_sha256=lock_sha256, endpoint=endpoint, token=token).locate(request)


# ----------------------------------------------------------------------------------------------------------------------
# Vendor locks


def read_vendor_lock(directory: Path, *, sha256: Optional[str] = None) -> dict:
    """The vendor lock of `directory`, normalized to
    `{"repo_id", "version", "commit", "variants": {name: {"metadata_sha256", "signature_sha256"}}}`; with `sha256`,
    only if the lock's bytes have that sha256 (`winattn.vendor.read_lock`)."""
    from .vendor import read_lock

    return normalize_lock(read_lock(directory, sha256=sha256))


def read_checked_lock(directory: Path, *, sha256: Optional[str] = None) -> dict:
    """`read_vendor_lock`, with a missing directory an `OfflineError` and a missing or unreadable lock a
    `VerificationError` (a vendored load refuses to guess)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise OfflineError(f"vendored directory {directory} does not exist")
    if not (directory / LOCK_FILENAME).is_file():
        raise VerificationError(f"vendored directory {directory} has no {LOCK_FILENAME}; refusing to load it",
                                checks=[("lock", False, f"{LOCK_FILENAME} missing")])
    try:
        return read_vendor_lock(directory, sha256=sha256)
    except VerificationError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise VerificationError(f"vendored directory {directory}: unreadable {LOCK_FILENAME}: {e}",
                                checks=[("lock", False, str(e))]) from e


def vendored_what(lock: dict, directory: Path) -> str:
    return f"{lock['repo_id']} v{lock['version']} @ {str(lock['commit'])[:12]} (vendored in {directory})"


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


__all__ = ["Request", "Remote", "Found", "NoVariant", "HubSource", "OfflineCacheSource", "VendoredSource", "Chain",
           "chain", "locate", "read_vendor_lock", "normalize_lock"]
