"""Audit 3: submodules a failed foreign import left in `sys.modules` must not be bound into a verified load.

The attacker writes the HF cache. `kernels.get_kernel` (which checks no signature) imports a tampered cached build
whose `interface.py` wraps `attention`, and whose `__init__.py` raises once its submodules are imported: Python then
drops `<id>` from `sys.modules` but keeps `<id>.interface`, `<id>._ops`, ... Later in the same process
`winattn.load(require_signature=True)` heals the cache, verifies and imports its private copy. `importer.foreign`
only looked for `<id>` itself, so the verified `__init__.py` ran `from .interface import attention` and Python handed
it the tampered `<id>.interface` from `sys.modules`: what was imported was not what was verified, and every check
said "pass". Now any `<id>.*` module winattn did not import is a `KernelConflictError`, as `<id>` itself is.
"""

from __future__ import annotations

import re
from pathlib import Path

from ._loader_support import REPO, hf_cache, hub, keys, make_build, publish_build, run_attack, write_digest  # noqa: F401

# The tampered interface: `attention` still matches the reference (the smoke test passes), and records each call.
WRAPPED_ATTENTION = b'''
_winattn_real_attention = attention


def attention(*args, **kwargs):
    import os as _o
    open(_o.environ.get("WINATTN_PWNED", "/dev/null"), "a").write("tampered attention called\\n")
    return _winattn_real_attention(*args, **kwargs)
'''
FAIL_AFTER_SUBMODULES = b'\nraise ImportError("the tampered build fails once its submodules are imported")\n'


def test_submodules_left_by_a_failed_foreign_import_are_not_bound(hub, hf_cache, make_build, keys, tmp_path):
    from huggingface_hub import snapshot_download

    b = make_build()
    commit = publish_build(hub, b, signing_key=keys["good"][0])
    snapshot = snapshot_download(REPO, repo_type="kernel", revision=commit, endpoint=hub.url, cache_dir=hf_cache,
                                 allow_patterns=[f"build/{b.variant}/*"])
    cached = Path(snapshot) / "build" / b.variant
    for name, extra in (("interface.py", WRAPPED_ATTENTION), ("__init__.py", FAIL_AFTER_SUBMODULES)):
        with open(cached / name, "ab") as f:  # through the snapshot link: the blob itself
            f.write(extra)
    write_digest(cached)

    first, second = run_attack([
        {"name": "kernels", "call": "kernels", "kwargs": {"repo_id": REPO, "version": 1}},
        {"name": "winattn", "run_attention": True,
         "kwargs": {"repo_id": REPO, "version": 1, "endpoint": hub.url, "public_keys": [str(keys["good"][1])],
                    "require_signature": True}},
    ], pwned=tmp_path / "pwned", env={"HF_ENDPOINT": hub.url})
    assert not first["ok"] and "fails once its submodules" in first["error"], first.get("traceback")
    assert any(m.endswith(".interface") for m in first["evidence"]["modules"]), first["evidence"]
    assert "tampered attention called" not in second["pwned"], \
        "winattn.load returned a verified module bound to the tampered interface left in sys.modules"
    assert not second["ok"] and second["error_type"] == "KernelConflictError", second.get("traceback")
    assert "winattn did not import it" in second["error"]
    assert re.search(r"sys\.modules\['_window_attention_\w+\.\w+'\]", second["error"]), second["error"]
