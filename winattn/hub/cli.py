"""`winattn hub serve`: run the embedded Hub in the foreground until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from pathlib import Path

DEFAULT_ROOT = Path(os.environ.get("WINATTN_HUB_ROOT", "~/.cache/winattn/hub")).expanduser()


def register(subparsers) -> None:
    hub = subparsers.add_parser(
        "hub",
        help="run a local Hugging Face Hub-compatible server (for the demo, tests and air-gapped mirrors)",
        description="A local server that speaks the Hub API huggingface_hub and kernels use. Run "
        "`winattn hub serve --help` for its options.",
    )
    hub_sub = hub.add_subparsers(dest="hub_command", metavar="COMMAND", required=True)
    serve = hub_sub.add_parser(
        "serve",
        help="serve a Hub-compatible API over a local store directory",
        description="Serve the Hub HTTP API used by huggingface_hub and kernels over a local store directory. "
        "Reads of public repos are anonymous; writes and private repos need one of the --token values "
        "(without any, the server is read-only). A request with a token the server does not know is refused "
        "(401), as the Hub does.",
    )
    serve.add_argument(
        "--root",
        type=Path,
        default=DEFAULT_ROOT,
        help=f"store directory (default: $WINATTN_HUB_ROOT or {DEFAULT_ROOT})",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1; there is no TLS)")
    serve.add_argument("--port", type=_port, default=8000, help="port (default: 8000; 0 picks a free one)")
    serve.add_argument(
        "--token", action="append", default=[], metavar="T", help="accepted bearer token for writes (repeatable)"
    )
    serve.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help="read more tokens from FILE, one per line (keeps them out of the process list); if FILE does not "
        "exist, a new random token is written to it (mode 0600) and its path printed",
    )
    serve.add_argument(
        "--trusted-org",
        action="append",
        default=[],
        metavar="ORG",
        help="namespace reported as a trusted kernel publisher (repeatable)",
    )
    serve.add_argument(
        "--max-commit-mb", type=int, default=2048, help="largest commit request body in MiB (default: 2048)"
    )
    serve.add_argument("--quiet", action="store_true", help="do not log each request")
    serve.set_defaults(func=serve_command)


def _port(value: str) -> int:
    """argparse type of --port: 0..65535 (a usage error otherwise, not a traceback from bind)."""
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a TCP port (0 to 65535; 0 picks a free one)")
    return port


def create_token_file(path: Path) -> Path | None:
    """Write a new random token to `path` if it does not exist (mode 0600, created exclusively so that an existing
    file, or one made concurrently, is never overwritten). Returns the path when it wrote one, else None."""
    import secrets

    from ..errors import HubProtocolError

    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return None
    except OSError as e:
        raise HubProtocolError(f"cannot create --token-file {path}: {e}") from e
    with os.fdopen(fd, "w") as f:
        f.write(f"hf_winattn_{secrets.token_hex(20)}\n")
    return path.resolve()


def serve_command(args: argparse.Namespace) -> int:
    from ..errors import HubProtocolError
    from .server import HubServer

    tokens = list(args.token)
    created = None
    if args.token_file is not None:
        created = create_token_file(args.token_file)
        try:
            tokens += [t.strip() for t in args.token_file.read_text().splitlines() if t.strip()]
        except OSError as e:
            raise HubProtocolError(f"cannot read --token-file {args.token_file}: {e}") from e
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(asctime)s %(message)s")
    server = HubServer(
        args.root,
        host=args.host,
        port=args.port,
        tokens=tokens,
        trusted_orgs=args.trusted_org,
        max_commit_bytes=args.max_commit_mb * 1024 * 1024,
    )
    server.start()
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    lines = [
        f"winattn hub: serving {server.root.resolve()} at {server.url}",
        "Point clients at it:",
        f"  export HF_ENDPOINT={server.url}",
    ]
    if created is not None:
        lines.append(f"Wrote a new write token to {created} (mode 0600); use it for uploads and private repos:")
        lines.append(f'  export HF_TOKEN="$(cat {created})"')
    elif args.token_file is not None:
        lines.append(f'  export HF_TOKEN="$(head -n1 {args.token_file})"   # for uploads and private repos')
    elif tokens:
        lines.append("  export HF_TOKEN=<one of the --token values>   # for uploads and private repos")
    else:
        lines.append("  (no --token given: the server is read-only)")
    if args.trusted_org:
        lines.append(f"Trusted kernel publishers: {', '.join(args.trusted_org)}")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        lines.append(f"Warning: listening on {args.host} without TLS; tokens travel in clear text.")
    lines.append("Press Ctrl-C to stop.")
    print("\n".join(lines), flush=True)
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stop()
        print("winattn hub: stopped", flush=True)
    return 0
