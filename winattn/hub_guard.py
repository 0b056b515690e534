"""What a Hub sends while winattn downloads from it, checked on the wire, before huggingface_hub reads it.

huggingface_hub builds cache paths from a Hub's response headers (`X-Repo-Commit` names a snapshot directory and a
`.no_exist/` one, `ETag` / `X-Linked-Etag` a blob file), follows redirects wherever they point, and reads a body for
as long as it lasts. A hostile Hub, or anyone in the path of a plain-HTTP endpoint, could so make a download write a
file of its choosing, with content of its choosing, outside the cache before anything was verified (a `.pth` in
site-packages runs at the next Python start). While `guarded(...)` is active, every response of that endpoint's
origin to huggingface_hub's shared HTTP client is checked first (`winattn.untrusted` rules):

- `X-Repo-Commit`: the commit being downloaded (40 lowercase hex);
- `ETag`, `X-Linked-Etag` of a file (`/resolve/`): 40 or 64 lowercase hex (the blob names of the HF cache);
- `Content-Length`, `X-Linked-Size`: a decimal size; for a file of the listing, the size the listing declared;
- a redirect: to the same origin, or to https (the real Hub's CDN); never to plain HTTP elsewhere, never a downgrade;
  the target of a listed file's redirect is held to that file's size;
- a body: cut once it is longer than declared (for a listed file, its listed size; else `MAX_OTHER_BYTES`) or when
  it delivers less than `MIN_BYTES_PER_WINDOW` in `WINDOW_SECONDS` (a body trickled to hold the load forever); a JSON
  answer (refs, listings, repository info) nested deeper than `winattn.bounded_json.MAX_DEPTH` is refused before
  huggingface_hub parses it (`RecursionError` otherwise).

A refused header or size is a `RemoteValueError`, a body too slow a `DownloadError`; huggingface_hub does not retry
either. The hook sits on huggingface_hub's shared client (`get_session()`), re-added if the session was recreated,
and does nothing for other origins or when no guarded call runs, so other users of huggingface_hub in the process
see no change. Time before the first byte of an answer is huggingface_hub's own timeouts (HF_HUB_ETAG_TIMEOUT,
HF_HUB_DOWNLOAD_TIMEOUT) to bound.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Optional
from urllib.parse import urljoin, urlsplit

from . import bounded_json, untrusted
from .errors import DownloadError
from .hub_errors import _httpx

MAX_OTHER_BYTES = 64 << 20  # any other answer of a guarded origin (listings, errors)
WINDOW_SECONDS = 30.0
MIN_BYTES_PER_WINDOW = 32 << 10  # 32 KiB per 30 s: about 1 KiB/s

_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> tuple:
    parts = urlsplit(str(url))
    return (parts.scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(parts.scheme, 0))


@dataclass
class _Guard:
    """One guarded call: the origin it talks to, the commit it downloads, and the sizes of the files it lists."""

    origin: tuple
    commit: Optional[str]
    sizes: dict = field(default_factory=dict)  # absolute URL -> declared size


_ACTIVE: list = []
_LOCK = threading.Lock()


def normalized(url: str) -> str:
    """`url` as the HTTP client spells it in `response.request.url`."""
    return str(_httpx().URL(url))


def _guards_for(url: str) -> list:
    o = origin(url)
    with _LOCK:
        return [g for g in _ACTIVE if g.origin == o or str(url) in g.sizes]


@contextlib.contextmanager
def guarded(endpoint: Optional[str], *, commit: Optional[str] = None, sizes: Optional[dict] = None):
    """Check every answer of `endpoint`'s origin (and of the redirect targets of `sizes`' URLs) while the block runs.

    Args:
        endpoint: the Hub's URL (None: huggingface_hub's default endpoint).
        commit: the commit being downloaded (every `X-Repo-Commit` must name it).
        sizes: {file URL (as `huggingface_hub.hf_hub_url` builds it): size the listing declared}.
    """
    _install()
    if endpoint is None:
        from huggingface_hub import constants

        endpoint = constants.ENDPOINT
    guard = _Guard(origin(endpoint), commit, {normalized(u): n for u, n in (sizes or {}).items()})
    with _LOCK:
        _ACTIVE.append(guard)
    try:
        yield guard
    finally:
        with _LOCK:
            _ACTIVE.remove(guard)


def _install() -> None:
    """Add the response hook to huggingface_hub's shared client (again, if the session was recreated)."""
    from huggingface_hub.utils import get_session

    session = get_session()
    hooks = session.event_hooks
    if _check_response not in hooks.get("response", []):
        session.event_hooks = {**hooks, "response": list(hooks.get("response", [])) + [_check_response]}


def _check_response(response) -> None:
    url = str(response.request.url)
    guards = _guards_for(url)
    if not guards:
        return
    source = f"the Hub's answer to {response.request.method} {untrusted.shown(url)}"
    headers = response.headers
    # held to the pinned commit(s) only when every guard of this origin pins one (a concurrent listing pins none)
    commits = {g.commit for g in guards} if all(g.commit for g in guards) else set()
    if "X-Repo-Commit" in headers:
        got = untrusted.commit_id(headers["X-Repo-Commit"], source=source + " (X-Repo-Commit)")
        if commits and got not in commits:
            untrusted.refuse("the commit", got, source + " (X-Repo-Commit)",
                             f"this download is of commit {', '.join(sorted(commits))}")
    if "/resolve/" in urlsplit(url).path:  # a file's answer: huggingface_hub names the blob after its ETag
        for name in ("ETag", "X-Linked-Etag"):
            if name in headers:
                untrusted.etag(headers[name].lstrip("W/").strip('"'), source=f"{source} ({name})")
    # a listed file's size binds the file's own answers (2xx), not an error page or a redirect
    declared = next((g.sizes[url] for g in guards if url in g.sizes), None) if response.is_success else None
    limit = declared if declared is not None else MAX_OTHER_BYTES
    size_header = "X-Linked-Size" if "X-Linked-Size" in headers else \
        "Content-Length" if "Content-Length" in headers and not response.is_redirect else None
    if size_header is not None:
        got = untrusted.size(headers[size_header], source=f"{source} ({size_header})")
        partial = response.status_code == 206 and size_header == "Content-Length"  # a resumed download's range
        if declared is not None and (got > declared if partial else got != declared):
            untrusted.refuse("a size", got, f"{source} ({size_header})",
                             f"the file listing declared {declared} bytes for this file")
        if got > limit:
            untrusted.refuse("a size", got, f"{source} ({size_header})", f"at most {limit} bytes are accepted here")
    if response.has_redirect_location:
        _check_redirect(url, urljoin(url, headers["Location"]), source, declared, guards)
    if response.request.method != "HEAD":
        is_json = "json" in headers.get("Content-Type", "").lower()
        response.stream = _Bounded(response.stream, limit, source, is_json)


def _check_redirect(url: str, target: str, source: str, declared: Optional[int], guards: list) -> None:
    if origin(target) != origin(url):
        if urlsplit(target).scheme != "https":
            untrusted.refuse("a redirect", target, source, "a redirect leaves the Hub only for https, never for "
                             "plain HTTP elsewhere")
        if declared is not None:
            with _LOCK:
                for g in guards:
                    g.sizes[normalized(target)] = declared  # the target serves the listed file: same size


class _Bounded(_httpx().SyncByteStream):
    """A response body that stops past `limit` bytes or when it delivers too little per time window; a JSON body is
    checked for its nesting depth once complete, before huggingface_hub parses it (`winattn.bounded_json`)."""

    def __init__(self, stream, limit: int, source: str, is_json: bool = False):
        self._stream = stream
        self._limit = limit
        self._source = source
        self._json = bytearray() if is_json else None

    def __iter__(self):
        for chunk in self._bounded():
            if self._json is not None:
                self._json += chunk
            else:
                yield chunk
        if self._json is not None:
            try:
                bounded_json.check_depth(self._json.decode("utf-8", "replace"))
            except bounded_json.JSONLimitError as e:
                untrusted.refuse("JSON", f"{len(self._json)} bytes", self._source, str(e))
            yield bytes(self._json)

    def _bounded(self):
        total = 0
        window_start, window_bytes = time.monotonic(), 0
        for chunk in self._stream:
            total += len(chunk)
            if total > self._limit:
                untrusted.refuse("a body", f"{total}+ bytes", self._source,
                                 f"{self._limit} bytes were declared for it")
            window_bytes += len(chunk)
            now = time.monotonic()
            if now - window_start >= WINDOW_SECONDS:
                if window_bytes < MIN_BYTES_PER_WINDOW:
                    raise DownloadError(
                        f"{self._source}: the body delivered {window_bytes} bytes in {now - window_start:.0f} s, "
                        f"less than {MIN_BYTES_PER_WINDOW} per {WINDOW_SECONDS:g} s: cut off (a stalled or hostile "
                        "Hub). Nothing was imported; retry, or check the endpoint")
                window_start, window_bytes = now, 0
            yield chunk

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()
