"""`winattn.load`: the public API, and the import step. A load is: locate -> verify once -> import -> smoke test.

1. locate     `winattn.sources`: the vendored directory (`vendored=DIR`, checked against its lock, zero network), the
              offline cache (`HF_HUB_OFFLINE=1`: the revision from the cache's refs) or the Hub, where the publisher
              is trusted first (`winattn.trust.check_trust`: Hub `trustedKernelPublisher`, `trust_remote_code=True`
              or an allowlist -> `UntrustedKernelError` before anything is downloaded), `version=N` / `revision=`
              is pinned to one commit for the whole load, and kernels' variant resolution picks the variant on the
              commit's `build/` listing. None fits -> `NoVariantError` listing every variant and why it was
              rejected (or the reference with `fallback="reference"`, the one failure that falls back). `winattn
              info` reports this same step.
2. verify     `winattn.fetch`: download only `build/<variant>/*` at the pinned commit under a per-variant file lock
              (`DownloadError` when the Hub fails mid-way), then `winattn.verify.verify_variant` (files, lock,
              signature and what it is signed for, metadata, digest, kernels-minver, arch, python-depends), copying
              every file into a private directory while it is hashed -> `VerificationError` with every check, nothing
              imported. A cached copy whose bytes changed is downloaded once more; a wrong key is not.
3. import     the private copy's own `__init__.py`, source only (`winattn.importer.import_package`): what is
              imported is what was hashed, whatever happens to the cache meanwhile. A second load of the same build
              returns the module winattn imported the first time; a module of that op namespace that winattn did
              not import (kernels.get_kernel, a plain import) is never returned (`KernelConflictError`).
4. smoke test the kernel's `API_VERSION` is the one this winattn speaks (`IncompatibleKernelError` otherwise), then a
              tiny `attention` call on the variant's device against the kernel's own `reference`
              -> `VerificationError` on mismatch. After any failed import or smoke test, `<id>` and `<id>.*` leave
              `sys.modules`, and that op namespace is not loaded again in the process (`StaleKernelError`).

Offline, the publisher check is skipped (with a warning) only for cache entries that an earlier online load verified
AND found to come from a trusted publisher (their receipt). An earlier opt-in (`trust_remote_code`, an allowlist) is
never remembered: offline, the caller must opt in again.

The returned module carries `__winattn_info__` (a `LoadInfo`: repo, version, commit, variant, source, checks) and the
same is logged at INFO level.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

from . import fetch, resolve, sources
from .errors import (
    IncompatibleKernelError,
    KernelConflictError,
    NoVariantError,
    StaleKernelError,
    VerificationError,
)
from .sources import normalize_lock, read_vendor_lock  # noqa: F401  (their home before sources.py)
from .variant import DEFAULT_REPO, DEFAULT_VERSION, LOCK_FILENAME  # noqa: F401  (also importable from here)

logger = logging.getLogger("winattn")

_IMPORT_LOCK = threading.RLock()


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
        reused_from: the private copy an identical build was imported from earlier in this process by winattn, when
            that module was reused (a module winattn did not import is never reused: `KernelConflictError`).
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
    lock_sha256: Optional[str] = None,
):
    """Load the window-attention kernel for this machine, verified before it is imported.

    Args:
        repo_id: Hub repository ("<org>/<name>", repo type `kernel`).
        version: major version = branch `v<N>` (default 1 when no `revision` is given). Given together with a
            `revision`, the version that revision's build must be signed for.
        revision: branch, tag or 40-hex commit instead of `version`. A signed build must be signed for the version
            the revision names (`v<N>`, `refs/heads/v<N>`), else for `version` (default 1).
        trust_remote_code: True (any publisher), False (only Hub trusted publishers), or a list of repository ids
            allowed in addition to trusted publishers.
        public_keys: trusted public key file(s); a variant's signature, when present, must verify with one of them.
        require_signature: refuse unsigned variants (needs `public_keys`).
        fallback: "reference" returns the pure-PyTorch reference, with a warning saying why, instead of raising
            `NoVariantError`: the kernel exists but no variant fits this machine (or `backend` names one it cannot
            run). No other failure falls back: a repository, version or revision that does not exist
            (`KernelNotFoundError`), an unreachable Hub (`DownloadError`), files missing offline (`OfflineError`),
            an untrusted publisher (`UntrustedKernelError`) and a failed check (`VerificationError`) always raise.
        vendored: a `winattn vendor` directory to load from with zero network access.
        lock_sha256: with `vendored`, the sha256 (hex) of its lock file as `winattn vendor` printed it: pins the lock
            from outside the directory (a writer of the directory can otherwise replace the lock with that of an
            older signed build). `revision=<commit>` pins the commit the lock names.
        endpoint / token: the Hub to use (default: HF_ENDPOINT / HF_TOKEN).
        backend: kernels' `backend=` ("cpu" or the backend torch was built for; default: detected). Another one
            (e.g. "cuda" on a CPU machine) is `NoVariantError`: `winattn info --backend NAME` shows what such a
            machine would load.

    Returns:
        The kernel module (`attention`, `window_attention`, `reference`), with `__winattn_info__`.

    Raises:
        NoVariantError (unless `fallback="reference"`), KernelNotFoundError, UntrustedKernelError, DownloadError,
        OfflineError, VerificationError (IncompatibleKernelError: another kernel API version; RemoteValueError: the
        Hub, a cache ref, a receipt or the lock gave a value that is not what it must be), StaleKernelError (a build
        of this op namespace failed to load earlier in the process), KernelConflictError (a module of this op
        namespace that winattn did not import, or another build of it, is already in the process). All are
        `winattn.errors.WinattnError`.
    """
    if fallback not in (None, "reference"):
        raise ValueError(f"fallback must be None or 'reference', got {fallback!r}")
    from .resolve import check_version_args
    from .trust import normalize as normalize_trust

    requested_version = version  # what the caller named: a vendored lock and a revision's signature are held to it
    if version is None and revision is None:
        version = DEFAULT_VERSION
    check_version_args(version, revision, both=True)
    if revision is not None:
        version = None  # the revision is what is pinned; `requested_version` is what its signature must name
    if lock_sha256 is not None and vendored is None:
        raise ValueError("lock_sha256= pins the lock of a vendored directory: pass vendored= too")
    normalize_trust(trust_remote_code)  # TypeError for a wrong type before any lookup
    keys = _normalize_keys(public_keys)
    if require_signature and not keys:
        raise ValueError("require_signature=True needs public_keys=[...] (the keys signatures must verify with)")

    if backend is not None:
        resolve.backend_for(backend)  # ValueError for a name that is no backend
    if not resolve.runs_here(backend):
        message = (f"backend {backend!r} cannot run on this machine ({resolve.system_description()}): a load takes "
                   f"'cpu' or the backend torch was built for (`winattn info --backend {backend}` shows what a "
                   f"{backend} machine would load)")
        if fallback != "reference":
            raise NoVariantError(message)
        logger.warning("%s\nUsing the pure-PyTorch reference implementation (fallback='reference').", message)
        return _reference_module(None, repo_id=repo_id, version=version, revision=revision)
    found = sources.locate(repo_id, version=version, revision=revision, requested_version=requested_version,
                           backend=backend, trust_remote_code=trust_remote_code, vendored=vendored,
                           lock_sha256=lock_sha256, endpoint=endpoint, token=token)
    if isinstance(found, sources.NoVariant):
        if fallback != "reference":
            raise NoVariantError(found.message)
        logger.warning("%s\nUsing the pure-PyTorch reference implementation (fallback='reference').", found.message)
        return _reference_module(found)
    local, report = fetch.install_verified(found, keys, require_signature)
    return _import_verified(local.path, report, LoadInfo(
        repo_id=repo_id, version=found.version, revision=found.revision, commit=found.commit, variant=found.variant,
        variant_path=str(local.path), source=found.source, trust=fetch.trust_reason(found, report),
        rejected=found.listing.rejected,
    ))


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


def _reference_module(missing: "Optional[sources.NoVariant]", **asked):
    from .reference_kernel import load_reference

    module = load_reference()
    if missing is not None:
        asked = dict(repo_id=missing.repo_id, version=missing.version, revision=missing.revision,
                     commit=missing.commit, rejected=missing.listing.rejected)
    module.__winattn_info__ = LoadInfo(**{"commit": None, **asked}, variant=None, variant_path=None,
                                       source="reference")
    return module


# ----------------------------------------------------------------------------------------------------------------------
# Import


def _reusable(metadata, info: LoadInfo):
    """(module, its private copy) when this loader already imported this very build (same op namespace, same
    digest) from its own verified copy, else None; `KernelConflictError` when the namespace is taken by another build
    winattn imported, or by a module winattn did not import at all (`kernels.get_kernel`, a plain import): its bytes
    were never verified here, so it is never handed back."""
    from . import importer

    own = importer.imported(metadata.id)
    if own is not None:
        module, copy, digest_files = own
        if digest_files == dict(metadata.digest.files):
            return module, copy
        raise KernelConflictError(
            f"{info.describe()}: another build with the op namespace '{metadata.id}' was imported earlier in this "
            f"process (from {copy}); torch cannot register the namespace twice. Start a new process to switch builds."
        )
    other = importer.foreign(metadata.id)
    if other is not None:
        raise KernelConflictError(
            f"{info.describe()}: verified, not imported: a module with the op namespace '{metadata.id}' is already in "
            f"this process, in {other}, and winattn did not import it: it is not handed back (its bytes were never "
            "verified by winattn), and torch cannot register the namespace twice. Load the kernel with winattn in a "
            "new process, before anything else (kernels.get_kernel, an import) loads it."
        )
    return None


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
        try:
            reused = _reusable(metadata, info)
        except KernelConflictError:
            importer.discard(copy)
            raise
        if reused is not None:
            importer.discard(copy)  # the bytes in memory are the ones in use; the copy is not needed
            module, other = reused
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
        # The kernel API version first: calling a kernel of another API (even `attention`) is not a fair test.
        api = api_check(module)
        smoke = smoke_test(module, metadata) if api.passed else api
        checks = tuple(report.checks) + (smoke,)
        info = dataclasses.replace(info, checks=checks, receipt_hit=report.receipt_hit, signer=report.signer,
                                   digest_files=dict(metadata.digest.files), statement=report.statement)
        failed = None if smoke.passed else smoke
        if failed is not None:
            what = f"{info.repo_id} {info.revision} (commit {info.commit}), variant {info.variant}"
            cause = "smoke test failed" if api.passed else "incompatible kernel API"
            if reused is None:
                importer.forget(metadata.id, copy, f"{what}: {cause}: {failed.detail}")
            error = VerificationError if api.passed else IncompatibleKernelError
            raise error(f"{what}: {cause}: {failed.detail}", checks=checks)
        module.__winattn_info__ = info
    logger.info("winattn: loaded %s", info.describe())
    return module


def _device_for(metadata) -> str:
    from ._kernels_private import Backend

    return {
        Backend.CPU: "cpu", Backend.CUDA: "cuda", Backend.ROCm: "cuda", Backend.Metal: "mps", Backend.XPU: "xpu",
        Backend.CANN: "npu",
    }.get(metadata.backend.backend_type, "cpu")


def api_check(module):
    """The kernel's `API_VERSION` is the one this winattn speaks (`winattn.variant.KERNEL_API_VERSION`); a failure is
    reported as the smoke test (the module cannot be used by this winattn)."""
    from .variant import KERNEL_API_VERSION
    from .verify import Check

    have = getattr(module, "API_VERSION", None)
    if have == KERNEL_API_VERSION:
        return Check("smoke-test", True, f"kernel API version {have}")
    shown = "none (a kernel older than the versioned API)" if have is None else str(have)
    return Check("smoke-test", False,
                 f"the kernel's API_VERSION is {shown}, but this winattn speaks API version {KERNEL_API_VERSION}: "
                 f"{'upgrade winattn' if isinstance(have, int) and have > KERNEL_API_VERSION else 'use a newer kernel'}"
                 " or pin the kernel (version= / revision=) to a build of API version "
                 f"{KERNEL_API_VERSION}")


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
