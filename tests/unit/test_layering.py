"""Each concern has one home and imports go one way (issue 17): checked on the source and in fresh interpreters."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
WINATTN = REPO_ROOT / "winattn"


def _sources():
    return [p for p in sorted(WINATTN.rglob("*.py")) if "kernel_python" not in p.parts]


def _calls_and_imports(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            yield "attr", node.attr
        elif isinstance(node, ast.ImportFrom):
            yield "from", ("." * node.level) + (node.module or "")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield "import", alias.name


@pytest.mark.parametrize("helper, home", [
    ("hash_variant", "variant.py"),  # computing a digest
    ("check_python_abi", "variant.py"),  # the abi3 rule
    ("validate", None),  # kernels' Digest.validate: checking is verify's streaming hasher (variant.check_digest)
])
def test_one_implementation_of_each_variant_rule(helper, home):
    users = sorted(str(p.relative_to(WINATTN)) for p in _sources()
                   if ("attr", helper) in set(_calls_and_imports(p)))
    assert users == ([] if home is None else [home]), users


def test_the_snapshot_cache_path_is_spelled_once():
    spelled = sorted(str(p.relative_to(WINATTN)) for p in _sources() if '"snapshots"' in p.read_text())
    assert spelled == ["resolve.py"], spelled


def test_nothing_under_build_internals_imports_the_cli_module():
    for path in sorted((WINATTN / "_build").glob("*.py")):
        modules = {m for kind, m in _calls_and_imports(path) if kind in ("from", "import")}
        assert not modules & {"..build", "winattn.build"}, path.name


def test_shared_integration_module_does_not_import_a_framework_integration():
    """FastVideo's post-import hook lives in its own stdlib-only module (`_fastvideo_hook`), not in the shared one."""
    text = (WINATTN / "integrations" / "__init__.py").read_text()
    modules = {m for kind, m in _calls_and_imports(WINATTN / "integrations" / "__init__.py") if kind != "attr"}
    assert not {m for m in modules if m.lstrip(".") in ("fastvideo", "diffusers", "timm")}, modules
    assert '"winattn.integrations.fastvideo"' not in text and "class PostImportFinder" not in text


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)


def test_the_loader_does_not_import_the_publisher():
    p = _fresh("import sys, winattn, winattn.load, winattn.vendor, winattn.inspect_cmd, winattn.sources\n"
               "print(sorted(m for m in sys.modules if m in ('winattn.publish', 'winattn.card', 'winattn.build')))")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_build_toml_is_read_without_tomllib():
    """Python 3.10 has no tomllib: `winattn publish` reads build.toml with the tomlkit that kernels depends on.
    (kernels itself uses tomli there: it is imported first, then tomllib is hidden from winattn.)"""
    p = _fresh("import sys, kernels, kernels.compat, kernels.variants, kernels._rust\n"
               "sys.modules['tomllib'] = None  # as on Python 3.10\n"
               "from pathlib import Path\nfrom winattn.publish import read_build_config\n"
               f"print(read_build_config(Path({str(REPO_ROOT)!r})).name)")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "window-attention"
