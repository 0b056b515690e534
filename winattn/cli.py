"""`winattn` command line: one subcommand per tooling module, each registering itself with `register(subparsers)`.

Errors derived from WinattnError print one line and exit 1; anything else is a bug and shows its traceback.
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


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="winattn", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    try:
        rc = args.func(args)
    except WinattnError as e:
        print(f"winattn {args.command}: error: {e}", file=sys.stderr)
        return 1
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
