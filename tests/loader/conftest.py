"""Fixtures of the loader tests: a real embedded Hub on 127.0.0.1, the real CPU build, signing keys, an isolated
Hugging Face cache per test, and `run_child`, which runs loads in a fresh interpreter and reports what got imported.

Why a fresh interpreter for refusals: every copy of the CPU build registers the same op namespace, so once any test
of the session has imported it, "nothing was imported" can only be proven in a process that never saw it. The child
(`_child.py`) reports, after each load attempt: `sys.modules` entries of the op namespace, the ops registered under
it in torch's dispatcher (`torch._C._dispatch_get_all_op_names()`), shared objects of the kernel mapped into the
process (`/proc/self/maps`), and kernels' registry of imported variants. A successful load in the same harness shows
all four light up, so the evidence is not vacuous.

Cache isolation: huggingface_hub copies HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE, HF_ENDPOINT... into
`huggingface_hub.constants` at import; kernels 0.17.2 reads those through the `constants` module at call time, except
KERNELS_CACHE, which it copies at import (`kernels.hf_hub.CACHE_DIR`, re-bound by name in kernels.resolver and
kernels.install) — so tests unset KERNELS_CACHE and patch the constants; children inherit the environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKEN = "hf_winattn_test_token"
TRUSTED_ORG = "winattn"
UNTRUSTED_ORG = "evil"
REPO = "winattn/window-attention"
CHILD = Path(__file__).with_name("_child.py")


# ----------------------------------------------------------------------------------------------------------------------
# Environment


def _hf_env(root: Path) -> dict:
    return {
        "HF_HOME": str(root / "hf-home"),
        "HF_HUB_CACHE": str(root / "hf-home" / "hub"),
        "WINATTN_CACHE": str(root / "winattn-cache"),
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_XET": "1",
        "HF_TOKEN_PATH": str(root / "hf-home" / "token"),
    }


@pytest.fixture
def hf_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache for this test, in the environment (for children) and in huggingface_hub's
    constants (read once at import, so the environment alone would not reach this process)."""
    return isolate_cache(monkeypatch, tmp_path)


def isolate_cache(monkeypatch, root: Path) -> Path:
    from huggingface_hub import constants

    env = _hf_env(root)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in ("KERNELS_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HF_ENDPOINT", "LOCAL_KERNELS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(constants, "HF_HOME", env["HF_HOME"])
    monkeypatch.setattr(constants, "HF_HUB_CACHE", env["HF_HUB_CACHE"])
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", env["HF_TOKEN_PATH"])
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_PROGRESS_BARS", True)
    return Path(env["HF_HUB_CACHE"])


@pytest.fixture
def offline(monkeypatch):
    """Switch huggingface_hub (and so kernels and winattn) to offline mode for the rest of the test."""

    def go():
        from huggingface_hub import constants

        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    return go


@pytest.fixture
def no_network(monkeypatch):
    """Make every socket connection attempt in this process fail (and record it)."""
    import socket

    attempts = []

    def refuse(self, address, *args, **kwargs):
        attempts.append(address)
        raise OSError(f"network access blocked by the test: connect({address!r})")

    def block():
        monkeypatch.setattr(socket.socket, "connect", refuse)
        monkeypatch.setattr(socket.socket, "connect_ex", refuse)
        return attempts

    return block


# ----------------------------------------------------------------------------------------------------------------------
# Hub, build, keys


def start_hub(root: Path):
    """A running HubServer on 127.0.0.1 over `root` (trusted org "winattn"; "evil" is not trusted)."""
    from winattn.hub import HubServer

    return HubServer(root, tokens=[TOKEN], trusted_orgs=[TRUSTED_ORG]).start()


@pytest.fixture
def hub(tmp_path):
    """The loader tests' Hub: this process's clients are not pointed at it (loads pass `endpoint=`)."""
    from hub_clients import running_hub

    with running_hub(tmp_path / "hub-root", token=TOKEN, trusted_orgs=[TRUSTED_ORG]) as srv:
        yield srv


@pytest.fixture(scope="session")
def keys(tmp_path_factory):
    """Two key pairs: `good` (trusted by the loads) and `other` (a forger's)."""
    from winattn.signing import generate_keypair

    d = tmp_path_factory.mktemp("keys")
    out = {}
    for name in ("good", "other"):
        generate_keypair(d / f"{name}.priv", d / f"{name}.pub")
        out[name] = (d / f"{name}.priv", d / f"{name}.pub")
    return out


class Build:
    """A private copy of the real CPU build (`built_variant`), safe to sign and tamper with."""

    def __init__(self, root: Path, variant_dir: Path):
        self.dir = root / "build"
        shutil.copytree(variant_dir, self.dir / variant_dir.name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "metadata.json.sigstore"))
        self.variant = variant_dir.name
        self.variant_dir = self.dir / self.variant
        self.so_name = next(p.name for p in self.variant_dir.glob("*.abi3.so"))

    def path_in_repo(self, rel: str) -> str:
        return f"build/{self.variant}/{rel}"


def build_maker(built_variant, root: Path):
    count = [0]

    def make() -> Build:
        count[0] += 1
        return Build(root / f"build-copy-{count[0]}", built_variant)

    return make


@pytest.fixture
def make_build(built_variant, tmp_path):
    return build_maker(built_variant, tmp_path)


def publish_build(srv, build: Build, repo_id: str = REPO, signing_key=None) -> str:
    """The real `winattn publish` of `build` to `repo_id` branch v1; returns the commit sha."""
    from winattn.publish import publish

    if signing_key is None:
        (build.variant_dir / "metadata.json.sigstore").unlink(missing_ok=True)
    commit = publish(repo_id, build_dir=build.dir, endpoint=srv.url, token=TOKEN, signing_key=signing_key,
                     repo_root=REPO_ROOT)
    if signing_key is not None:
        # publish signs a staging copy and leaves build/ as it was; tests that reuse "the genuine signed files"
        # (variant_files) get the signature that was uploaded.
        from huggingface_hub import HfApi

        sig = HfApi(endpoint=srv.url, token=TOKEN).hf_hub_download(
            repo_id, build.path_in_repo("metadata.json.sigstore"), repo_type="kernel", revision=commit,
            cache_dir=build.dir.parent / ".sig-cache")
        (build.variant_dir / "metadata.json.sigstore").write_bytes(Path(sig).read_bytes())
    return commit


def push(srv, repo_id: str, files: dict, *, delete=(), revision: str = "v1", message: str = "test push") -> str:
    """Commit raw files (path_in_repo -> bytes) to a branch, bypassing `winattn publish`'s checks."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi

    api = HfApi(endpoint=srv.url, token=TOKEN)
    api.create_repo(repo_id, repo_type="kernel", exist_ok=True)
    if revision != "main":
        api.create_branch(repo_id, branch=revision, repo_type="kernel", exist_ok=True)
    ops = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=data) for p, data in files.items()]
    ops += [CommitOperationDelete(path_in_repo=p) for p in delete]
    return api.create_commit(repo_id, ops, commit_message=message, repo_type="kernel", revision=revision).oid


def variant_files(build: Build, signature: bool = True) -> dict:
    """path_in_repo -> bytes of every file of the build's variant."""
    out = {}
    for p in sorted(build.variant_dir.rglob("*")):
        if p.is_file() and (signature or p.name != "metadata.json.sigstore"):
            out[build.path_in_repo(p.relative_to(build.variant_dir).as_posix())] = p.read_bytes()
    return out


# ----------------------------------------------------------------------------------------------------------------------
# Child processes


def run_script(script: Path, payload, *, env: dict | None = None, timeout: int = 120) -> list:
    """Run `script` in a fresh interpreter with `payload` as JSON on stdin, this process's environment (+ `env`) and
    the repo on PYTHONPATH; returns the "results" of the last JSON line it prints, each with the child's stderr."""
    child_env = dict(os.environ, **(env or {}))
    paths = [str(REPO_ROOT)] + [p for p in child_env.get("PYTHONPATH", "").split(os.pathsep) if p]
    child_env["PYTHONPATH"] = os.pathsep.join(paths)
    proc = subprocess.run([sys.executable, str(script)], input=json.dumps(payload), capture_output=True, text=True,
                          env=child_env, timeout=timeout, cwd=REPO_ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"child failed (rc {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    results = json.loads(lines[-1])["results"]
    for r in results:
        r["stderr"] = proc.stderr
    return results


def run_child(cases: list, *, timeout: int = 120) -> list:
    """Run `winattn.load(**case["kwargs"])` (or `kernels.get_kernel`, see _child.py) for each case in ONE fresh
    interpreter, sequentially, with this process's environment; returns one result dict per case."""
    return run_script(CHILD, cases, timeout=timeout)


def assert_nothing_imported(result: dict) -> None:
    ev = result["evidence"]
    assert ev["modules"] == [], ev
    assert ev["ops"] == [], ev
    assert ev["mapped"] == [], ev
    assert ev["kernels_loaded"] == [], ev
