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
    ("hash_variant", "digest.py"),  # computing a digest
    ("check_python_abi", "variant.py"),  # the abi3 rule
    ("validate", None),  # kernels' Digest.validate: checking is the loader's streaming hasher (digest.check_digest)
])
def test_one_implementation_of_each_variant_rule(helper, home):
    users = sorted(str(p.relative_to(WINATTN)) for p in _sources()
                   if ("attr", helper) in set(_calls_and_imports(p)))
    assert users == ([] if home is None else [home]), users


def test_the_snapshot_cache_path_is_spelled_once():
    spelled = sorted(str(p.relative_to(WINATTN)) for p in _sources() if '"snapshots"' in p.read_text())
    assert spelled == ["cache_layout.py"], spelled


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


# ----------------------------------------------------------------------------------------------------------------------
# kernels' private API has one door (`winattn/_kernels_private.py`, issue 31)

KERNELS_DOOR = WINATTN / "_kernels_private.py"


def _private_kernels_uses(path: Path) -> list:
    """`line: what` for each import of a private part of kernels (`kernels._x`, `from kernels.y import _z`), each
    private attribute read through a name bound to a kernels module, and each touch of `_loaded_kernels`."""
    tree = ast.parse(path.read_text(), str(path))
    kernels_names, uses = set(), []

    def is_private(dotted: str) -> bool:
        return any(part.startswith("_") and not part.startswith("__") for part in dotted.split("."))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "kernels":
                    kernels_names.add(alias.asname or "kernels")
                    if is_private(alias.name):
                        uses.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "kernels":
            for alias in node.names:
                kernels_names.add(alias.asname or alias.name)
                if is_private(f"{node.module}.{alias.name}"):
                    uses.append(f"{node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "_loaded_kernels" or \
                isinstance(node, ast.Name) and node.id == "_loaded_kernels":
            uses.append(f"{node.lineno}: _loaded_kernels")
        elif isinstance(node, ast.Attribute) and is_private(node.attr) and isinstance(node.value, ast.Name) \
                and node.value.id in kernels_names:
            uses.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return uses


def _package_sources():
    return sorted(WINATTN.rglob("*.py")) + sorted((REPO_ROOT / "torch-ext" / "window_attention").rglob("*.py"))


def test_only_the_kernels_door_uses_kernels_private_api():
    offenders = {str(p.relative_to(REPO_ROOT)): uses for p in _package_sources()
                 if p != KERNELS_DOOR and (uses := _private_kernels_uses(p))}
    assert offenders == {}, f"use winattn/_kernels_private.py instead: {offenders}"


def test_the_private_use_check_sees_what_it_guards():
    """The check finds the door's own private imports (so it is not vacuous), and the door resolves each of them
    against the installed kernels (an upgrade that renames one fails here, by name)."""
    uses = " ".join(_private_kernels_uses(KERNELS_DOOR))
    for name in ("_backend", "_resolve_variant_for_system", "_loaded_kernels", "_rust"):
        assert name in uses, name
    from winattn import _kernels_private

    assert all(value is not None for value in _kernels_private.resolve_all().values())


# ----------------------------------------------------------------------------------------------------------------------
# Import cycles among winattn modules (issue 31)

# Cycles that are deliberate, each with why. Empty: every winattn import goes one way.
ALLOWED_CYCLES: set = set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, modules: set) -> set:
    """The winattn modules `path` imports, at module level or inside functions. `from pkg import name` is an edge to
    `pkg.name` when that is a module, else to `pkg` (the implicit import of a parent package is not an edge)."""
    me = _module_name(path)
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    found = set()

    def closest(name: str):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                if node.level else node.module
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        found.update(m for m in map(closest, names) if m and m != me)
    return found


def _import_cycles() -> set:
    """Each strongly connected group of two or more modules, as a sorted tuple (Tarjan's algorithm, iteratively)."""
    paths = {_module_name(p): p for p in WINATTN.rglob("*.py")}
    graph = {m: sorted(_imported_modules(p, set(paths))) for m, p in paths.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    cycles.add(tuple(sorted(group)))
    return cycles


def test_no_import_cycle_outside_the_allow_list():
    assert _import_cycles() - ALLOWED_CYCLES == set()


def test_the_cycle_finder_sees_function_level_imports(tmp_path, monkeypatch):
    """The circle issue 31 removed (`variant.check_digest` imported `verify.digest_violations` inside the function)
    is found, so an empty result above means something."""
    fake = tmp_path / "winattn"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "variant.py").write_text("def check_digest():\n    from .verify import digest_violations\n")
    (fake / "verify.py").write_text("from .variant import check_digest\n")
    (fake / "load.py").write_text("from . import verify, variant\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "WINATTN", fake)
    assert _import_cycles() == {("winattn.variant", "winattn.verify")}
