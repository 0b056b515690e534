"""`winattn hub serve`: prints where it listens and how to point clients at it, stops cleanly on SIGTERM."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys

from winattn.hub.cli import register

from .conftest import raw_request

# Runs only the hub command, so that the test does not depend on the other subcommand modules.
_RUN = """
import argparse, sys
from winattn.hub.cli import register
parser = argparse.ArgumentParser(prog="winattn")
register(parser.add_subparsers(dest="command", required=True))
args = parser.parse_args(sys.argv[1:])
sys.exit(args.func(args))
"""


def test_parser_options():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["hub", "serve", "--root", "r", "--port", "0", "--token", "a", "--token", "b", "--trusted-org", "o"]
    )
    assert (args.port, args.token, args.trusted_org, args.host) == (0, ["a", "b"], ["o"], "127.0.0.1")
    assert callable(args.func)


def test_serve_until_sigterm(tmp_path):
    cmd = [sys.executable, "-c", _RUN, "hub", "serve", "--root", str(tmp_path / "store"), "--port", "0"]
    (tmp_path / "tokens").write_text("file-token\n")
    cmd += ["--token-file", str(tmp_path / "tokens"), "--trusted-org", "myorg", "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith("winattn hub: serving ") and " at http://127.0.0.1:" in first
        url = first.rsplit(" at ", 1)[1].strip()
        out = [proc.stdout.readline() for _ in range(3)]
        assert f"export HF_ENDPOINT={url}\n" in [line.strip() + "\n" for line in out]
        status, _, body = raw_request(url, "GET", "/api/organizations/myorg/overview")
        assert status == 200 and json.loads(body)["trustedKernelPublisher"] is True
        status, _, body = raw_request(url, "GET", "/api/whoami-v2", headers={"Authorization": "Bearer file-token"})
        assert status == 200 and json.loads(body)["name"] == "local"
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0 and "stopped" in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
