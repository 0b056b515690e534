"""Fill the Hub card (`CARD.md` at the repo root, `{{placeholder}}` syntax) that `winattn publish` uploads as README.md.

Placeholders: `repo_id`, `name`, `version`, `license`, `functions`, `variants`, `benchmarks`, `signing`. An unknown or
unfilled placeholder is an error, so the template and this module cannot drift apart silently.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from .errors import PublishError

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
CARD_TEMPLATE = "CARD.md"
SIGNATURE_FILENAME = "metadata.json.sigstore"  # same as winattn.signing.SIGNATURE_FILENAME (not imported: light)


def fill_card(template: str, values: dict[str, str]) -> str:
    """Replace every `{{name}}` in `template` with `values[name]`; raise PublishError on an unknown placeholder."""
    missing = sorted({m.group(1) for m in PLACEHOLDER.finditer(template)} - values.keys())
    if missing:
        raise PublishError(f"card template has placeholders with no value: {', '.join(missing)}")
    return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), template)


def _module_file(package_dir: Path, module: str) -> Path | None:
    rel = Path(*module.split("."))
    for candidate in (package_dir / rel.with_suffix(".py"), package_dir / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _summary(docstring: str | None) -> str:
    return (docstring or "").strip().split("\n\n")[0].replace("\n", " ").strip()


def _parse(source: str) -> ast.Module:
    """`ast.parse`, tried again on CPython 3.11's spurious "AST constructor recursion depth mismatch" SystemError.

    That interpreter keeps the AST builder's depth counter per interpreter, not per thread (gh-106905): another thread
    printing a traceback (3.11's traceback printer calls `ast.parse` for its `^^^` marks) while this one parses trips
    it. The parse is deterministic, so one retry gives the real answer.
    """
    try:
        return ast.parse(source)
    except SystemError as e:
        if "recursion depth mismatch" not in str(e):
            raise
        return ast.parse(source)


def _definition_summary(module_file: Path, name: str) -> str:
    tree = _parse(module_file.read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return _summary(ast.get_docstring(node))
    return ""


def api_functions(variant_dir: Path) -> list[tuple[str, str]]:
    """`(name, one-line summary)` for each name in `__all__` of the variant's `__init__.py`, read without importing.

    Summaries come from the docstring of the function/class (followed through `from .mod import name`) or of the
    submodule (`from . import reference`).
    """
    init = Path(variant_dir) / "__init__.py"
    tree = _parse(init.read_text())
    names: list[str] = []
    origins: dict[str, tuple[str, str | None]] = {}  # exported name -> (module, attribute or None for a module)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            names = [str(n) for n in ast.literal_eval(node.value)]
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            for alias in node.names:
                exported = alias.asname or alias.name
                origins[exported] = (node.module, alias.name) if node.module else (alias.name, None)
    result = []
    for name in names:
        summary = ""
        if name in origins:
            module, attr = origins[name]
            module_file = _module_file(init.parent, module)
            if module_file is not None:
                if attr is None:
                    summary = _summary(ast.get_docstring(_parse(module_file.read_text())))
                else:
                    summary = _definition_summary(module_file, attr)
        else:
            summary = _definition_summary(init, name)
        result.append((name, summary))
    return result


def functions_markdown(functions: list[tuple[str, str]]) -> str:
    if not functions:
        return "_This kernel exports no functions (`__all__` is empty)._"
    return "\n".join(f"- `{name}`" + (f": {summary}" if summary else "") for name, summary in functions)


def variants_markdown(variant_dirs: list[Path], signed: set[str] | None = None) -> str:
    """The variants table. `signed`: names of the variants published with a signature (default: those holding one)."""
    from kernels import Metadata

    signed = _signed_names(variant_dirs, signed)
    rows = ["| Variant | Backend | Architectures | Signed |", "|---|---|---|---|"]
    for vdir in sorted(variant_dirs, key=lambda p: p.name):
        meta = Metadata.read_from_file(str(vdir / "metadata.json"))
        archs = ", ".join(meta.backend.archs or []) or "–"
        rows.append(f"| `{vdir.name}` | {str(meta.backend.backend_type).split('.')[-1].lower()} | {archs} | "
                    f"{'yes' if vdir.name in signed else 'no'} |")
    dirty = dirty_variants(variant_dirs)
    if dirty:
        rows.append(
            f"\n> **Note:** {', '.join(f'`{d}`' for d in dirty)} "
            + ("was" if len(dirty) == 1 else "were")
            + " built from a dirty git tree (uncommitted changes): the recorded commit does not fully identify the "
            "sources."
        )
    return "\n".join(rows)


def _signed_names(variant_dirs: list[Path], signed: set[str] | None) -> set[str]:
    if signed is not None:
        return set(signed)
    return {v.name for v in variant_dirs if (v / SIGNATURE_FILENAME).is_file()}


def dirty_variants(variant_dirs: list[Path]) -> list[str]:
    """Names of the variants whose metadata.json provenance says they were built from a dirty tree."""
    from kernels import Metadata

    out = []
    for vdir in sorted(variant_dirs, key=lambda p: p.name):
        provenance = Metadata.read_from_file(str(vdir / "metadata.json")).provenance
        if provenance is not None and provenance.dirty:
            out.append(vdir.name)
    return out


def benchmark_summary(repo_root: Path, repo_id: str, version: int, *, max_lines: int = 60) -> str:
    """benchmarks/RESULTS.md without its title (first `max_lines` lines), or a note that none were published; where
    the results and the workloads are on the Hub (`main`, beside this card: `winattn publish` puts them there)."""
    bench = Path(repo_root) / "benchmarks"
    results = bench / "RESULTS.md"
    workloads = sorted(p.name for p in bench.glob("benchmark*.py")) if bench.is_dir() else []
    files = ", ".join(f"`benchmarks/{name}`" for name in (["RESULTS.md"] if results.is_file() else []) + workloads)
    where = f"{files} {'is' if ', ' not in files else 'are'} on branch `main`, beside this card." if files else ""
    note = (f"(`kernels benchmark {repo_id}@v{version}` cannot run them with kernels 0.17.2: it downloads the "
            "repository as a model repository, and this is a kernel repository.)")
    if not results.is_file():
        return " ".join(filter(None, ["No benchmark results were published with this version.", where,
                                      note if workloads else ""]))
    lines = results.read_text().strip().splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    # Demote headings so they nest under the card's "Benchmarks" section.
    lines = ["#" + line if line.startswith("#") else line for line in lines]
    text = "\n".join(lines).strip()
    if len(lines) > max_lines:
        text = "\n".join(lines[:max_lines]).rstrip()
        text += "\n\n_(truncated: the full results are `benchmarks/RESULTS.md` on branch `main`)_"
    return f"{text}\n\n{where}" + (f" {note}" if workloads else "")


def signing_markdown(variant_dirs: list[Path], signed: set[str] | None = None, *, repo_id: str = "REPO_ID",
                     version: int = 1, signer: str | None = None) -> str:
    """The card's "Integrity" section: what this release's variants carry and who checks it.

    `signed`: names of the variants published with a signature (default: those holding one in `variant_dirs`;
    `winattn publish` signs in a staging copy and passes them); `signer`: the signing key's fingerprint.
    """
    signed = _signed_names(variant_dirs, signed)
    digest = ("`metadata.json` of each variant lists the sha256 of every other file of the variant; `winattn.load` "
              "and `winattn verify` check those digests before anything is imported (`kernels.get_kernel` 0.17.2 "
              "checks neither digests nor signatures).")
    if not signed:
        return f"The variants of this version are **not signed**: integrity rests on the pinned commit. {digest}"
    scope = "Every variant is" if len(signed) == len(variant_dirs) else \
        f"{len(signed)} of {len(variant_dirs)} variants ({', '.join(f'`{n}`' for n in sorted(signed))}) are"
    by = f" by the key with fingerprint `{signer}`" if signer else ""
    return (
        f"{scope} **signed**{by}: `build/<variant>/{SIGNATURE_FILENAME}` is an OpenSSF model-signing bundle (EC "
        f"P-256 key, made offline) over `metadata.json` and a statement naming `{repo_id}`, version {version} and "
        f"the variant. {digest}\n\n"
        "Check a signature with the publisher's public key (PEM), which only the publisher can give you:\n\n"
        "```bash\n"
        f"winattn verify {repo_id} --version {version} --public-key publisher.pub.pem --require-signature\n"
        "```\n\n"
        f"or load with `winattn.load(\"{repo_id}\", version={version}, public_keys=[\"publisher.pub.pem\"], "
        "require_signature=True)`; both refuse a build signed for another repository, version or variant. "
        f"`kernels verify-signature` cannot check these bundles: it accepts only Sigstore certificates issued to "
        "Hugging Face's own CI and reports a key-based bundle as \"invalid signature bundle: expected certificate\" "
        "(a different kind of signature, not tampering)."
    )


def render_card(
    repo_root: Path,
    *,
    repo_id: str,
    name: str,
    version: int,
    license: str,
    variant_dirs: list[Path],
    template: Path | None = None,
    signed: set[str] | None = None,
    signer: str | None = None,
) -> str:
    """The README.md for `main`: CARD.md (or `template`) filled from the build config and the variants.

    `signed` names the variants this release signs (default: those holding a signature in `variant_dirs`), `signer`
    is the key's fingerprint."""
    template = Path(template) if template else Path(repo_root) / CARD_TEMPLATE
    if template.is_symlink():
        # The card is published as main's README.md: a linked CARD.md published the file it points at.
        raise PublishError(f"card template {template} is a link: publish uploads only the repository's own files; "
                           "replace it by the file")
    if not template.is_file():
        raise PublishError(f"card template {template} is missing")
    if not variant_dirs:
        raise PublishError("cannot fill the card: no variants")
    functions = api_functions(sorted(variant_dirs, key=lambda p: p.name)[0])
    return fill_card(
        template.read_text(),
        {
            "repo_id": repo_id,
            "name": name,
            "version": str(version),
            "license": license.lower(),
            "functions": functions_markdown(functions),
            "variants": variants_markdown(variant_dirs, signed),
            "benchmarks": benchmark_summary(repo_root, repo_id, version),
            "signing": signing_markdown(variant_dirs, signed, repo_id=repo_id, version=version, signer=signer),
        },
    )
