"""Fixtures of the publish/sign/vendor tests: hand-made variants, key pairs and an embedded Hub on 127.0.0.1.

Hand-made variants (a tiny abi3 C extension plus Python files and a real digest) keep the checks' tests fast and
independent of the kernel build; the end-to-end tests use the real CPU build (`built_variant`, tests/conftest.py).
"""

import base64
import hashlib
import json
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from hub_clients import point_clients_at, running_hub  # noqa: F401  (re-exported for the tests)

REPO_ROOT = Path(__file__).resolve().parents[2]
FAKE_VARIANT = "torch-stable-abi210-cpu-x86_64-linux"

_ABI3_C = r"""
#define Py_LIMITED_API 0x03090000
#include <Python.h>
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_fake", NULL, -1, NULL};
PyMODINIT_FUNC PyInit__fake(void) { return PyModule_Create(&mod); }
"""

_INIT_PY = '''"""Fake window-attention variant for publish tests."""

from ._ops import ops
from . import helpers

__all__ = ["attention", "helpers"]


def attention(q, k, v):
    """Fake fused attention.

    More text.
    """
    return q
'''


def write_digest(variant_dir: Path, metadata: dict) -> None:
    """Write metadata.json with a fresh sha256 digest of the variant's files (as kernel-builder does)."""
    files = {}
    for path in sorted(variant_dir.rglob("*")):
        rel = path.relative_to(variant_dir).as_posix()
        if path.is_dir() or rel in ("metadata.json", "metadata.json.sigstore") or "__pycache__" in rel.split("/"):
            continue
        files[rel] = base64.b64encode(hashlib.sha256(path.read_bytes()).digest()).decode()
    metadata = dict(metadata, digest={"algorithm": "sha256", "files": files})
    (variant_dir / "metadata.json").write_text(json.dumps(metadata, indent=2))


@pytest.fixture(scope="session")
def abi3_so(tmp_path_factory) -> Path:
    """A minimal limited-API extension module compiled with the host C compiler."""
    d = tmp_path_factory.mktemp("abi3")
    (d / "fake.c").write_text(_ABI3_C)
    out = d / "_fake.abi3.so"
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    inc = sysconfig.get_paths()["include"]
    subprocess.run([cc, "-shared", "-fPIC", "-O1", f"-I{inc}", str(d / "fake.c"), "-o", str(out)], check=True)
    return out


@pytest.fixture
def make_variant(abi3_so):
    """make_variant(build_dir, name=FAKE_VARIANT, version=1) -> a complete, checkable variant dir."""

    def make(build_dir: Path, name: str = FAKE_VARIANT, version: int = 1) -> Path:
        v = Path(build_dir) / name
        v.mkdir(parents=True)
        (v / "__init__.py").write_text(_INIT_PY)
        (v / "helpers.py").write_text('"""Helper module."""\n')
        (v / "_ops.py").write_text("import torch\nops = torch.ops._window_attention_cpu_fake\n")
        shutil.copy(abi3_so, v / "_window_attention_cpu_fake.abi3.so")
        write_digest(
            v,
            {
                "id": "_window_attention_cpu_fake",
                "name": "window-attention",
                "version": version,
                "license": "Apache-2.0",
                "python-depends": [],
                "backend": {"type": "cpu"},
            },
        )
        return v

    return make


@pytest.fixture(scope="session")
def keypair(tmp_path_factory):
    from winattn.signing import generate_keypair

    d = tmp_path_factory.mktemp("keys")
    generate_keypair(d / "signing.pem", d / "signing.pub")
    return d / "signing.pem", d / "signing.pub"


@pytest.fixture(scope="session")
def other_keypair(tmp_path_factory):
    from winattn.signing import generate_keypair

    d = tmp_path_factory.mktemp("other-keys")
    generate_keypair(d / "other.pem", d / "other.pub")
    return d / "other.pem", d / "other.pub"


# ---------------------------------------------------------------------------------------------------------------
# Embedded Hub and the real clients pointed at it

TOKEN = "publish-test-token"
REPO = "winattn/window-attention"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A HubServer on 127.0.0.1 (token TOKEN, org `winattn` trusted); `hub.env` = environment for subprocesses."""
    with running_hub(tmp_path / "hub-store", token=TOKEN, trusted_orgs=["winattn"], home=tmp_path / "hf-home",
                     monkeypatch=monkeypatch) as server:
        yield server


@pytest.fixture
def api(hub):
    from huggingface_hub import HfApi

    return HfApi(endpoint=hub.url, token=TOKEN)


@pytest.fixture
def src_root(tmp_path) -> Path:
    """A kernel source root: the repo's build.toml and CARD.md, and benchmarks/ this test controls (empty)."""
    root = tmp_path / "src"
    (root / "benchmarks").mkdir(parents=True)
    for name in ("build.toml", "CARD.md"):
        shutil.copy(REPO_ROOT / name, root / name)
    return root


@pytest.fixture
def build_copy(tmp_path, built_variant) -> Path:
    """tmp build dir holding a copy of the real CPU variant (tests may edit or sign it)."""
    build = tmp_path / "build"
    shutil.copytree(built_variant, build / built_variant.name, ignore=shutil.ignore_patterns("__pycache__"))
    return build


def redigest(variant_dir: Path) -> None:
    """Recompute metadata.json's digest after editing a variant's files (keeps every other field)."""
    meta = json.loads((variant_dir / "metadata.json").read_text())
    meta.pop("digest", None)
    write_digest(variant_dir, meta)
