"""Streamed NDJSON reader for commit bodies: one JSON value per line, parsed as the bytes arrive, long strings
spilled to files, so that a commit costs bounded server memory whatever the size of the files it carries.

Why not `json.loads` per line: huggingface_hub sends every "regular" file as one NDJSON line holding its base64
content, so a 200 MiB file is a 267 MiB line. Buffering the line, decoding the JSON and then the base64 held about
five copies at once: one commit of a 200 MiB file raised the server's peak RSS by 1002 MiB (measured, issue 13).
Here a string longer than `inline_max` goes to a spill file as it is scanned (`Spilled`), and the caller streams
it from there (routes.py decodes the base64 chunk by chunk into the staged blob); everything else a line holds is
capped at `line_max` bytes. Memory per request: one read chunk plus `line_max`, independent of the file sizes.

The grammar is strict JSON (RFC 8259) with NDJSON framing: a value may not span lines, only spaces, tabs and CR
may follow it on its line, blank lines are skipped. Strings must be valid UTF-8 and may not hold lone surrogates.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from pathlib import Path

_SPECIAL = re.compile(rb'["\\\x00-\x1f]')
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_HEX4 = re.compile(rb"[0-9a-fA-F]{4}")
_ESCAPES = {ord('"'): b'"', ord("\\"): b"\\", ord("/"): b"/", ord("b"): b"\b", ord("f"): b"\f",
            ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t"}
_INLINE_WS = b" \t\r"
_NUMBER_MAX = 64


class NDJSONError(ValueError):
    """Malformed NDJSON; `lineno` is the 1-based line it was found on."""

    def __init__(self, lineno: int, message: str):
        super().__init__(f"line {lineno} {message}")
        self.lineno = lineno
        self.message = message


@dataclass
class Spilled:
    """A JSON string too long to keep in memory: its UTF-8 text is the file `path` (`size` bytes). The reader's
    owner removes it (`NDJSONReader.close`)."""

    path: Path
    size: int

    def chunks(self, size: int = 1024 * 1024):
        with open(self.path, "rb") as f:
            while chunk := f.read(size):
                yield chunk


class NDJSONReader:
    """Iterate `(lineno, value)` over an NDJSON byte stream.

    Args:
        read: returns the next chunk of body bytes, b"" at the end (server.BodyReader.read_chunk).
        spill_path: returns a fresh file path for a spilled string (Store.tmp_path).
        inline_max: strings longer than this (in UTF-8 bytes) are spilled; object keys may not be.
        line_max: bytes one line may hold besides its spilled strings.
        max_depth: nesting limit of arrays and objects.
    """

    def __init__(self, read, spill_path, *, inline_max: int = 64 * 1024, line_max: int = 16 * 1024 * 1024,
                 max_depth: int = 32):
        self._read = read
        self._spill_path = spill_path
        self.inline_max = inline_max
        self.line_max = line_max
        self.max_depth = max_depth
        self._buf = b""
        self._pos = 0
        self._eof = False
        self.lineno = 1
        self._inline = 0
        self.spilled: list[Spilled] = []

    def close(self) -> None:
        """Remove every spill file still on disk."""
        for s in self.spilled:
            s.path.unlink(missing_ok=True)
        self.spilled.clear()

    def __enter__(self) -> NDJSONReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- buffer

    def _fill(self, need: int = 1) -> bool:
        """True once at least `need` unread bytes are buffered; False at the end of the body."""
        while len(self._buf) - self._pos < need:
            if self._eof:
                return False
            chunk = self._read()
            if not chunk:
                self._eof = True
                return False
            self._buf = self._buf[self._pos:] + chunk
            self._pos = 0
        return True

    def _peek(self) -> int | None:
        return self._buf[self._pos] if self._fill(1) else None

    def _error(self, message: str) -> NDJSONError:
        return NDJSONError(self.lineno, message)

    def _account(self, n: int) -> None:
        self._inline += n
        if self._inline > self.line_max:
            raise self._error(f"holds more than {self.line_max} bytes of JSON besides long strings")

    def _skip_ws(self) -> None:
        while (c := self._peek()) is not None and c in _INLINE_WS:
            self._pos += 1

    # -- lines

    def __iter__(self):
        while True:
            while (c := self._peek()) is not None and (c in _INLINE_WS or c == 0x0A):
                self._pos += 1
                self.lineno += c == 0x0A
            if c is None:
                return
            self._inline = 0
            lineno = self.lineno
            value = self._value(0)
            self._skip_ws()
            c = self._peek()
            if c is not None and c != 0x0A:
                raise self._error("is not valid JSON (data after the value)")
            yield lineno, value

    # -- values

    def _value(self, depth: int):
        self._skip_ws()
        c = self._peek()
        if c is None:
            raise self._error("is not valid JSON (unexpected end)")
        if c == ord("{"):
            return self._object(depth + 1)
        if c == ord("["):
            return self._array(depth + 1)
        if c == ord('"'):
            return self._string(spillable=True)
        if c == ord("-") or ord("0") <= c <= ord("9"):
            return self._number()
        for word, value in ((b"true", True), (b"false", False), (b"null", None)):
            if c == word[0]:
                self._fill(len(word))
                if self._buf.startswith(word, self._pos):
                    self._pos += len(word)
                    self._account(len(word))
                    return value
        raise self._error("is not valid JSON")

    def _expect(self, byte: bytes, what: str) -> None:
        self._skip_ws()
        if self._peek() != byte[0]:
            raise self._error(f"is not valid JSON (expected {what})")
        self._pos += 1

    def _object(self, depth: int) -> dict:
        if depth > self.max_depth:
            raise self._error(f"nests deeper than {self.max_depth} levels")
        self._pos += 1
        out: dict = {}
        self._skip_ws()
        if self._peek() == ord("}"):
            self._pos += 1
            return out
        while True:
            self._skip_ws()
            if self._peek() != ord('"'):
                raise self._error("is not valid JSON (expected a string key)")
            key = self._string(spillable=False)
            self._expect(b":", "':'")
            out[key] = self._value(depth)
            self._account(16)
            self._skip_ws()
            c = self._peek()
            self._pos += 1
            if c == ord("}"):
                return out
            if c != ord(","):
                raise self._error("is not valid JSON (expected ',' or '}')")

    def _array(self, depth: int) -> list:
        if depth > self.max_depth:
            raise self._error(f"nests deeper than {self.max_depth} levels")
        self._pos += 1
        out: list = []
        self._skip_ws()
        if self._peek() == ord("]"):
            self._pos += 1
            return out
        while True:
            out.append(self._value(depth))
            self._account(8)
            self._skip_ws()
            c = self._peek()
            self._pos += 1
            if c == ord("]"):
                return out
            if c != ord(","):
                raise self._error("is not valid JSON (expected ',' or ']')")

    def _number(self):
        self._fill(_NUMBER_MAX + 1)
        m = _NUMBER.match(self._buf, self._pos)
        if m is None or m.end() - self._pos > _NUMBER_MAX:
            raise self._error("is not valid JSON (bad number)")
        text = m.group()
        self._pos = m.end()
        self._account(len(text))
        return float(text) if any(ch in text for ch in b".eE") else int(text)

    def _string(self, *, spillable: bool):
        """The string starting at the opening quote: str, or Spilled once longer than inline_max."""
        self._pos += 1
        out = bytearray()
        spill, spill_file, size = None, None, 0
        utf8 = codecs.getincrementaldecoder("utf-8")()

        def emit(piece: bytes, *, validated: bool = False) -> None:
            nonlocal spill, spill_file, size
            if not validated:
                try:
                    if not piece.isascii() or utf8.getstate()[0]:
                        utf8.decode(piece)
                except UnicodeDecodeError:
                    raise self._error("holds a string that is not valid UTF-8") from None
            size += len(piece)
            if spill_file is not None:
                spill_file.write(piece)
                return
            out.extend(piece)
            if len(out) > self.inline_max:
                if not spillable:
                    raise self._error(f"has an object key longer than {self.inline_max} bytes")
                spill = Spilled(self._spill_path(), 0)
                self.spilled.append(spill)
                spill_file = open(spill.path, "wb")
                spill_file.write(out)
                out.clear()

        try:
            while True:
                if not self._fill(1):
                    raise self._error("is not valid JSON (unterminated string)")
                m = _SPECIAL.search(self._buf, self._pos)
                end = m.start() if m else len(self._buf)
                if end > self._pos:
                    emit(self._buf[self._pos:end])
                    self._pos = end
                if m is None:
                    continue
                c = self._buf[end]
                if c == ord('"'):
                    self._pos += 1
                    break
                if c != ord("\\"):
                    raise self._error("is not valid JSON (control character in a string)")
                self._finish_utf8(utf8)
                emit(self._escape(), validated=True)
            self._finish_utf8(utf8)
        finally:
            if spill_file is not None:
                spill_file.close()
        if spill is not None:
            spill.size = size
            return spill
        self._account(len(out))
        return out.decode("utf-8")

    def _finish_utf8(self, utf8) -> None:
        try:
            utf8.decode(b"", final=True)
        except UnicodeDecodeError:
            raise self._error("holds a string that is not valid UTF-8") from None

    def _escape(self) -> bytes:
        """Decode the escape at the backslash under the cursor; returns its UTF-8 bytes."""
        if not self._fill(2):
            raise self._error("is not valid JSON (unterminated string)")
        c = self._buf[self._pos + 1]
        if c in _ESCAPES:
            self._pos += 2
            return _ESCAPES[c]
        if c != ord("u"):
            raise self._error("is not valid JSON (bad escape)")
        code = self._hex4()
        if 0xD800 <= code < 0xDC00:
            if not (self._fill(2) and self._buf.startswith(b"\\u", self._pos)):
                raise self._error("holds a lone UTF-16 surrogate")
            low = self._hex4()
            if not 0xDC00 <= low < 0xE000:
                raise self._error("holds a lone UTF-16 surrogate")
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
        elif 0xDC00 <= code < 0xE000:
            raise self._error("holds a lone UTF-16 surrogate")
        return chr(code).encode("utf-8")

    def _hex4(self) -> int:
        """The XXXX of a `\\uXXXX` under the cursor."""
        if not self._fill(6) or not _HEX4.fullmatch(self._buf, self._pos + 2, self._pos + 6):
            raise self._error("is not valid JSON (bad \\u escape)")
        code = int(self._buf[self._pos + 2:self._pos + 6], 16)
        self._pos += 6
        return code
