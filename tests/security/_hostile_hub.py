"""A Hub that lies, for the loader's security tests (issue 27): a small HTTP proxy on 127.0.0.1 in front of a real
embedded Hub. It forwards every request unchanged and rewrites the answers a test asks it to, the way a malicious Hub
or a man in the middle of a plain-HTTP `HF_ENDPOINT` could: path-like commit ids, file names and ETags, sizes that
disagree with the bytes, redirects elsewhere, bodies longer than declared or trickled slowly.

    with HostileHub(hub.url) as evil:
        evil.lie(lambda ans: ans.set_header("ETag", '"../../x"') if ans.path.endswith("/metadata.json") else None)
        winattn.load(REPO, endpoint=evil.url)

A lie is a function of an `Answer` (method, path, status, headers, body) that changes it in place. Everything is
bounded in time: every socket has a timeout, a trickled body stops after `Answer.trickle`'s seconds, and `stop()`
cuts every connection. `requests` records (method, path) of what reached the proxy.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP = {"connection", "keep-alive", "transfer-encoding"}


class _Served:
    """A ThreadingHTTPServer on 127.0.0.1 in a daemon thread, for the two servers below: `_serve(handler)` starts it,
    leaving the `with` block stops it."""

    def _serve(self, handler) -> None:
        class Server(ThreadingHTTPServer):
            daemon_threads = True
            allow_reuse_address = True

            def handle_error(self, request, client_address):
                # A client hanging up mid-answer is what the loader must do to a lying server, so it is no error
                # here. Printing its traceback was noise, and on CPython 3.11 the printer's `ast.parse` raced the
                # test thread's own (SystemError "AST constructor recursion depth mismatch", gh-106905).
                if not isinstance(sys.exc_info()[1], ConnectionError):
                    super().handle_error(request, client_address)

        self._server = Server(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@dataclass
class Answer:
    """One answer on its way back; a lie edits it. `close_delimited`: send the body without Content-Length and close
    the connection (so it can be longer than any header says). `trickle`: (bytes per step, seconds between steps,
    seconds at most) to send the body slowly."""

    method: str
    path: str
    status: int
    headers: list
    body: bytes
    close_delimited: bool = False
    trickle: tuple | None = None

    def header(self, name: str):
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    def set_header(self, name: str, value: str) -> None:
        self.headers = [(k, v) for k, v in self.headers if k.lower() != name.lower()] + [(name, value)]

    def json(self):
        return json.loads(self.body)

    def set_json(self, obj) -> None:
        self.body = json.dumps(obj).encode()


@dataclass
class HostileHub(_Served):
    upstream: str
    lies: list = field(default_factory=list)
    requests: list = field(default_factory=list)
    rewrites: list = field(default_factory=list)

    def lie(self, fn) -> None:
        self.lies.append(fn)

    def rewrite_request(self, fn) -> None:
        """`fn(path) -> path` applied to each request's path before it is forwarded (e.g. to serve a forged commit id
        as if it were the real one, so that the client goes on with it)."""
        self.rewrites.append(fn)

    def __enter__(self) -> "HostileHub":
        hub = self
        up = urlsplit(self.upstream)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 30

            def log_message(self, *args):
                pass

            def do_GET(self):
                hub.requests.append((self.command, self.path))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection(up.hostname, up.port, timeout=30)
                path = self.path
                for rewrite in hub.rewrites:
                    path = rewrite(path)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP and k.lower() != "host"}
                    conn.request(self.command, path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    answer = Answer(self.command, self.path, resp.status,
                                    [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP], data)
                finally:
                    conn.close()
                for lie in list(hub.lies):
                    lie(answer)
                self._answer(answer)

            do_HEAD = do_POST = do_PUT = do_DELETE = do_GET

            def _answer(self, a: Answer) -> None:
                # HEAD keeps the size the Hub (or the lie) declared; a GET's body is framed by its length, unless the
                # lie asked for a close-delimited body
                headers = a.headers if self.command == "HEAD" else \
                    [(k, v) for k, v in a.headers if k.lower() != "content-length"]
                self.send_response(a.status)
                for k, v in headers:
                    self.send_header(k, v)
                if a.close_delimited or a.trickle:
                    self.close_connection = True
                    self.send_header("Connection", "close")
                if self.command != "HEAD" and not a.close_delimited:
                    self.send_header("Content-Length", str(len(a.body)))
                self.end_headers()
                if self.command == "HEAD":
                    return
                if not a.trickle:
                    self.wfile.write(a.body)
                    return
                step, pause, limit = a.trickle
                deadline = time.monotonic() + limit
                for i in range(0, len(a.body), step):
                    if time.monotonic() > deadline:
                        break
                    self.wfile.write(a.body[i:i + step])
                    self.wfile.flush()
                    time.sleep(pause)

        self._serve(Handler)
        return self


@dataclass
class Recorder(_Served):
    """Another server on 127.0.0.1 (where a lying Hub redirects): records every request it gets, answers 200."""

    requests: list = field(default_factory=list)

    def __enter__(self) -> "Recorder":
        rec = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 10

            def log_message(self, *args):
                pass

            def do_GET(self):
                rec.requests.append((self.command, self.path, self.headers.get("Authorization")))
                self.send_response(200)
                self.send_header("Content-Length", "4")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(b"evil")

            do_HEAD = do_GET

        self._serve(Handler)
        return self


def new_paths(before: set, root) -> list:
    """Paths under `root` (links not followed) that are not in `before`."""
    return sorted(all_paths(root) - before)


def all_paths(root) -> set:
    import os

    out = set()
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            out.add(os.path.join(top, name))
    return out
