"""`winattn vendor`: copy variants of a published kernel into a directory, pinned by a lock, for offline use.

    DIR/<variant>/...              the variant as published (metadata.json, signature, .so, python files)
    DIR/window-attention.lock      JSON, see `read_lock`

The branch (`--version N` → `v<N>`) or revision is resolved to a commit sha once (`winattn.resolve.pin`); every
download uses that sha. Which variant fits this machine is what `winattn.load` would locate on the Hub
(`winattn.sources.HubSource`, kernels' own variant resolution), never re-implemented here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from . import bounded_json, safe_fs, untrusted
from .errors import KernelNotFoundError, NoVariantError, OfflineError, VerificationError
from .hub_errors import hub_call_errors, network_step
from .variant import LOCK_FILENAME, METADATA_FILENAME, SIGNATURE_FILENAME

LOCK_FORMAT = 1
MAX_LOCK_BYTES = 1 << 20
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def variant_lock_entry(variant_dir: Path) -> dict:
    """`{"metadata_sha256": hex, "signature_sha256": hex | None}` for a variant directory as it is on disk."""
    variant_dir = Path(variant_dir)
    signature = variant_dir / SIGNATURE_FILENAME
    return {
        "metadata_sha256": _sha256(variant_dir / METADATA_FILENAME),
        "signature_sha256": _sha256(signature) if signature.is_file() else None,
    }


def lock_sha256(directory: Path) -> str:
    """sha256 (hex) of `directory/window-attention.lock`: what `winattn.load(vendored=..., lock_sha256=...)` pins."""
    return hashlib.sha256(safe_fs.read_small(Path(directory) / LOCK_FILENAME, MAX_LOCK_BYTES)).hexdigest()


def read_lock(directory: Path, *, sha256: str | None = None) -> dict:
    """Read and validate `directory/window-attention.lock` (read once, without following a link).

    Args:
        sha256: the lock's expected sha256 (hex), pinned from outside the directory: any other lock is refused.

    Returns:
        dict: `{"format": 1, "repo": "org/name", "version": int | None, "revision": str, "commit": "<40 hex>",
        "variants": {"<variant>": {"metadata_sha256": "<64 hex>", "signature_sha256": "<64 hex>" | None}}}`.
        `revision` is what was asked for (`v<N>` for a version); `commit` the sha it resolved to.

    Raises:
        OfflineError: there is no lock file in `directory`.
        VerificationError: the lock is not valid JSON, too large or deep, not of that shape, names a variant that is
            not a plain directory name, or does not have the pinned sha256.
    """
    path = Path(directory) / LOCK_FILENAME

    def bad(why: str):
        raise VerificationError(f"invalid lock {path}: {why}", checks=[("lock", False, why)])

    try:
        raw = safe_fs.read_small(path, MAX_LOCK_BYTES)
    except FileNotFoundError:
        raise OfflineError(f"{path} does not exist: vendor the kernel first (`winattn vendor --local-dir "
                           f"{directory}`)") from None
    except OSError as e:
        bad(f"cannot be read as a regular file of at most {MAX_LOCK_BYTES} bytes ({e})")
    if sha256 is not None:
        if not (isinstance(sha256, str) and _SHA256_HEX.match(sha256.lower())):
            raise ValueError(f"lock_sha256 must be a sha256 hex digest, got {sha256!r}")
        got = hashlib.sha256(raw).hexdigest()
        if got != sha256.lower():
            raise VerificationError(
                f"refusing vendored {directory}: its {LOCK_FILENAME} has sha256 {got}, not the pinned {sha256.lower()} "
                "(lock_sha256=): the lock was replaced or the pin is stale; vendor again and pin the new lock",
                checks=[("lock", False, f"lock sha256 {got} != pinned {sha256.lower()}")])
    try:
        lock = bounded_json.loads(raw, max_bytes=MAX_LOCK_BYTES, what=LOCK_FILENAME)
    except ValueError as e:
        bad(f"not JSON ({e})")
    if not isinstance(lock, dict):
        bad("not a JSON object")
    if lock.get("format") != LOCK_FORMAT:
        bad(f"format {lock.get('format')!r}, expected {LOCK_FORMAT}")
    if not isinstance(lock.get("repo"), str) or lock["repo"].count("/") != 1:
        bad(f"repo {lock.get('repo')!r} is not ORG/NAME")
    if lock.get("version") is not None and not (isinstance(lock["version"], int) and lock["version"] >= 0):
        bad(f"version {lock.get('version')!r} is not a non-negative integer or null")
    if not untrusted.is_commit(lock.get("commit")):
        bad(f"commit {lock.get('commit')!r} is not a 40-hex sha")
    variants = lock.get("variants")
    if not isinstance(variants, dict) or not variants:
        bad("no variants")
    for name, entry in variants.items():
        if untrusted.path_problem(name) is not None or "/" in name:
            bad(f"variant {untrusted.shown(repr(name))} is not a directory name")
        if not isinstance(entry, dict) or not _SHA256_HEX.match(str(entry.get("metadata_sha256"))):
            bad(f"variant {name}: metadata_sha256 is not a sha256 hex digest")
        sig = entry.get("signature_sha256")
        if sig is not None and not _SHA256_HEX.match(str(sig)):
            bad(f"variant {name}: signature_sha256 is neither null nor a sha256 hex digest")
    return lock


def _select_variants(api, pin, variants: list[str] | None, all_variants: bool) -> list[str]:
    from . import resolve

    where = f"{pin.repo_id}@{pin.commit[:12]}"
    with network_step(f"listing the variants of {where}", repo_id=pin.repo_id, endpoint=api.endpoint):
        selection = resolve.select_hub(api, pin)
    names = sorted(d.variant.variant_str for d in selection.decisions)
    if not names:
        raise KernelNotFoundError(f"{where} has no build/<variant>/ directories")
    if all_variants:
        return names
    if variants:
        unknown = [v for v in variants if v not in names]
        if unknown:
            raise KernelNotFoundError(f"variant(s) {', '.join(unknown)} not in {where}; available: {', '.join(names)}")
        return list(dict.fromkeys(variants))
    if selection.variant is None:
        raise NoVariantError(
            f"no variant of {where} fits this machine (use --variant or --all-variants to vendor for another one):\n"
            f"{selection.trace()}"
        )
    return [selection.variant]


def vendor(
    repo_id: str,
    *,
    version: int | None = None,
    revision: str | None = None,
    out_dir: Path,
    variants: list[str] | None = None,
    all_variants: bool = False,
    endpoint: str | None = None,
    token: str | None = None,
) -> Path:
    """Download variants of `repo_id` at one pinned commit into `out_dir/<variant>/` and write the lock.

    Args:
        version / revision: exactly one; `version=N` is branch `v<N>`.
        variants: variant names to vendor; default (and without `all_variants`) the one kernels picks here.
        all_variants: vendor every variant of the commit.
        endpoint, token: Hub endpoint and token (`None` = huggingface_hub's defaults).

    Returns:
        Path: `out_dir`. A lock for the same repo and commit is extended; one for another commit is replaced and the
        variants it listed are removed.

    Raises:
        KernelNotFoundError: unknown repo, version, revision or variant, or no variant fits this machine.
        VerificationError: a downloaded variant does not match its metadata.json digest (nothing is written then).
    """
    from . import resolve
    from .download import download
    from .hub_guard import guarded
    from .digest import check_digest

    resolve.check_version_args(version, revision)
    if variants and all_variants:
        raise ValueError("pass either variants= or all_variants=True, not both")
    out_dir = Path(out_dir)
    api = resolve.make_api(endpoint, token)
    with guarded(api.endpoint):  # the Hub's answers held to winattn.hub_guard's rules, as in a load
        pin = resolve.pin(api, repo_id, version=version, revision=revision)
        chosen = _select_variants(api, pin, variants, all_variants)
    asked, commit = pin.revision, pin.commit

    out_dir.mkdir(parents=True, exist_ok=True)
    entries: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix=".vendor-", dir=out_dir) as staging:
        download(api, pin, chosen, local_dir=Path(staging))
        for name in chosen:
            vdir = Path(staging) / "build" / name
            if not (vdir / METADATA_FILENAME).is_file():
                raise KernelNotFoundError(f"variant {name} of {repo_id}@{commit[:12]} has no metadata.json")
            try:
                check_digest(vdir)
            except ValueError as e:
                raise VerificationError(
                    f"variant {name} of {repo_id}@{commit[:12]}: {e}", checks=[("digest", False, str(e))]
                ) from None
            entries[name] = variant_lock_entry(vdir)

        lock = {
            "format": LOCK_FORMAT,
            "repo": repo_id,
            "version": version,
            "revision": asked,
            "commit": commit,
            "variants": {},
        }
        try:
            old = read_lock(out_dir)
        except (OfflineError, VerificationError):
            old = None
        if old and old["repo"] == repo_id and old["commit"] == commit:
            lock["variants"].update(old["variants"])
            if old.get("version") is not None and version is None:
                lock["version"], lock["revision"] = old["version"], old["revision"]
        elif old:
            for name in old["variants"]:  # plain directory names (read_lock): never a path out of out_dir
                if name not in chosen:
                    safe_fs.remove_tree(out_dir / name)
        for name in chosen:
            target = out_dir / name
            safe_fs.remove_tree(target)  # a link in its place is removed, not followed
            os.rename(Path(staging) / "build" / name, target)
        lock["variants"].update(entries)
        lock["variants"] = dict(sorted(lock["variants"].items()))
        safe_fs.write_atomic(out_dir / LOCK_FILENAME, (json.dumps(lock, indent=2) + "\n").encode())
    return out_dir


def _trust_note(repo_id: str, endpoint: str | None, token: str | None) -> str | None:
    """A note when the publisher is not one the Hub trusts: `winattn.load(vendored=...)` does no trust check, so
    vendoring a kernel is the trust decision (the lock pins what was decided on)."""
    from . import resolve
    from .errors import UntrustedKernelError
    from .trust import check_trust

    try:
        check_trust(repo_id, False, api=resolve.make_api(endpoint, token))
    except UntrustedKernelError:
        return (f"note: {repo_id.split('/')[0]} is not a trusted kernel publisher on this Hub. "
                f"winattn.load(vendored=...) loads what the lock pins without asking again: by vendoring it you "
                f"decided to trust it. Review it, or sign and verify it (winattn verify --public-key).")
    except hub_call_errors():
        return None  # the download just worked; a failed trust lookup only loses the note
    return None


def _run(args) -> int:
    from .cli_args import resolved_repo_id, version_and_revision

    from . import resolve

    resolve.PROBE_WITHOUT_TORCH_IMPORT = True  # nothing is imported here (see winattn.resolve)
    repo_id = resolved_repo_id(args)
    version, revision = version_and_revision(args)
    local_dir = args.local_dir if args.local_dir is not None else args.legacy_out
    if local_dir is None:
        local_dir = Path("vendor")
    if args.quiet:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    out = vendor(
        repo_id,
        version=version,
        revision=revision,
        out_dir=local_dir,
        variants=args.variant,
        all_variants=args.all_variants,
        endpoint=args.endpoint,
        token=args.token,
    )
    lock = read_lock(out)
    if not args.quiet:
        for name in lock["variants"]:
            print(out / name)
    print(f"{out / LOCK_FILENAME}: {lock['repo']}@{lock['commit']} (lock sha256 {lock_sha256(out)})")
    note = _trust_note(repo_id, args.endpoint, args.token)
    if note:
        print(note, file=sys.stderr)  # a trust decision: shown with --quiet too
    if not args.quiet:
        print(f"load it with: winattn.load({repo_id!r}, vendored={str(out)!r})", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    import argparse

    from .cli_args import add_hub_args, add_repo_id, add_version_args

    p = subparsers.add_parser(
        "vendor",
        help="download the kernel at a pinned commit into a directory, with a lock, for offline loading",
        description=(
            "Resolve the version (or revision) to a commit once, download the variant that fits this machine "
            f"(or --variant / --all-variants) into LOCAL_DIR/<variant>/ and write LOCAL_DIR/{LOCK_FILENAME}. "
            "winattn.load(vendored=LOCAL_DIR) then loads it with no network access and no trust check: vendoring "
            "is where you decide to trust the publisher."
        ),
    )
    add_repo_id(p, legacy_flag=True)
    add_version_args(p)
    p.add_argument("--local-dir", type=Path, default=None, metavar="DIR",
                   help="directory to write the variants and the lock into (default: vendor)")
    p.add_argument("--out", dest="legacy_out", type=Path, default=None, help=argparse.SUPPRESS)  # older spelling
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--variant", action="append", metavar="NAME",
                     help="variant to vendor, e.g. torch-stable-abi210-cpu-x86_64-linux (repeatable; default: the "
                          "one this machine would load)")
    sel.add_argument("--all-variants", action="store_true", help="vendor every variant of the commit")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bars, print only the lock file line (and a note on an untrusted publisher)")
    add_hub_args(p)
    p.set_defaults(func=_run)
