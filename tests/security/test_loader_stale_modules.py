"""Issue 13, item 2: after a variant fails its smoke test, a later verified load of another variant with the same
op-namespace id in the same process must not run the refused variant's Python code.

On the original loader the refused build's `<id>.*` submodules stayed in `sys.modules`, and the next package of that
id bound them. Now every `<id>` / `<id>.*` module is removed after a failed load, and, since the refused build's native
ops stay registered with torch under that namespace, a second load of the id is refused with `StaleKernelError`.
"""

from __future__ import annotations

import sys

import pytest

from ._loader_support import (  # noqa: F401  (fixtures)
    build_maker,
    isolate_cache,
    keys,
    make_build,
    publish_build,
    run_attack,
    start_hub,
    write_digest,
)

# Appended to the refused build's reference.py: its `attention` records every call and is off by one, so the smoke
# test (kernel vs reference) fails.
STALE_REFERENCE = b'''
_winattn_true_attention = attention


def attention(*args, **kwargs):
    import os
    open(os.environ["WINATTN_PWNED"], "a").write("refused-code-ran\\n")
    return _winattn_true_attention(*args, **kwargs) + 1
'''


@pytest.fixture(scope="module")
def stale_results(built_variant, tmp_path_factory):
    root = tmp_path_factory.mktemp("stale")
    with pytest.MonkeyPatch.context() as mp:
        isolate_cache(mp, root)
        srv = start_hub(root / "hub-root")
        make = build_maker(built_variant, root)
        try:
            bad = make()
            ref = bad.variant_dir / "reference.py"
            ref.write_bytes(ref.read_bytes() + STALE_REFERENCE)
            write_digest(bad.variant_dir)  # a consistent publication: only the smoke test can catch it
            publish_build(srv, bad, "winattn/smoke-bad")
            publish_build(srv, make(), "winattn/smoke-good")  # same .so, same op namespace id
            cases = [
                {"name": "bad", "kwargs": {"repo_id": "winattn/smoke-bad", "version": 1, "endpoint": srv.url}},
                {"name": "good", "kwargs": {"repo_id": "winattn/smoke-good", "version": 1, "endpoint": srv.url}},
            ]
            yield {r["name"]: r for r in run_attack(cases, pwned=root / "pwned")}
        finally:
            srv.stop()


def test_failed_smoke_test_leaves_no_module_of_the_namespace(stale_results):
    r = stale_results["bad"]
    assert not r["ok"] and r["error_type"] == "VerificationError" and "smoke test failed" in r["error"], r
    assert r["pwned"] == "refused-code-ran\n"  # the smoke test ran the refused code once: that is how it was caught
    assert r["evidence"]["modules"] == [], r["evidence"]  # no <id> or <id>.* left
    assert r["evidence"]["kernels_loaded"] == []
    assert r["evidence"]["ops"], "the native ops stay registered: the reason a second load is refused"


def test_second_load_of_the_namespace_runs_no_refused_code_and_is_refused_clearly(stale_results):
    r = stale_results["good"]
    assert r["pwned"] == "refused-code-ran\n", "the refused build's Python code ran again"
    assert not r["ok"], "a second build of a refused op namespace was imported next to its native ops"
    assert r["error_type"] == "StaleKernelError" and "WinattnError" in r["error_mro"], r.get("traceback")
    assert "failed to load earlier in this process" in r["error"] and "smoke test failed" in r["error"]
    assert "winattn/smoke-good" in r["error"] and "Start a new process" in r["error"]
    assert r["evidence"]["modules"] == []


# ----------------------------------------------------------------------------------------------------------------------
# The same rule for an import that raises, on a tiny pure-Python package (a unique id per test)


def _package(tmp_path, module_id, init: str):
    copy = tmp_path / "p1-x" / "variant"
    copy.mkdir(parents=True)
    (copy.parent / "pycache").mkdir()
    (copy / "helper.py").write_text("VALUE = 'refused'\n")
    (copy / "__init__.py").write_text(init)
    return copy


def test_import_error_removes_every_submodule_and_refuses_the_id(tmp_path):
    from winattn import importer
    from winattn.errors import StaleKernelError

    module_id = f"_winattn_sectest_importerror_{id(tmp_path)}"
    copy = _package(tmp_path, module_id, "from . import helper\nraise RuntimeError('broken build')\n")
    with pytest.raises(RuntimeError, match="broken build"):
        importer.import_package(copy, module_id)
    assert [m for m in sys.modules if m == module_id or m.startswith(module_id + ".")] == []
    with pytest.raises(StaleKernelError, match="failed to load earlier in this process"):
        importer.import_package(copy, module_id)
