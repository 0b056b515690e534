"""The streamed NDJSON reader of commit bodies (winattn/hub/ndjson.py): same values as json.loads, long strings
spilled to disk, malformed input as NDJSONError, whatever the chunking of the stream."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from winattn.hub.ndjson import NDJSONError, NDJSONReader, Spilled


def _reader(data: bytes, tmp_path, chunk: int = 7, **kw) -> NDJSONReader:
    pieces = iter([data[i : i + chunk] for i in range(0, len(data), chunk)])
    counter = itertools.count()
    return NDJSONReader(lambda: next(pieces, b""), lambda: tmp_path / f"spill-{next(counter)}", **kw)


def _unspill(value):
    if isinstance(value, Spilled):
        return value.path.read_bytes().decode()
    if isinstance(value, dict):
        return {k: _unspill(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unspill(v) for v in value]
    return value


def _random_value(rnd: random.Random, depth: int = 0):
    kind = rnd.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return rnd.randrange(-(10**9), 10**9)
    if kind == 1:
        return rnd.random() * 10 ** rnd.randrange(-8, 8)
    if kind == 2:
        return rnd.choice([True, False, None])
    if kind == 3:
        return "".join(rnd.choice('ab"\\/\n\t\u00e9\u4e2d\U0001f600 ') for _ in range(rnd.randrange(0, 200)))
    if kind == 4:
        return [_random_value(rnd, depth + 1) for _ in range(rnd.randrange(4))]
    return {f"k{i}": _random_value(rnd, depth + 1) for i in range(rnd.randrange(4))}


def test_values_match_json_loads_under_any_chunking(tmp_path):
    rnd = random.Random(13)
    for _ in range(300):
        values = [_random_value(rnd) for _ in range(rnd.randrange(1, 4))]
        data = b"\n".join(json.dumps(v, ensure_ascii=rnd.random() < 0.5).encode() for v in values) + b"\r\n\n"
        with _reader(data, tmp_path, chunk=rnd.randrange(1, 50), inline_max=64) as reader:
            assert [_unspill(v) for _, v in reader] == values


def test_long_strings_are_spilled_and_removed_on_close(tmp_path):
    content = "QUFB" * 100_000
    line = json.dumps({"key": "file", "value": {"content": content, "path": "a.bin"}}).encode()
    reader = _reader(b"\n" + line + b"\n", tmp_path, chunk=65536)
    ((lineno, item),) = list(reader)
    spilled = item["value"]["content"]
    assert lineno == 2 and isinstance(spilled, Spilled) and item["value"]["path"] == "a.bin"
    assert spilled.size == len(content) and b"".join(spilled.chunks(4096)) == content.encode()
    reader.close()
    assert not spilled.path.exists()


@pytest.mark.parametrize(
    "data",
    [b'{"a": 1', b'{"a": 1}}', b"[1,]", b'{"a" 1}', b'"\\x"', b'"\\ud800"', b'"\\udc00"', b'"a\x01"', b"01", b"1.",
     b"NaN", b'{"a":\n1}', b'"\xff"', b'"\xc3"', b"[" * 40 + b"]" * 40, b'"\\u12"', b"1 2"],
)
def test_malformed_input_is_an_ndjson_error(tmp_path, data):
    with pytest.raises(NDJSONError, match=r"^line 1 "):
        list(_reader(data, tmp_path, chunk=3))


def test_line_cap_bounds_what_is_kept_in_memory(tmp_path):
    data = json.dumps({f"k{i}": "v" * 1000 for i in range(100)}).encode()
    with pytest.raises(NDJSONError, match="holds more than"):
        list(_reader(data, tmp_path, chunk=4096, line_max=50_000))
