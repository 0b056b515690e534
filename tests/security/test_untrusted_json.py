"""Issue 27: JSON written by someone else is parsed with a bound on its size and nesting depth.

A signature bundle, a verified-receipt and a vendor lock are written by whoever writes the cache or the vendored
directory; a Hub request body by any client. Nested a few thousand levels deep, each escaped `json.loads` as
`RecursionError`: a poisoned receipt blocked every later load of its cache entry, and the Hub's `paths-info` and
`repos/create` answered 500. Now each is refused like any malformed document (`winattn.bounded_json`): a failed
check or a `VerificationError` in the loader (a bad receipt is ignored: the variant is hashed), a 400 on the Hub.
"""

from __future__ import annotations

import json

import pytest

from ._hub_support import AUTH, api, hub, raw_request  # noqa: F401  (fixtures)
from ._loader_support import hf_cache, keys, make_build  # noqa: F401  (fixtures)

DEEP = "[" * 5000 + "]" * 5000  # 5,000 levels: past the interpreter's recursion limit


def test_deep_json_bodies_are_a_400_on_the_hub(hub, api):
    api.create_repo("acme/real")
    headers = dict(AUTH, **{"Content-Type": "application/json"})
    for path, body in [("/api/models/acme/real/paths-info/main", '{"paths": %s}' % DEEP),
                       ("/api/repos/create", '{"name": "x", "organization": %s}' % DEEP)]:
        status, _, data = raw_request(hub.url, "POST", path, body=body.encode(), headers=headers)
        assert status == 400, (path, status, data[:200])
        assert b"nests deeper than" in data


def test_deep_signature_bundle_is_a_failed_signature_check(make_build, keys):
    from winattn.verify import verify_variant

    b = make_build()
    (b.variant_dir / "metadata.json.sigstore").write_text(DEEP)
    report = verify_variant(b.variant_dir, public_keys=[keys["good"][1]], use_receipt=False)
    assert not report.ok
    assert "bad signature" in report.check("signature").detail and "nests deeper" in report.check("signature").detail


def test_poisoned_receipt_is_ignored_and_the_variant_hashed(make_build, hf_cache):
    from winattn.receipts import receipt_path
    from winattn.verify import verify_variant

    b = make_build()
    assert verify_variant(b.variant_dir).ok
    path = receipt_path(b.variant_dir)
    receipt = json.loads(path.read_text())
    receipt["origin"] = json.loads("[" * 900 + "]" * 900)  # under the recursion limit: it used to load, then break
    path.write_text(json.dumps(receipt)[:-1] + ', "x": ' + DEEP + "}")
    report = verify_variant(b.variant_dir)  # no RecursionError: the receipt is not one winattn wrote, so unused
    assert report.ok and not report.receipt_hit


def test_deep_vendor_lock_is_a_verification_error(make_build, tmp_path):
    import shutil

    import winattn
    from winattn.errors import VerificationError

    b = make_build()
    vendored = tmp_path / "vendored"
    shutil.copytree(b.variant_dir, vendored / b.variant)
    (vendored / "window-attention.lock").write_text('{"format": 1, "variants": %s}' % DEEP)
    with pytest.raises(VerificationError, match="invalid lock .*nests deeper than"):
        winattn.load(vendored=vendored)


def test_depth_and_size_bounds():
    from winattn.bounded_json import JSONLimitError, loads

    assert loads('{"a": ["[[[", {"b": "\\"]]"}]}', max_bytes=100) == {"a": ["[[[", {"b": '"]]'}]}
    assert loads("[" * 64 + "]" * 64, max_bytes=1000) == loads("[" * 64 + "]" * 64, max_bytes=1000)
    with pytest.raises(JSONLimitError, match="deeper than 64"):
        loads("[" * 65 + "]" * 65, max_bytes=1000)
    with pytest.raises(JSONLimitError, match="more than the 10 accepted"):
        loads(b"[1, 2, 3, 4, 5]", max_bytes=10)


@pytest.mark.parametrize("files", [["__init__.py"], {"__init__.py": 7}], ids=["list", "number"])
def test_receipt_of_the_wrong_shape_is_ignored_and_the_variant_hashed(make_build, hf_cache, files):
    """Audit 3: a receipt is JSON of the right depth but not of the right shape (its `files` a list, a stat tuple a
    number): `receipt_matches` indexed it and raised TypeError out of `verify_variant` (`winattn verify` crashed on
    every later run). Now a receipt not of the shape winattn writes is ignored, as a deep one is."""
    from winattn.receipts import receipt_path
    from winattn.verify import verify_variant

    b = make_build()
    assert verify_variant(b.variant_dir).ok
    path = receipt_path(b.variant_dir)
    receipt = json.loads(path.read_text())
    names = sorted(receipt["files"])
    receipt["files"] = names if isinstance(files, list) else dict.fromkeys(names, 7)
    path.write_text(json.dumps(receipt))
    report = verify_variant(b.variant_dir)
    assert report.ok and not report.receipt_hit

