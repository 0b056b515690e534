"""JSON written by someone else, parsed with a bound on its size and on its nesting depth.

`json.loads` recurses once per `[` / `{`: a few thousand levels raise `RecursionError`, which no caller expects (a
poisoned verified-receipt then broke every later load of its entry; the Hub answered 500), and a document just under
the interpreter's limit breaks the code that walks it next. Here the depth is measured before parsing, on the text
with its strings removed (no recursion, linear time), and a document over the limits is a `JSONLimitError`, a
`ValueError` like every other malformed document, so the caller's one `except ValueError` refuses it: a
`VerificationError` in the loader, a 400 on the Hub. Stdlib only (the embedded Hub uses it too).
"""

from __future__ import annotations

import array
import itertools
import json
import re

MAX_DEPTH = 64  # winattn's own documents nest at most 6 levels; a model-signing bundle about 8
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = str.maketrans({"[": "\x01", "{": "\x01", "]": "\xff", "}": "\xff"})  # +1 / -1 as signed bytes


class JSONLimitError(ValueError):
    """A JSON document larger or deeper than its caller accepts."""


def check_depth(text: str, max_depth: int = MAX_DEPTH) -> None:
    """Raise `JSONLimitError` when arrays and objects in `text` nest deeper than `max_depth`."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if not brackets:
        return
    # the running sum of +1 / -1 is the depth at each bracket; accumulate and max run in C (16 MiB: ~1.5 s)
    steps = array.array("b", brackets.translate(_STEP).encode("latin-1"))
    if max(itertools.accumulate(steps)) > max_depth:
        raise JSONLimitError(f"JSON nests deeper than {max_depth} levels")


def loads(data, *, max_bytes: int, max_depth: int = MAX_DEPTH, what: str = "JSON document"):
    """`json.loads(data)` for `data` (bytes: UTF-8) of at most `max_bytes` bytes and `max_depth` levels.

    Raises:
        JSONLimitError: too large or too deep. ValueError: not JSON (or not UTF-8).
    """
    size = len(data) if isinstance(data, (bytes, bytearray)) else len(data.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise JSONLimitError(f"{what} is {size} bytes, more than the {max_bytes} accepted")
    text = bytes(data).decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    try:
        check_depth(text, max_depth)
    except JSONLimitError as e:
        raise JSONLimitError(f"{what}: {e}") from None
    return json.loads(text)
