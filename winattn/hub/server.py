"""Embedded Hugging Face Hub-compatible HTTP server (stdlib `ThreadingHTTPServer`), for the unmodified
`huggingface_hub` and `kernels` clients.

    from winattn.hub import HubServer

    with HubServer(Path("hub-data"), tokens=["secret"], trusted_orgs=["myorg"]) as srv:
        api = HfApi(endpoint=srv.url, token="secret")   # or HF_ENDPOINT=srv.url before importing huggingface_hub

Policy: reads of public repos are anonymous; writes, and reads of private repos, need `Authorization: Bearer <token>`
with one of `tokens`. With no tokens the server is read-only. Files are always uploaded inline ("regular" preupload
mode) and served over plain HTTP: Xet and Git-LFS transfers are never offered. Routes: routes.py; storage:
storage.py. Bind to loopback unless you mean it: there is no TLS.
"""

from __future__ import annotations

import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from ..errors import HubProtocolError
from .routes import HubApp, Request, Response, error_response, json_response
from .storage import DEFAULT_LFS_THRESHOLD, HubError, Store

log = logging.getLogger("winattn.hub")

DEFAULT_MAX_COMMIT_BYTES = 2 * 1024**3
_DRAIN_LIMIT = 64 * 1024 * 1024  # unread request bytes we swallow to keep a connection alive after an early answer
_CHUNK = 1024 * 1024


class BodyReader:
    """Request body with Content-Length or chunked transfer encoding; every read is bounded by a byte limit."""

    def __init__(self, rfile, headers):
        self._rfile = rfile
        self.chunked = "chunked" in (headers.get("Transfer-Encoding") or "").lower()
        self.length = None
        if not self.chunked:
            raw = headers.get("Content-Length")
            try:
                self.length = int(raw) if raw is not None else 0
                if self.length < 0:
                    raise ValueError
            except ValueError:
                self.length = 0
                self.eof = True
                raise HubError(400, "BadRequest", f"Invalid Content-Length {raw!r}") from None
        self._remaining = self.length
        self._chunk_left = 0
        self._buf = bytearray()
        self.consumed = 0
        self.eof = not self.chunked and self.length == 0

    def _check_declared(self, limit: int) -> None:
        if self.length is not None and self.length > limit:
            raise HubError(413, "PayloadTooLarge", f"Request body of {self.length} bytes exceeds the limit of {limit}")

    def _raw(self, n: int, limit: int) -> bytes:
        """Up to n body bytes from the wire (b"" at the end)."""
        if self.eof:
            return b""
        if not self.chunked:
            data = self._rfile.read(min(n, self._remaining))
            if not data:
                raise HubError(400, "BadRequest", "Request body ended before Content-Length")
            self._remaining -= len(data)
            self.eof = self._remaining == 0
        else:
            if self._chunk_left == 0:
                line = self._rfile.readline(1024)
                try:
                    self._chunk_left = int(line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise HubError(400, "BadRequest", "Malformed chunked encoding") from None
                if self._chunk_left == 0:
                    while self._rfile.readline(1024).strip():  # trailers
                        pass
                    self.eof = True
                    return b""
            data = self._rfile.read(min(n, self._chunk_left))
            if not data:
                raise HubError(400, "BadRequest", "Chunked request body ended early")
            self._chunk_left -= len(data)
            if self._chunk_left == 0:
                self._rfile.readline(16)  # CRLF after the chunk
        self.consumed += len(data)
        if self.consumed > limit:
            raise HubError(413, "PayloadTooLarge", f"Request body exceeds the limit of {limit} bytes")
        return data

    def read_all(self, limit: int) -> bytes:
        self._check_declared(limit)
        out = bytearray(self._buf)
        self._buf.clear()
        while chunk := self._raw(_CHUNK, limit):
            out += chunk
        return bytes(out)

    def readline(self, limit: int) -> bytes:
        start = 0
        while True:
            nl = self._buf.find(b"\n", start)
            if nl >= 0:
                line = bytes(self._buf[: nl + 1])
                del self._buf[: nl + 1]
                return line
            start = len(self._buf)
            chunk = self._raw(_CHUNK, limit)
            if not chunk:
                line = bytes(self._buf)
                self._buf.clear()
                return line
            self._buf += chunk

    def lines(self, limit: int):
        self._check_declared(limit)
        while line := self.readline(limit):
            yield line

    def drain(self, max_bytes: int) -> bool:
        """Discard the rest of the body; False if more than max_bytes remain or it is malformed."""
        if self.length is not None and self._remaining > max_bytes:
            return False
        try:
            while self._raw(_CHUNK, self.consumed + max_bytes):
                pass
        except (HubError, OSError):
            return False
        return True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "winattn-hub/1"
    timeout = 300  # seconds of silence before an idle keep-alive connection is dropped

    def setup(self):
        super().setup()
        self.server.track(self.connection, add=True)

    def finish(self):
        try:
            super().finish()
        finally:
            self.server.track(self.connection, add=False)

    def log_message(self, format, *args):
        log.info("%s %s", self.address_string(), format % args)

    def do_GET(self):
        self._dispatch()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_GET

    def _dispatch(self) -> None:
        body = None
        try:
            body = BodyReader(self.rfile, self.headers)
            split = urlsplit(self.path)
            raw = split.path.split("/")[1:]
            if raw and raw[-1] == "" and len(raw) > 1:
                raw.pop()
            req = Request(
                method=self.command,
                segments=[unquote(s, errors="strict") for s in raw],
                query=parse_qs(split.query, keep_blank_values=True),
                headers=self.headers,
                body=body,
                base_url=f"http://{self.headers.get('Host') or self.server.authority}",
            )
            resp = self.server.app.handle(req)
        except HubError as e:
            resp = error_response(e)
        except UnicodeDecodeError:
            resp = error_response(HubError(400, "BadRequest", "URL is not valid percent-encoded UTF-8"))
        except (ConnectionError, TimeoutError):
            self.close_connection = True
            return
        except Exception:
            log.exception("internal error on %s %s", self.command, self.path)
            resp = json_response({"error": "Internal server error (see the server log)"}, 500)
            resp.headers["X-Error-Code"] = "InternalError"
        if body is None or not body.drain(_DRAIN_LIMIT):
            self.close_connection = True
        self._send(resp)

    def _send(self, resp: Response) -> None:
        try:
            self.send_response(resp.status)
            for k, v in resp.headers.items():
                self.send_header(k, v)
            length = resp.length if resp.file is not None else len(resp.body)
            self.send_header("Content-Length", str(length))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command == "HEAD":
                return
            if resp.file is None:
                self.wfile.write(resp.body)
                return
            with open(resp.file, "rb") as f:
                f.seek(resp.offset)
                left = resp.length
                while left > 0:
                    chunk = f.read(min(_CHUNK, left))
                    if not chunk:
                        raise OSError(f"blob {resp.file} is shorter than recorded")
                    self.wfile.write(chunk)
                    left -= len(chunk)
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except OSError:
            log.exception("failed to send %s", self.path)
            self.close_connection = True


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # snapshot_download opens 8 connections at once; a full backlog costs a 1 s SYN retry

    def __init__(self, address, app: HubApp):
        self.app = app
        self._conns: set = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, _Handler)
        host, port = self.server_address[:2]
        self.authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def track(self, conn, *, add: bool) -> None:
        with self._conns_lock:
            (self._conns.add if add else self._conns.discard)(conn)

    def close_connections(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _HTTPServerV6(_HTTPServer):
    address_family = socket.AF_INET6


class HubServer:
    """A Hub-compatible server over a store directory, run on a background thread.

    Args:
        root: store directory (created if missing; must be empty or an existing store).
        host, port: where to listen; port 0 picks a free port (read it back from `url`).
        tokens: bearer tokens accepted for writes and private reads; none makes the server read-only.
        trusted_orgs: namespaces whose org overview says `trustedKernelPublisher: true` (kernels' trust check).
        max_commit_bytes: largest commit request body accepted (413 beyond).
        lfs_threshold: files at least this large are presented as LFS files (sha256 ETag), like on the Hub.
    """

    def __init__(
        self,
        root: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        tokens=(),
        trusted_orgs=(),
        *,
        max_commit_bytes: int = DEFAULT_MAX_COMMIT_BYTES,
        lfs_threshold: int = DEFAULT_LFS_THRESHOLD,
    ):
        self.root = Path(root)
        self.host = host
        self.port = port
        self.tokens = [tokens] if isinstance(tokens, str) else list(tokens)
        self.trusted_orgs = [trusted_orgs] if isinstance(trusted_orgs, str) else list(trusted_orgs)
        self.max_commit_bytes = max_commit_bytes
        self.lfs_threshold = lfs_threshold
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._store: Store | None = None

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise HubProtocolError("HubServer.url is only known once the server is started")
        host = self._httpd.server_address[0]
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1" if host == "0.0.0.0" else "::1"
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self._httpd.server_address[1]}"

    def start(self) -> HubServer:
        if self._httpd is not None:
            raise HubProtocolError("HubServer is already running")
        try:
            self._store = Store(self.root, lfs_threshold=self.lfs_threshold)
        except (OSError, ValueError) as e:
            raise HubProtocolError(f"cannot use hub root {self.root}: {e}") from e
        app = HubApp(
            self._store,
            tokens=self.tokens,
            trusted_orgs=self.trusted_orgs,
            max_commit_bytes=self.max_commit_bytes,
        )
        cls = _HTTPServerV6 if ":" in self.host else _HTTPServer
        try:
            self._httpd = cls((self.host, self.port), app)
        except OSError as e:
            self._store.close()
            self._store = None
            raise HubProtocolError(f"cannot listen on {self.host}:{self.port}: {e}") from e
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="winattn-hub", daemon=True
        )
        self._thread.start()
        log.info("serving %s at %s", self.root, self.url)
        return self

    def stop(self) -> None:
        """Stop accepting, cut open connections, release the port. Idempotent."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.close_connections()
        self._httpd.server_close()
        self._thread.join(timeout=10)
        self._store.close()
        self._httpd = self._thread = self._store = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
