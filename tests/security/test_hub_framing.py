"""Issue 27: request framing on the embedded Hub (request smuggling through the header section).

The attacker sends raw bytes to the Hub (or sits behind a front proxy that frames requests by another rule). The
stdlib parser kept the first of two `Content-Length` headers, silently dropped `Content-Length : N` (whitespace before
the colon) and joined obsolete line folds, so a body could be served as a second request on the same connection.
Now each of these is a 400 and the connection is closed (RFC 9112: a server must reject them).
"""

from __future__ import annotations

import pytest

from ._hub_support import hub, raw_exchange  # noqa: F401  (fixture)

SMUGGLED = b"GET /api/whoami-v2 HTTP/1.1\r\nHost: x\r\n\r\n"


def _post(headers: bytes, body: bytes = SMUGGLED) -> bytes:
    return b"POST /api/repos/create HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n" + body


CASES = {
    "two Content-Length headers": _post(b"Content-Length: 0\r\nContent-Length: %d\r\n" % len(SMUGGLED)),
    "Content-Length with a space before the colon": _post(b"Content-Length : %d\r\n" % len(SMUGGLED)),
    "Content-Length with a tab before the colon": _post(b"Content-Length\t: %d\r\n" % len(SMUGGLED)),
    "a header name holding a space": _post(b"X Forwarded: 1\r\nContent-Length: %d\r\n" % len(SMUGGLED)),
    "an obsolete line fold": _post(b"X-Note: a\r\n b\r\nContent-Length: %d\r\n" % len(SMUGGLED)),
    "two Transfer-Encoding headers": _post(b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
                                          b"0\r\n\r\n" + SMUGGLED),
}


@pytest.mark.parametrize("case", list(CASES))
def test_ambiguous_header_section_is_a_400_and_nothing_is_smuggled(hub, case):
    data, first = raw_exchange(hub.url, CASES[case])
    assert first < 3, "no answer: the server waits for a body the client framed otherwise"
    status_line = data.split(b"\r\n", 1)[0]
    assert status_line.startswith(b"HTTP/1.1 400 "), (case, data[:300])
    assert data.count(b"HTTP/1.1 ") == 1, f"{case}: a second response was served from the body: {data!r}"
    assert b"Connection: close" in data and b"Bad request header section" in data


def test_a_plain_request_still_works(hub):
    data, _ = raw_exchange(hub.url, b"GET /api/whoami-v2 HTTP/1.1\r\nHost: x\r\nX-Ok: 1\r\nConnection: close\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 401 ")  # anonymous whoami: answered, not refused as malformed
