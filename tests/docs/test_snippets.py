"""Every code block of README.md and docs/*.md runs as written, in a subprocess, against the embedded Hub.

One test per document runs its blocks in order in one working directory (a copy of the repository's files, with the
dev venv linked in as `.venv`), as a reader pasting them one after the other would: exported variables of a bash
block carry over to the next blocks, a `background` block (a server) keeps serving until the document is done. See
`snippets.py` for the markers. What a document needs besides what its own blocks do (`setup=published`) comes from
one Hub per session holding the signed CPU build, so the whole test takes well under a minute plus the README's own
CPU build.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .snippets import documents, doc_setup, extract

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS = documents(REPO_ROOT)
TOKEN = "docs-snippets-token"
BLOCK_TIMEOUT = 300
READY_TIMEOUT = 60


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def test_every_block_is_runnable_or_marked_with_a_reason():
    """Markers parse, and every skipped block says why (extract raises on an unknown marker)."""
    snippets = [s for doc in DOCS for s in extract(doc, REPO_ROOT)]
    assert len(snippets) >= 15
    for s in snippets:
        assert s.mark != "skip" or (s.reason and len(s.reason) > 10), s.id


@pytest.fixture(scope="session")
def published(built_variant, tmp_path_factory):
    """A Hub (trusting `winattn`) holding the CPU build, signed; yields (url, public key path)."""
    from winattn.hub import HubServer
    from winattn.publish import publish
    from winattn.signing import generate_keypair

    work = tmp_path_factory.mktemp("docs-hub")
    build = work / "build"
    shutil.copytree(built_variant, build / built_variant.name,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "metadata.json.sigstore"))
    generate_keypair(work / "key.pem", work / "key.pub.pem")
    with HubServer(work / "store", tokens=[TOKEN], trusted_orgs=["winattn"]) as hub:
        publish("winattn/window-attention", build_dir=build, endpoint=hub.url, token=TOKEN,
                signing_key=work / "key.pem", repo_root=REPO_ROOT)
        yield hub.url, work / "key.pub.pem"


def _workspace(dest: Path) -> Path:
    """The repository's files (tracked and untracked-but-not-ignored, as a clone plus local edits), no build/."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO_ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO_ROOT / rel
        if rel == ".venv" or not src.is_file() or src.is_symlink():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    (dest / ".venv").symlink_to((REPO_ROOT / ".venv").resolve())
    return dest


def _base_env(ws: Path, home: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "KERNELS_", "LOCAL_KERNELS", "WINATTN_", "DIFFUSERS_", "PYTEST"))}
    venv_bin = str(ws / ".venv" / "bin")
    env.update(HOME=str(home), HF_HOME=str(home / "hf"), WINATTN_CACHE=str(home / "winattn"),
               PATH=f"{venv_bin}{os.pathsep}{env.get('PATH', '')}",
               # The copy's winattn, ahead of the venv's editable install (which may point at another checkout).
               PYTHONPATH=str(ws), PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
    return env


def _read_env(path: Path) -> dict:
    out = {}
    for item in path.read_bytes().split(b"\0"):
        if b"=" in item:
            k, v = item.decode().split("=", 1)
            out[k] = v
    return out


def _start_background(code: str, ws: Path, env: dict) -> subprocess.Popen:
    """Start a server block; return once it prints its ready line ("Press Ctrl-C"), as a reader would wait."""
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", code], cwd=ws, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen, deadline = [], time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            seen.append(lines.get(timeout=0.5))
        except queue.Empty:
            continue
        if "Press Ctrl-C" in seen[-1]:
            return proc
    os.killpg(proc.pid, signal.SIGKILL)
    time.sleep(0.2)
    while not lines.empty():
        seen.append(lines.get())
    raise AssertionError("background block never became ready:\n" + "".join(seen))


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_document_snippets_run_as_written(doc, tmp_path, request):
    snippets = extract(doc, REPO_ROOT)
    ws = _workspace(tmp_path / "repo")
    env = _base_env(ws, tmp_path / "home")
    setup = doc_setup(doc)
    if setup in ("published", "published+key"):
        url, public_key = request.getfixturevalue("published")
        env.update(HF_ENDPOINT=url, HF_TOKEN=TOKEN)
        if setup == "published+key":
            shutil.copy(public_key, ws / "signing-key.pub.pem")
    state = tmp_path / "env.bin"
    background: list[subprocess.Popen] = []
    ran, skipped = [], []
    try:
        for s in snippets:
            needs = {"gpu": 1, "multi-gpu": 2}.get(s.mark, 0)
            if s.mark == "skip" or _gpus() < needs:
                skipped.append(f"{s.id} ({s.reason or s.mark})")
                continue
            if s.mark == "background":
                background.append(_start_background(s.code, ws, env))
                ran.append(s.id)
                continue
            if s.lang == "bash":
                cmd = ["bash", "-euo", "pipefail", "-c", f"{s.code}\nenv -0 > {state}\n"]
            else:
                script = tmp_path / f"snippet_{s.line}.py"
                script.write_text(s.code)
                cmd = [shutil.which("python", path=env["PATH"]) or sys.executable, str(script)]
            t0 = time.monotonic()
            r = subprocess.run(cmd, cwd=ws, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
            assert r.returncode == 0, (
                f"{s.id} ({s.lang}) failed with exit {r.returncode} after {time.monotonic() - t0:.1f} s:\n"
                f"--- block ---\n{s.code}--- stdout ---\n{r.stdout[-4000:]}--- stderr ---\n{r.stderr[-4000:]}"
            )
            if s.lang == "bash":
                env = _read_env(state)
            ran.append(s.id)
    finally:
        for proc in background:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    print(f"{doc.name}: ran {len(ran)}: {', '.join(ran)}; skipped {len(skipped)}: {'; '.join(skipped)}")
    if not ran:
        pytest.skip(f"every block of {doc.name} is marked: {'; '.join(skipped)}")
