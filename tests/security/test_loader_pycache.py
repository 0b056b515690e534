"""Issue 13, item 3: with `PYTHONPYCACHEPREFIX` set, forged bytecode there must not run instead of the verified source.

The forger writes an unchecked-hash .pyc (never compared with its source) for the kernel's `__init__.py` at the place
Python looks for it under the prefix: `<prefix>/<directory of the source>/__init__.cpython-311.pyc`. The original
loader imported from the cache snapshot, so the forgery for that path ran. Now the import reads the private copy,
through a source-only loader, with a private empty `sys.pycache_prefix` meanwhile; the unit test below also forges
bytecode for the copy's own path (in the prefix and in `__pycache__/`) and shows it is ignored.
"""

from __future__ import annotations

import importlib.util
import os
import py_compile
import sys
from pathlib import Path

import pytest

from ._loader_support import (  # noqa: F401  (fixtures)
    PAYLOAD,
    REPO,
    hf_cache,
    hub,
    keys,
    make_build,
    publish_build,
    run_attack,
)


def _forge(source: Path, pyc: Path, tmp: Path) -> None:
    """An unchecked-hash .pyc at `pyc` compiled from `source` + PAYLOAD."""
    evil = tmp / f"evil-{source.name}"
    evil.write_bytes(source.read_bytes() + PAYLOAD)
    pyc.parent.mkdir(parents=True, exist_ok=True)
    py_compile.compile(str(evil), cfile=str(pyc), dfile=str(source), doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)


def _prefixed(prefix: Path, source: Path) -> Path:
    """Where Python looks for `source`'s bytecode when sys.pycache_prefix is `prefix`."""
    saved = sys.pycache_prefix
    sys.pycache_prefix = str(prefix)
    try:
        return Path(importlib.util.cache_from_source(str(source)))
    finally:
        sys.pycache_prefix = saved


def test_forged_bytecode_under_pythonpycacheprefix_does_not_run(hub, hf_cache, make_build, keys, tmp_path):
    from huggingface_hub import HfApi

    b = make_build()
    commit = publish_build(hub, b, signing_key=keys["good"][0])
    snapshot = Path(HfApi(endpoint=hub.url).snapshot_download(REPO, repo_type="kernel", revision=commit,
                                                              cache_dir=str(hf_cache)))
    variant_dir = snapshot / "build" / b.variant
    prefix = tmp_path / "pycache-prefix"
    for name in ("__init__.py", "interface.py", "_ops.py"):
        _forge(variant_dir / name, _prefixed(prefix, variant_dir / name), tmp_path)

    r, = run_attack([{"name": "prefix", "run_attention": True,
                      "kwargs": {"repo_id": REPO, "version": 1, "endpoint": hub.url,
                                 "public_keys": [str(keys["good"][1])], "require_signature": True}}],
                    pwned=tmp_path / "pwned", env={"PYTHONPYCACHEPREFIX": str(prefix)})
    assert r["pwned"] == "", "forged bytecode from PYTHONPYCACHEPREFIX ran"
    assert r["ok"], r.get("traceback")
    assert r["attention_err"] < 1e-4


def test_import_of_the_copy_ignores_bytecode_for_its_own_path(tmp_path, monkeypatch):
    """Forged bytecode for the private copy's own files, in the copy's `__pycache__/` and under a process-wide
    pycache prefix, eager and lazy (a submodule imported after the load), is never used, and nothing is written."""
    from winattn import importer

    module_id = f"_winattn_sectest_pyc_{id(tmp_path)}"
    base = tmp_path / "p1-x"
    copy = base / "variant"
    copy.mkdir(parents=True)
    (base / "pycache").mkdir()
    (copy / "__init__.py").write_text("from . import eager\nVALUE = 'verified'\n")
    (copy / "eager.py").write_text("VALUE = 'verified'\n")
    (copy / "lazy.py").write_text("VALUE = 'verified'\n")
    prefix = tmp_path / "prefix"
    for name in ("__init__.py", "eager.py", "lazy.py"):
        src = copy / name
        for pyc in (Path(importlib.util.cache_from_source(str(src))), _prefixed(prefix, src)):
            evil = tmp_path / f"evil-{name}"
            evil.write_text("VALUE = 'forged'\nfrom os import environ as _e\n" +
                            ("from . import eager\n" if name == "__init__.py" else ""))
            pyc.parent.mkdir(parents=True, exist_ok=True)
            py_compile.compile(str(evil), cfile=str(pyc), dfile=str(src), doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))  # as PYTHONPYCACHEPREFIX would
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    try:
        module = importer.import_package(copy, module_id)
        assert module.VALUE == "verified" and module.eager.VALUE == "verified"
        assert sys.pycache_prefix == str(prefix)  # restored after the import
        lazy = importlib.import_module(f"{module_id}.lazy")  # after the load, outside the private prefix
        assert lazy.VALUE == "verified"
        assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # no bytecode written
    finally:
        for name in [m for m in sys.modules if m == module_id or m.startswith(module_id + ".")]:
            sys.modules.pop(name)
        for d in (str(copy),):
            sys.path_importer_cache.pop(d, None)
    assert os.listdir(base / "pycache") == []
