"""`winattn` command line: build, publish, serve, inspect and vendor the window-attention kernel.

Each subcommand lives beside the code it drives (`winattn.build`, `winattn.publish`, ...) and adds its own parser;
the arguments they share are spelled once in `winattn.cli_args`. Every expected failure (a `winattn.errors`
exception, an HTTP or connection error from the Hub, a bad repo id) prints one line naming the endpoint and the fix,
and exits 1; usage errors exit 2 (argparse). Anything else is a bug and shows its traceback.
"""

import argparse
import importlib
import sys

from .errors import WinattnError

# Modules that provide subcommands. Each defines `register(subparsers)` and sets `func` on its parser(s).
_COMMAND_MODULES = [
    "winattn.build",
    "winattn.publish",
    "winattn.vendor",
    "winattn.demo",
    "winattn.hub.cli",
    "winattn.inspect_cmd",
]


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("winattn")
    except PackageNotFoundError:
        return "0+unknown"


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="winattn",
        description="Build, publish, serve, inspect and vendor the window-attention kernel (a Hugging Face "
        "kernels repository). Run `winattn COMMAND --help` for each command.",
    )
    parser.add_argument("--version", action="version", version=f"winattn {_package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def describe_error(e: BaseException, args=None) -> str | None:
    """One line for an expected failure (what happened, where, what to do), or None for a bug."""
    from .cli_args import cli_words, endpoint_of

    if isinstance(e, WinattnError):
        return cli_words(str(e).strip()).replace("\n", "\n  ")
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from .publish import describe_hub_error, hub_call_errors

    endpoint = endpoint_of(args)
    repo = getattr(args, "repo_id", None) or "the repository"
    if isinstance(e, OfflineModeIsEnabled):
        return f"the Hub at {endpoint} is not contacted in offline mode (HF_HUB_OFFLINE is set); unset HF_HUB_OFFLINE"
    if isinstance(e, HFValidationError):
        return f"{str(e).splitlines()[0]} (a Hub repo id is ORG/NAME, e.g. winattn/window-attention)"
    if isinstance(e, GatedRepoError):
        return f"{repo} at {endpoint} is gated: request access, then pass --token"
    if isinstance(e, RepositoryNotFoundError):
        return (f"{repo} not found at {endpoint} (check the id and --endpoint/HF_ENDPOINT; a private repo needs "
                f"--token or HF_TOKEN)")
    if isinstance(e, RevisionNotFoundError):
        return f"revision not found in {repo} at {endpoint} (list versions with `winattn info {repo}`)"
    if isinstance(e, HfHubHTTPError):
        return cli_words(f"the Hub at {endpoint} answered {describe_hub_error(e)}")
    if isinstance(e, hub_call_errors()):  # connection refused, DNS, timeouts
        return cli_words(f"cannot reach the Hub at {endpoint}: {describe_hub_error(e)}; to use kernels already in "
                         "the local cache, set HF_HUB_OFFLINE=1")
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        # A local path the user named that cannot be used (`vendor --local-dir FILE`, an unwritable directory, a
        # missing key file): the environment, not a bug. It ended in a traceback; one line naming the path instead.
        from .untrusted import shown

        other = f" -> {shown(e.filename2)}" if e.filename2 is not None else ""
        return f"{shown(e.filename)}{other}: {e.strerror} (check the path and its permissions)"
    return None


def main(argv=None) -> int:
    from .cli_args import cli_log_words

    args = make_parser().parse_args(argv)
    try:
        with cli_log_words():
            rc = args.func(args)
    except KeyboardInterrupt:
        print(f"winattn {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `winattn info | head -1`: the reader left; stop quietly, as a SIGPIPE'd tool would
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # nothing more reaches the closed pipe, not even at interpreter exit
        return 141
    except Exception as e:  # noqa: BLE001  (mapped to one line below, or re-raised as a bug)
        message = describe_error(e, args)
        if message is None:
            raise
        print(f"winattn {args.command}: error: {message}", file=sys.stderr)
        return 1
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
