"""Shared pieces of the loader security tests (tests/security/test_loader_*.py).

The Hub, build, key and cache fixtures are the loader tests' own (tests/loader/conftest.py), re-exported here so
that each attack runs against the same real parts: the embedded Hub on 127.0.0.1, the real CPU build, real
`winattn publish` and real huggingface_hub / kernels clients. An attack that must prove what ran in a process runs
in a fresh interpreter (`run_attack`), whose result carries `pwned`: what the attacker's code wrote when it ran.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

from loader.conftest import (  # noqa: F401  (fixtures and helpers re-exported for the tests)
    REPO,
    REPO_ROOT,
    TOKEN,
    assert_nothing_imported,
    build_maker,
    hf_cache,
    hub,
    isolate_cache,
    keys,
    make_build,
    no_network,
    offline,
    publish_build,
    push,
    run_script,
    start_hub,
    variant_files,
)

CHILD = Path(__file__).with_name("_loader_child.py")

# Appended to an attacker's copy of a kernel file: proves that the copy ran (the module still works).
PAYLOAD = b'\nimport os as _o\nopen(_o.environ.get("WINATTN_PWNED", "/dev/null"), "a").write("pwned\\n")\n'


def run_attack(cases: list, *, pwned: Path, setup: str = "", env: dict | None = None, timeout: int = 180) -> list:
    """Run the cases in ONE fresh interpreter (see _loader_child.py) with $WINATTN_PWNED = `pwned`."""
    return run_script(CHILD, {"setup": setup, "cases": cases}, env=dict(env or {}, WINATTN_PWNED=str(pwned)),
                      timeout=timeout)


def b64_sha256(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def write_digest(variant_dir: Path) -> None:
    """Recompute metadata.json's digest over the regular files of `variant_dir` (what a forger does)."""
    meta = json.loads((variant_dir / "metadata.json").read_text())
    files = {}
    for p in sorted(variant_dir.rglob("*")):
        rel = p.relative_to(variant_dir).as_posix()
        if p.is_symlink() or not p.is_file() or rel in ("metadata.json", "metadata.json.sigstore"):
            continue
        if "__pycache__" in rel.split("/"):
            continue
        files[rel] = b64_sha256(p.read_bytes())
    meta["digest"] = {"algorithm": "sha256", "files": files}
    (variant_dir / "metadata.json").write_text(json.dumps(meta, indent=2))


def evil_package(variant_dir: Path, dest: Path) -> Path:
    """An attacker's copy of a real variant (same op namespace, working kernel) whose `__init__.py` runs PAYLOAD,
    with a digest matching its own files (so `kernels` would accept it on its own)."""
    shutil.copytree(variant_dir, dest, symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "metadata.json.sigstore"))
    init = dest / "__init__.py"
    init.write_bytes(init.read_bytes() + PAYLOAD)
    write_digest(dest)
    return dest


def statuses(module) -> dict:
    return {c.name: c.status for c in module.__winattn_info__.checks}
