"""`winattn verify` and `winattn info`: inspect kernel variants without importing them.

    winattn verify [REPO_ID|PATH] [--version 1 | --revision R] [--public-key K ...] [--require-signature]
    winattn info [REPO_ID|PATH] [--version 1 | --revision R] [--json]

`verify` prints every check of `winattn.verify.verify_variant` as PASS/FAIL/WARN/SKIP (plus a per-file digest table
and, when kernel-abi-check is installed, the abi3 check of the shared object) and exits 1 if any check fails. PATH is
a variant directory, a build directory (every variant in it), or a `winattn vendor` directory (checked against its
lock). REPO downloads, at the pinned commit, the variant this machine would load (or every variant with
`--all-variants`) into the cache; nothing is imported either way.

`info` shows which variant `winattn.load` would pick on this machine and why every other one was rejected (kernels'
`VariantAccepted` / `VariantRejected`), plus the publisher's trust status.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from .errors import KernelNotFoundError, NoVariantError
from .untrusted import shown
from .variant import DEFAULT_REPO, DEFAULT_VERSION, LOCK_FILENAME, METADATA_FILENAME

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def register(subparsers) -> None:
    from .cli_args import add_hub_args, add_repo_id, add_version_args

    p = subparsers.add_parser(
        "verify",
        help="check a kernel's files, digest and signature (and what it was signed for) without importing it",
        description=(
            "Check every variant of REPO_ID|PATH as winattn.load would, without importing anything: file set and "
            "sha256 digest, signature (with --public-key) and the repository, version and variant it was signed "
            "for, CUDA arch, python-depends and abi3. PATH is a variant, a build/ or a `winattn vendor` directory "
            "(checked against its lock); REPO_ID downloads the variant this machine would load (or every one, "
            "--all-variants) at the pinned commit into the cache. Exits 1 if any check fails. Use it instead of "
            "`kernels verify-signature`, which accepts only Sigstore certificates of Hugging Face's own CI."
        ),
    )
    add_repo_id(p, paths=True)
    add_version_args(p)
    p.add_argument("--public-key", dest="public_keys", action="append", default=[], metavar="KEY",
                   help="public key (PEM) whose signatures you trust; repeat for several")
    p.add_argument("--require-signature", action="store_true",
                   help="fail variants that carry no signature by one of the --public-key keys")
    p.add_argument("--all-variants", action="store_true",
                   help="with a REPO_ID: check every variant, not only the one this machine would load")
    p.add_argument("--no-files", dest="files_table", action="store_false", help="omit the per-file digest table")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bars; print only failed checks, each variant's verdict and the summary")
    _add_backend_arg(p)
    add_hub_args(p)
    p.set_defaults(func=_checked(run_verify))

    p = subparsers.add_parser(
        "info",
        help="which variant would load on this machine, and why the others would not",
        description=(
            "Show the commit a version resolves to, the variant winattn.load would pick on this machine, why "
            "every other variant does not fit, and whether the Hub trusts the publisher. Nothing is downloaded "
            "besides the file listing; exits 1 when no variant fits."
        ),
    )
    add_repo_id(p, paths=True)
    add_version_args(p)
    p.add_argument("--json", action="store_true",
                   help="print JSON: repo_id, version, revision, commit, system, selected, accepted, rejected, trust")
    _add_backend_arg(p)
    add_hub_args(p)
    p.set_defaults(func=_checked(run_info))


def _backend_name(value: str) -> str:
    """argparse type of --backend: a usage error (exit 2) for a name that is no backend."""
    from .resolve import check_backend_name

    try:
        return check_backend_name(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_backend_arg(p) -> None:
    p.add_argument("--backend", default=None, metavar="NAME", type=_backend_name,
                   help="what a machine with this backend would load instead of this one: cpu, cuda (the newest CUDA "
                        "of the variants), cu130, rocm64, metal, ...; nothing of it is imported")


def _checked(run):
    """`run` with REPO_ID|PATH checked first: neither an existing directory nor ORG/NAME is one line, not a
    traceback from the Hub client."""

    def command(args) -> int:
        from . import resolve

        resolve.PROBE_WITHOUT_TORCH_IMPORT = True  # nothing is imported: what kernels reads from torch, from its files
        args.target = args.repo_id
        if not Path(args.target).exists() and not _REPO_ID.match(args.target):
            raise KernelNotFoundError(f"{args.target}: no such directory, and not a Hub repo id (ORG/NAME, e.g. "
                                      f"{DEFAULT_REPO})")
        return run(args)

    return command


def _version(args):
    return args.version if args.version is not None or args.revision is not None else DEFAULT_VERSION


def _locate(repo_id: str, args, *, vendored=None):
    """What `winattn.load` would locate for these arguments (`winattn.sources`), trust reported, not enforced."""
    from . import sources

    return sources.locate(repo_id, version=_version(args), revision=args.revision, requested_version=args.version,
                          backend=args.backend, enforce_trust=False, vendored=vendored, endpoint=args.endpoint,
                          token=args.token)


def _trust_line(found) -> str:
    """The publisher's trust status, as `info` prints it."""
    from .cli_args import cli_words

    if found.source == "offline-cache":
        return found.trust and f"trusted ({found.trust.reason})" or "not checked (offline)"
    if found.trust_error:
        return cli_words(f"NOT trusted: {found.trust_error}")
    return f"trusted ({found.trust.reason})"


# ----------------------------------------------------------------------------------------------------------------------
# verify


def _file_table(report) -> list:
    """[(status, path)] comparing every file with metadata.json's digest, as the digest check found them (files the
    digest does not list are never read)."""
    return sorted(((status, rel) for rel, status in report.file_status.items()), key=lambda row: row[1])


def _print_report(title: str, report, files_table: bool, quiet: bool = False) -> None:
    """Every check (and the digest's file table); `quiet`: only failed and warned checks, and the verdict. Every name
    printed is escaped (`winattn.untrusted.shown`): a file named with ANSI escapes or bidi overrides cannot rewrite
    the terminal or reorder the report (check details are escaped by `winattn.verify.Check`)."""
    from .cli_args import cli_words

    if not quiet:
        print(shown(title))
    for check in report.checks:
        if quiet and check.status in ("pass", "skip"):
            continue
        print(f"  {cli_words(check.line())}")
        if check.name == "digest" and files_table and not quiet:
            for status, rel in _file_table(report):
                print(f"      {status:8} {shown(rel)}")
    print(f"  => {'OK' if report.ok else 'FAILED'}: {shown(report.variant)}")


def _verify_dir(path: Path, args) -> list:
    from .verify import verify_variant

    common = dict(public_keys=args.public_keys, require_signature=args.require_signature, bytecode="warn",
                  check_abi=True, use_receipt=False)
    if (path / METADATA_FILENAME).is_file():
        report = verify_variant(path, **common)
        _print_report(f"variant {path.name} ({path})", report, args.files_table, args.quiet)
        return [report]
    lock = None
    if (path / LOCK_FILENAME).is_file():
        from .sources import read_vendor_lock

        lock = read_vendor_lock(path)
        print(f"vendored {lock['repo_id']} v{lock['version']} @ {lock['commit']} ({path / LOCK_FILENAME})")
    base = path / "build" if (path / "build").is_dir() and lock is None else path
    from kernels.variants import get_variants_local

    names = sorted(v.variant_str for v in get_variants_local(base))
    if lock is not None:
        for name in sorted(set(lock["variants"]) - set(names)):
            print(f"  FAIL lock: variant {name} is in the lock but not in {path}")
    if not names:
        raise KernelNotFoundError(f"no variant directories in {base}")
    reports = []
    for name in names:
        entry = lock["variants"].get(name) if lock is not None else None
        if lock is not None and entry is None:
            print(f"  WARN lock: {name} is not in {LOCK_FILENAME} (winattn.load ignores it)")
            continue
        report = verify_variant(base / name, lock_entry=entry, **common)
        _print_report(f"variant {name} ({base / name})", report, args.files_table, args.quiet)
        reports.append(report)
    return reports


def _verify_repo(repo_id: str, args) -> list:
    from . import fetch, sources
    from .cli_args import cli_words
    from .verify import verify_variant

    found = _locate(repo_id, args)
    # (no variant for this machine: the commit's variants share one trust decision, its candidates carry it)
    judged = found if isinstance(found, sources.Candidate) else next(iter(found.candidates), None)
    if found.source == "hub" and judged is not None and (judged.trust_error or not args.quiet):
        print(f"trust: WARN {cli_words(judged.trust_error)}" if judged.trust_error
              else f"trust: PASS {judged.trust.reason}")
    if not args.quiet:
        print(found.what if isinstance(found, sources.Candidate) else found.message.splitlines()[0])
    if args.all_variants:
        targets = [found.for_variant(name) for name in found.listing.names]
    elif isinstance(found, sources.Candidate):
        targets = [found]
    else:
        targets = []
    if not targets:
        if isinstance(found, sources.NoVariant):
            raise NoVariantError(found.message)
        raise KernelNotFoundError(f"{repo_id}: no variants")
    fetched = []
    for target in targets:  # every download (and its progress bars) first, then the reports
        with fetch.variant_lock(target):
            fetched.append((target, fetch.install(target)))
    sys.stdout.flush()
    reports = []
    for target, local in fetched:
        report = verify_variant(local.path, public_keys=args.public_keys, require_signature=args.require_signature,
                                bytecode="warn", check_abi=True, use_receipt=False, lock_entry=local.lock_entry,
                                expect=local.expect)
        _print_report(f"variant {target.variant} ({local.path})", report, args.files_table, args.quiet)
        reports.append(report)
    return reports


def run_verify(args) -> int:
    if args.quiet:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    target = Path(args.target)
    if target.exists():
        reports = _verify_dir(target, args)
    elif _REPO_ID.match(args.target):
        reports = _verify_repo(args.target, args)
    else:
        raise KernelNotFoundError(f"{args.target}: no such directory, and not a Hub repo id (ORG/NAME)")
    failed = [r for r in reports if not r.ok]
    print(f"{len(reports) - len(failed)} of {len(reports)} variant(s) verified" +
          (f"; FAILED: {', '.join(r.variant for r in failed)}" if failed else ""))
    return 1 if failed or not reports else 0


# ----------------------------------------------------------------------------------------------------------------------
# info


def run_info(args) -> int:
    from . import resolve, sources

    target = Path(args.target)
    source = None
    ids = {"repo_id": None, "version": None, "revision": None, "commit": None}  # for --json
    if target.exists() and not (target / LOCK_FILENAME).is_file():
        # a build directory: what kernels' get_local_kernel would pick (winattn.load loads only vendored dirs)
        base = target / "build" if (target / "build").is_dir() else target
        what, trust, source = str(target), None, "directory"
        selection = resolve.select_local(base, args.backend)
        selected, accepted, rejected = selection.variant, selection.accepted, selection.rejected
        decisions, variants = selection.decisions, [d.variant for d in selection.decisions]
    else:
        if target.exists():
            lock = sources.read_checked_lock(target)
            found = _locate(lock["repo_id"], args, vendored=target)
        else:
            found = _locate(args.target, args)
        source, variants = found.source, found.listing.names
        ids.update(repo_id=found.repo_id, version=found.version, revision=found.revision, commit=found.commit)
        if isinstance(found, sources.NoVariant):
            what = found.message.splitlines()[0]
            selected, accepted, rejected, trust = None, [], list(found.listing.rejected), None
            decisions = found.selection.decisions
        else:
            what = found.what + found.where
            selected, accepted, rejected = found.variant, list(found.listing.accepted), list(found.listing.rejected)
            trust = _trust_line(found)
            decisions = accepted or rejected
    system = resolve.system_description(args.backend, variants)
    if args.json:
        print(json.dumps({
            "target": what, **ids, "system": system, "selected": selected, "accepted": accepted,
            "rejected": [{"variant": v, "reason": r} for v, r in rejected], "trust": trust,
            "source": source,
        }, indent=2))
        return 0 if selected else 1
    print(f"{what}")
    print(f"this machine: {system}" if args.backend is None else f"a {args.backend} machine: {system}")
    if selected:
        print(f"would load: {selected}")
    else:
        print("would load: nothing (no variant fits)")
    for name in accepted[1:]:
        print(f"  compatible, less preferred: {name}")
    for name, reason in rejected:
        print(f"  rejected: {name}: {reason}")
    if not decisions:
        print("  (no variants)")
    if trust is not None:
        print(f"publisher: {trust}")
    return 0 if selected else 1


def main(argv=None) -> int:  # pragma: no cover - convenience for `python -m winattn.inspect_cmd`
    parser = argparse.ArgumentParser(prog="winattn")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
