"""The arguments every `winattn` subcommand shares, spelled once so that they read the same everywhere.

The words follow `hf` (huggingface_hub's CLI) and `kernels`: a positional `REPO_ID`, `--revision`, `--local-dir`,
`--token`, `--endpoint`; `--version N` is kernels' major version (branch `v<N>`). The convention is checked by
tests/docs/test_cli_convention.py over every subcommand's `--help`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re

DEFAULT_REPO_ID = "winattn/window-attention"
DEFAULT_VERSION = 1
REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def repo_id_arg(value: str) -> str:
    """argparse type for a Hub repo id: a usage error (exit 2) for anything that is not ORG/NAME."""
    if not REPO_ID_RE.match(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a Hub repo id (expected ORG/NAME, e.g. {DEFAULT_REPO_ID})")
    return value


def add_repo_id(p: argparse.ArgumentParser, *, paths: bool = False, legacy_flag: bool = False) -> None:
    """Positional REPO_ID (default winattn/window-attention); `paths=True` also accepts a local directory."""
    if paths:
        p.add_argument("repo_id", metavar="REPO_ID|PATH", nargs="?", default=DEFAULT_REPO_ID,
                       help=f"Hub repo id (default: {DEFAULT_REPO_ID}), or a build/, variant or vendored directory")
    else:
        p.add_argument("repo_id", metavar="REPO_ID", nargs="?", default=None, type=repo_id_arg,
                       help=f"Hub repo id ORG/NAME (default: {DEFAULT_REPO_ID})")
    if legacy_flag:
        # Older spelling (`--repo ORG/NAME`), kept so that existing scripts keep working; not shown in --help.
        p.add_argument("--repo", dest="legacy_repo", type=repo_id_arg, default=None, help=argparse.SUPPRESS)


def resolved_repo_id(args: argparse.Namespace) -> str:
    """REPO_ID from the positional, else the hidden `--repo`, else the default; both given and different: usage."""
    positional, legacy = getattr(args, "repo_id", None), getattr(args, "legacy_repo", None)
    if positional and legacy and positional != legacy:
        raise SystemExit(f"winattn: error: REPO_ID {positional} and --repo {legacy} disagree; give one")
    return positional or legacy or DEFAULT_REPO_ID


def version_arg(value: str) -> int:
    """argparse type of --version: a non-negative integer. `--version -1` reached `resolve.check_version_args` and
    ended in a ValueError traceback (the CLI maps only winattn's and the Hub client's errors); a usage error here."""
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a kernel major version (a non-negative integer N, "
                                         "branch v<N>)")
    return number


def revision_arg(value: str) -> str:
    """argparse type of --revision: a branch, tag or 40-hex commit (`winattn.untrusted.is_revision`, the rule
    `resolve.check_version_args` applies). `--revision a..b` ended in a ValueError traceback; a usage error here."""
    from .untrusted import is_revision, shown

    if not is_revision(value):
        raise argparse.ArgumentTypeError(f"{shown(repr(value))} is not a branch, tag or 40-hex commit id (a git ref "
                                         "name: no '..', no component starting with '.', no control character or "
                                         "space)")
    return value


def add_version_args(p: argparse.ArgumentParser) -> None:
    """`--version N` | `--revision R`, mutually exclusive, default version 1 (as `kernels.get_kernel` docs use)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--version", type=version_arg, default=None, metavar="N",
                   help=f"kernel major version, i.e. branch v<N> (default: {DEFAULT_VERSION})")
    g.add_argument("--revision", type=revision_arg, default=None, metavar="REV",
                   help="branch, tag or commit sha to use instead of --version")


def version_and_revision(args: argparse.Namespace) -> tuple[int | None, str | None]:
    if args.revision is not None:
        return None, args.revision
    return (args.version if args.version is not None else DEFAULT_VERSION), None


def add_hub_args(p: argparse.ArgumentParser, *, write: bool = False) -> None:
    """`--endpoint` and `--token`, defaulting to huggingface_hub's HF_ENDPOINT / HF_TOKEN (read when run)."""
    p.add_argument("--endpoint", default=None, metavar="URL",
                   help="Hub URL (default: $HF_ENDPOINT, else https://huggingface.co)")
    p.add_argument("--token", default=None, metavar="TOKEN",
                   help="Hub token" + (" with write access" if write else "") +
                        " (default: $HF_TOKEN or the token saved by `hf auth login`)")


def endpoint_of(args: argparse.Namespace | None) -> str:
    """The endpoint a command talks to, for error messages."""
    endpoint = getattr(args, "endpoint", None) if args is not None else None
    if endpoint:
        return endpoint
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT") or constants.ENDPOINT


# Messages shared with `winattn.load` name its keyword arguments; on the command line they read as the flags a user
# types (`winattn verify --require-signature`), never as Python. Longest phrases first.
_CLI_WORDS = (
    ("require_signature=True but no trusted public keys were given",
     "--require-signature was given but no --public-key"),
    ("because require_signature=False", "because --require-signature was not given"),
    ("require_signature=True", "--require-signature"),
    ("public_keys=[...]", "--public-key KEY"),
    ("pass revision=<commit>", "pass --revision COMMIT"),
    ("or set HF_ENDPOINT to one", "or point --endpoint / HF_ENDPOINT at one"),
    ("set HF_TOKEN to a token this Hub accepts", "pass --token or set HF_TOKEN to a token this Hub accepts"),
)


def cli_words(text: str) -> str:
    """`text` with the Python spellings of options replaced by the command-line ones, and the loader's trust hint
    (set `trust_remote_code`) by what it means for a command that only reports trust."""
    from .trust import OPT_IN_HINT

    text = text.replace(OPT_IN_HINT, "winattn.load refuses it unless the caller opts in to untrusted publishers.")
    for python, cli in _CLI_WORDS:
        text = text.replace(python, cli)
    return text


@contextlib.contextmanager
def cli_log_words():
    """While a command runs, winattn's log records (of every `winattn.*` logger) read in `cli_words`."""
    import logging

    previous = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        if record.name == "winattn" or record.name.startswith("winattn."):
            message = record.getMessage()
            words = cli_words(message)
            if words != message:
                record.msg, record.args = words, None
        return record

    logging.setLogRecordFactory(factory)
    try:
        yield
    finally:
        logging.setLogRecordFactory(previous)
