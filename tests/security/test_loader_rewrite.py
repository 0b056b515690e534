"""Issue 13, item 4: files changed between verification and import must not be imported.

A hook in the loading process plays the cache writer: right after `verify_variant` returns a passing report, it
appends PAYLOAD to the cached `__init__.py` (its blob) and to `interface.py` (imported by `__init__`). The original
loader verified, then re-opened the files by path and ran the rewrite. Now the import reads the private copy that was
hashed; the rewrite has no effect on this load and is caught by the next verification.
"""

from __future__ import annotations

from ._loader_support import (  # noqa: F401  (fixtures)
    PAYLOAD,
    REPO,
    hf_cache,
    hub,
    make_build,
    publish_build,
    run_attack,
)

REWRITE_AFTER_VERIFY = """
import os
import winattn.verify as _verify

_real = _verify.verify_variant
PAYLOAD = {payload}


def _rewrite_after_verification(path, **kwargs):
    report = _real(path, **kwargs)
    if report.ok:
        for name in ("__init__.py", "interface.py"):
            target = os.path.realpath(os.path.join(path, name))  # the blob behind the snapshot link
            with open(target, "ab") as f:
                f.write(PAYLOAD)
    return report


_verify.verify_variant = _rewrite_after_verification
"""


def test_file_rewritten_right_after_verification_is_not_imported(hub, hf_cache, make_build, tmp_path):
    from winattn.verify import verify_variant

    b = make_build()
    publish_build(hub, b)
    pwned = tmp_path / "pwned"
    r, = run_attack([{"name": "rewrite", "run_attention": True,
                      "kwargs": {"repo_id": REPO, "version": 1, "endpoint": hub.url}}],
                    pwned=pwned, setup=REWRITE_AFTER_VERIFY.format(payload=repr(PAYLOAD)))
    assert r["ok"], r.get("traceback")
    assert r["pwned"] == "", "a file rewritten after verification was imported"
    assert r["attention_err"] < 1e-4

    # The hook did rewrite the cache: the next verification of it notices.
    cached = next(hf_cache.glob(f"kernels--winattn--window-attention/snapshots/*/build/{b.variant}"))
    assert PAYLOAD in (cached / "__init__.py").read_bytes()
    report = verify_variant(cached)
    assert not report.ok and "File hash mismatch for __init__.py" in report.check("digest").detail


def test_file_changed_while_it_is_hashed_cannot_reach_the_copy(make_build, tmp_path, monkeypatch):
    """A file that grows while it is read is refused; what the copy holds is only ever what was hashed."""
    import winattn.file_reader as file_reader
    import winattn.verify as verify

    b = make_build()
    target = b.variant_dir / "layers.py"
    real_open = file_reader.open_regular

    def open_then_grow(entry):
        fd = real_open(entry)
        if entry.rel == "layers.py":
            with open(target, "ab") as f:
                f.write(b"x" * (2 * file_reader.CHUNK_BYTES))
        return fd

    monkeypatch.setattr(file_reader, "open_regular", open_then_grow)
    copy = tmp_path / "copy"
    copy.mkdir()
    report = verify.verify_variant(b.variant_dir, copy_to=copy, use_receipt=False)
    assert not report.ok and report.copy_path is None
    assert "layers.py grew past its listed" in report.check("digest").detail
