"""Pre-upload variant checks (winattn.publish.check_variant) and the card (winattn.card), on hand-made variants."""

import shutil

import pytest
import yaml

from winattn.card import api_functions, fill_card, render_card
from winattn.errors import PublishError
from winattn.publish import check_variant, find_variants, read_build_config

from .conftest import REPO_ROOT, write_digest


def test_a_complete_variant_passes(tmp_path, make_variant):
    check_variant(make_variant(tmp_path), expect_name="window-attention", expect_version=1)


def test_tampered_so_is_a_digest_mismatch(tmp_path, make_variant):
    v = make_variant(tmp_path)
    so = next(v.glob("*.abi3.so"))
    so.write_bytes(so.read_bytes() + b"\0")
    with pytest.raises(PublishError, match=f"variant {v.name} refused: digest mismatch.*{so.name}"):
        check_variant(v)


def test_missing_ops_py(tmp_path, make_variant):
    v = make_variant(tmp_path)
    (v / "_ops.py").unlink()
    with pytest.raises(PublishError, match=f"variant {v.name} refused: _ops.py is missing"):
        check_variant(v)


def test_two_shared_libraries(tmp_path, make_variant):
    v = make_variant(tmp_path)
    shutil.copy(next(v.glob("*.abi3.so")), v / "_other.abi3.so")
    with pytest.raises(PublishError, match="exactly one \\*.abi3.so, found 2"):
        check_variant(v)


def test_metadata_that_kernels_cannot_parse(tmp_path, make_variant):
    v = make_variant(tmp_path)
    (v / "metadata.json").write_text('{"name": "window-attention"}')
    with pytest.raises(PublishError, match="metadata.json does not parse: .*missing field"):
        check_variant(v)


def test_metadata_without_digest(tmp_path, make_variant):
    import json

    v = make_variant(tmp_path)
    meta = json.loads((v / "metadata.json").read_text())
    del meta["digest"]
    (v / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(PublishError, match="no digest"):
        check_variant(v)


def test_version_other_than_build_toml(tmp_path, make_variant):
    v = make_variant(tmp_path, version=2)
    with pytest.raises(PublishError, match="version 2 is not build.toml's 1"):
        check_variant(v, expect_version=1)


def test_non_abi3_library(tmp_path, make_variant):
    import json
    import subprocess
    import sysconfig

    v = make_variant(tmp_path)
    src = tmp_path / "bad.c"
    # PyUnicode_AsUTF8AndSize joined the limited API in 3.10 (ecosystem.md §5).
    src.write_text(
        "#include <Python.h>\nconst char *f(PyObject *o){Py_ssize_t n; return PyUnicode_AsUTF8AndSize(o, &n);}\n"
    )
    so = next(v.glob("*.abi3.so"))
    inc = sysconfig.get_paths()["include"]
    subprocess.run(["cc", "-shared", "-fPIC", f"-I{inc}", str(src), "-o", str(so)], check=True)
    write_digest(v, {k: val for k, val in json.loads((v / "metadata.json").read_text()).items() if k != "digest"})
    with pytest.raises(PublishError, match="not abi3 for Python 3.9: .*PyUnicode_AsUTF8AndSize"):
        check_variant(v)


def test_find_variants_ignores_non_variant_dirs_and_requires_one(tmp_path, make_variant):
    (tmp_path / "build" / "_tmp_objects").mkdir(parents=True)
    with pytest.raises(PublishError, match="no variants"):
        find_variants(tmp_path / "build")
    v = make_variant(tmp_path / "build")
    assert find_variants(tmp_path / "build") == [v]


def test_build_config_is_read_from_the_repo():
    config = read_build_config(REPO_ROOT)
    assert (config.name, config.version, config.hub_repo_id) == ("window-attention", 1, "winattn/window-attention")


def test_invalid_build_toml_is_refused(tmp_path):
    (tmp_path / "build.toml").write_text('[general]\nname = "x"\nedition = 6\n')
    with pytest.raises(PublishError, match="not a valid kernel-builder config.*edition"):
        read_build_config(tmp_path)


def test_fill_card_rejects_unfilled_placeholders():
    assert fill_card("a {{ x }} b {{y}}", {"x": "1", "y": "2"}) == "a 1 b 2"
    with pytest.raises(PublishError, match="no value: y"):
        fill_card("{{x}} {{y}}", {"x": "1"})


def test_api_functions_follow_imports_for_summaries(tmp_path, make_variant):
    v = make_variant(tmp_path)
    assert api_functions(v) == [("attention", "Fake fused attention."), ("helpers", "Helper module.")]


def test_api_functions_survive_the_threaded_ast_error_of_python_3_11(tmp_path, make_variant, monkeypatch):
    """CPython 3.11 raises a spurious SystemError from `ast.parse` when another thread parses at the same time (a
    server thread printing a traceback did, in CI); the card is still rendered, and any other SystemError is not hidden."""
    import ast

    from winattn import card

    v = make_variant(tmp_path)
    real_parse, calls = ast.parse, []

    def flaky_parse(source, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=156, after=35)")
        return real_parse(source, *args, **kwargs)

    monkeypatch.setattr(card.ast, "parse", flaky_parse)
    assert api_functions(v) == [("attention", "Fake fused attention."), ("helpers", "Helper module.")]
    assert len(calls) > 1

    def broken_parse(source, *args, **kwargs):
        raise SystemError("some other interpreter error")

    monkeypatch.setattr(card.ast, "parse", broken_parse)
    with pytest.raises(SystemError, match="some other"):
        api_functions(v)


def test_card_from_the_repo_template(tmp_path, make_variant):
    v = make_variant(tmp_path)
    card = render_card(
        REPO_ROOT, repo_id="org/wa", name="window-attention", version=1, license="Apache-2.0", variant_dirs=[v]
    )
    assert "{{" not in card
    front = yaml.safe_load(card.split("---\n")[1])
    assert front == {"library_name": "kernels", "license": "apache-2.0", "tags": ["kernel", "attention"]}
    assert 'get_kernel("org/wa", version=1)' in card
    assert "- `attention`: Fake fused attention." in card
    assert f"| `{v.name}` | cpu |" in card


def test_stale_signature_is_refused_before_upload(tmp_path, make_variant, keypair):
    import json

    from winattn.signing import sign_variant

    v = make_variant(tmp_path)
    sign_variant(v, keypair[0])
    check_variant(v)  # current signature: fine
    meta = json.loads((v / "metadata.json").read_text())
    meta["license"] = "MIT"  # rebuilt after signing
    (v / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(PublishError, match="stale signature"):
        check_variant(v)
    check_variant(v, check_signature=False)  # publish --signing-key re-signs it
