"""Where a variant comes from: the vendored directory, the verified offline cache and the Hub, as one chain.

Each source answers `locate(request)` the way `kernels`' resolvers do (style.md §4):

- a `Candidate`: the variant this machine would load, pinned to a commit, with its publisher's trust, where its
  files come from (a `Remote` to download from, or a local directory) and what its verification must hold it to
  (`Terms`: lock entry, signed statement, receipt origin);
- a `NoVariant`: the source is the right one, but no variant of it fits this machine (with kernels' reasons);
- None: not mine (the vendored source without a directory, the offline cache while online), try the next.

`chain(...)` composes them in that order. `winattn.load`, `winattn info`, `winattn verify REPO` and `winattn vendor`
all locate through it, so what `info` reports is what `load` imports. Nothing here fetches, verifies or imports:
`winattn.fetch.install` turns a `Candidate` into a `winattn.fetch.LocalVariant` (a directory on disk) and
`winattn.fetch.install_verified` verifies that once (a Hub copy once more after a repairable failure).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
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
            `Candidate.trust_error` instead (`winattn info`/`verify` report it).
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
class Listing:
    """The variants of the located commit, as kernels' selection judged them for this machine (`winattn info`).

    Attributes:
        names: every variant of the listing (compatible or not).
        accepted: the loadable compatible variants, most preferred first (the chosen one first).
        rejected: [(variant, reason)] of the others.
    """

    names: tuple = ()
    accepted: tuple = ()
    rejected: tuple = ()


@dataclass(frozen=True)
class Terms:
    """What verification holds every variant of the located commit to, decided by its source before any file of it
    is read (so that nothing a download contains can weaken it).

    Attributes:
        expect: what the signed statement must name (`winattn.verify.verify_variant(expect=...)`).
        origin: what a successful verification records in the receipt (publisher verdicts and vendored copies only:
            an opt-in is the caller's, for one call).
        lock: the vendor lock's entries by variant (vendored only).
    """

    expect: dict
    origin: Optional[dict] = None
    lock: Optional[dict] = None

    def lock_entry(self, variant: str) -> Optional[dict]:
        """The lock's entry for `variant`; a variant the lock does not list gets an entry no file can match (it never
        verifies). None without a lock."""
        if self.lock is None:
            return None
        return self.lock.get(variant, {"metadata_sha256": None, "signature_sha256": None})


@dataclass(frozen=True)
class Candidate:
    """A variant a source located (kernels' remote candidate): which build it is, whether its publisher is trusted
    and where its files come from. Nothing of it is verified, and a Hub variant need not be on disk yet:
    `winattn.fetch.install` turns it into a `winattn.fetch.LocalVariant`.

    Attributes:
        source: "vendored", "offline-cache" or "hub" (`LoadInfo.source`).
        repo_id, version, revision, commit, variant: which build it is.
        what: a description for messages ("<repo> v1 (commit abc…)").
        trust: why the publisher is trusted (`winattn.trust.TrustDecision`), or None when it is decided after
            verification (offline, from the receipt's origin) or could not be established (`trust_error`).
        trust_error: why the publisher is not trusted (only with `enforce_trust=False`).
        files: a `Remote` (a Hub variant, downloaded into the cache) or the local directory holding the variant
            directories (vendored, offline cache).
        listing: every variant of the commit, as the selection judged it (`Listing`).
        terms: what its verification must hold it to (`Terms`).
    """

    source: str
    repo_id: str
    version: Optional[int]
    revision: Optional[str]
    commit: Optional[str]
    variant: str
    what: str
    trust: Optional[TrustDecision]
    trust_error: Optional[str]
    files: Remote | Path = field(repr=False, compare=False)
    listing: Listing
    terms: Terms

    def for_variant(self, name: str) -> "Candidate":
        """The same source and commit, another of its variants (`winattn verify REPO --all-variants`)."""
        return replace(self, variant=name)

    @property
    def where(self) -> str:
        """A suffix for messages saying where the files are when that is not the Hub's (" (local cache, offline)")."""
        return OFFLINE_WHERE if self.source == "offline-cache" else ""

    @property
    def label(self) -> str:
        return f"{self.what}, variant {self.variant}{self.where}"


OFFLINE_WHERE = " (local cache, offline)"


@dataclass(frozen=True)
class NoVariant:
    """The source holds the kernel, but no variant fits this machine.

    `candidates`: a `Candidate` of each listed variant, none loadable here (`winattn verify REPO --all-variants`
    checks them all)."""

    source: str
    message: str
    repo_id: str
    version: Optional[int]
    revision: Optional[str]
    commit: Optional[str]
    selection: Any
    candidates: tuple = field(default=(), repr=False, compare=False)

    @property
    def listing(self) -> Listing:
        return Listing(_names(self.selection), (), tuple(self.selection.rejected))

    def for_variant(self, name: str) -> Candidate:
        return next(c for c in self.candidates if c.variant == name)


def _names(selection) -> tuple:
    return tuple(d.variant.variant_str for d in selection.decisions)


def _listing(selection) -> Listing:
    return Listing(_names(selection), tuple(selection.accepted), tuple(selection.rejected))


def _each(candidate: Candidate, selection) -> tuple:
    """A candidate of every listed variant (`NoVariant.candidates`); `candidate` names none loadable (variant "")."""
    return tuple(candidate.for_variant(name) for name in _names(selection))


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

        for name in _names(selection):  # names from the Hub: each becomes a directory of the cache
            untrusted.name(name, source=f"the Hub's variant listing of {pin.describe()}")
        candidate = Candidate(
            "hub", repo_id, request.version, pin.revision, pin.commit, selection.variant or "", pin.describe(), trust,
            trust_error, Remote(api, pin), _listing(selection),
            Terms({"repo_id": repo_id, "version": request.expected_version}, origin),
        )
        if selection.variant is None:
            return NoVariant("hub", resolve.not_found_message(pin.describe(), selection, request.backend), repo_id,
                             request.version, pin.revision, pin.commit, selection, _each(candidate, selection))
        return candidate


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
        selection = resolve.select_local(build_dir, request.backend)
        candidate = Candidate(
            "offline-cache", repo_id, request.version, pin.revision, pin.commit, selection.variant or "",
            pin.describe(), explicit_trust(repo_id, request.trust_remote_code), None, build_dir, _listing(selection),
            # origin=None: the receipt keeps what the online verification recorded; an offline opt-in is not recorded
            Terms({"repo_id": repo_id, "version": request.expected_version}, None),
        )
        if selection.variant is None:
            message = resolve.not_found_message(pin.describe() + OFFLINE_WHERE, selection, request.backend)
            return NoVariant("offline-cache", message, repo_id, request.version, pin.revision, pin.commit, selection,
                             _each(candidate, selection))
        return candidate


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

        candidate = Candidate(
            "vendored", request.repo_id, lock["version"], revision, lock["commit"], accepted[0] if accepted else "",
            what, vendored_trust(request.repo_id), None, directory,
            Listing(_names(selection), tuple(accepted), tuple(rejected)),
            Terms({"repo_id": request.repo_id, "version": lock["version"] if lock["version"] is not None
                   else request.expected_version},
                  {"repo_id": lock["repo_id"], "commit": lock["commit"], "trust": "vendored"}, lock["variants"]),
        )
        if not accepted:
            message = resolve.not_found_message(what, selection, request.backend)
            if unlocked:
                message += f"\n(not in {LOCK_FILENAME}, so not loadable: {', '.join(unlocked)})"
            return NoVariant("vendored", message, request.repo_id, request.requested_version, request.revision,
                             lock["commit"], selection, _each(candidate, selection))
        return candidate


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
    """`chain(...).locate(Request(...))`: a `Candidate` or a `NoVariant` (see the module docstring)."""
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


__all__ = ["Request", "Remote", "Listing", "Terms", "Candidate", "NoVariant", "HubSource", "OfflineCacheSource",
           "VendoredSource", "Chain", "chain", "locate", "read_vendor_lock", "normalize_lock"]
