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
import re
import shutil
import signal
import socket
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
README_PORT = 8000  # the port the README's walkthrough names; its blocks run on a free port instead


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def on_port(code: str, port: int) -> str:
    """`code` with the README's literal port (`--port 8000`, `127.0.0.1:8000`) replaced by `port`, so that the
    walkthrough runs on a machine where something already listens on 8000."""
    return re.sub(rf"(--port |127\.0\.0\.1:){README_PORT}\b", rf"\g<1>{port}", code)


def _stop(proc: subprocess.Popen) -> None:
    """Stop a background block's process group (one already gone is fine)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=10)
            break
        except subprocess.TimeoutExpired:
            continue


def start_background(code: str, ws: Path, env: dict) -> subprocess.Popen:
    """Start a server block; return once it prints its ready line ("Press Ctrl-C"), as a reader would wait. A block
    that exits or never gets ready fails with its own output (e.g. the server's "address already in use")."""
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", code], cwd=ws, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True)
    reader.start()
    seen, deadline = [], time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            seen.append(lines.get(timeout=0.5))
        except queue.Empty:
            continue
        if "Press Ctrl-C" in seen[-1]:
            return proc
    exited = proc.poll()
    _stop(proc)
    reader.join(timeout=5)
    while not lines.empty():
        seen.append(lines.get())
    why = f"exited with code {exited}" if exited is not None else f"was not ready after {READY_TIMEOUT} s"
    raise AssertionError(f"background block {why}:\n--- block ---\n{code}--- output ---\n" + "".join(seen))


def run_blocks(snippets, ws: Path, env: dict, tmp_path: Path, *, port: int | None = None) -> tuple[list, list]:
    """Run `snippets` in order in `ws` as a reader pasting them would (exports carry over, background blocks serve
    until the end); `port` replaces the README's literal port. Returns (ran, skipped) ids."""
    state = tmp_path / "env.bin"
    background: list[subprocess.Popen] = []
    ran, skipped = [], []
    try:
        for s in snippets:
            needs = {"gpu": 1, "multi-gpu": 2}.get(s.mark, 0)
            if s.mark == "skip" or _gpus() < needs:
                skipped.append(f"{s.id} ({s.reason or s.mark})")
                continue
            code = on_port(s.code, port) if port is not None else s.code
            if s.mark == "background":
                background.append(start_background(code, ws, env))
                ran.append(s.id)
                continue
            if s.lang == "bash":
                cmd = ["bash", "-euo", "pipefail", "-c", f"{code}\nenv -0 > {state}\n"]
            else:
                script = tmp_path / f"snippet_{s.line}.py"
                script.write_text(code)
                cmd = [shutil.which("python", path=env["PATH"]) or sys.executable, str(script)]
            t0 = time.monotonic()
            r = subprocess.run(cmd, cwd=ws, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
            assert r.returncode == 0, (
                f"{s.id} ({s.lang}) failed with exit {r.returncode} after {time.monotonic() - t0:.1f} s:\n"
                f"--- block ---\n{code}--- stdout ---\n{r.stdout[-4000:]}--- stderr ---\n{r.stderr[-4000:]}"
            )
            if s.lang == "bash":
                env = _read_env(state)
            ran.append(s.id)
    finally:
        for proc in background:
            _stop(proc)
    return ran, skipped


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
    ran, skipped = run_blocks(snippets, ws, env, tmp_path, port=free_port())
    print(f"{doc.name}: ran {len(ran)}: {', '.join(ran)}; skipped {len(skipped)}: {'; '.join(skipped)}")
    if not ran:
        pytest.skip(f"every block of {doc.name} is marked: {'; '.join(skipped)}")


def test_the_readme_walkthrough_runs_on_a_free_port():
    """The README names port 8000; the test runs its server and clients on a free one (something may listen on 8000)."""
    blocks = [s.code for s in extract(REPO_ROOT / "README.md", REPO_ROOT) if str(README_PORT) in s.code]
    assert len(blocks) >= 2  # the server and the clients' HF_ENDPOINT
    for code in blocks:
        moved = on_port(code, 54321)
        assert str(README_PORT) not in moved and "54321" in moved


def test_a_background_block_that_fails_shows_its_own_output(tmp_path):
    """A server block that exits (e.g. its port is taken) fails the test with the server's message, not with an
    error of the test's own teardown."""
    code = ("echo 'winattn hub serve: error: cannot listen on 127.0.0.1:8000: [Errno 98] Address already in use'\n"
            "exit 1\n")
    with pytest.raises(AssertionError, match=r"(?s)exited with code 1.*Address already in use"):
        start_background(code, tmp_path, dict(os.environ))


def test_hub_card_snippets_run_as_written(published, tmp_path):
    """The card `winattn publish` put on main, read from the Hub as a user would, says what the release carries
    (signed, by which key) and every code block of it runs as written, on a machine that holds nothing but the
    publisher's public key (`publisher.pub.pem`, as the card names it)."""
    from huggingface_hub import hf_hub_download

    from winattn.signing import public_key_fingerprint

    url, public_key = published
    card_dir = tmp_path / "card"
    card = Path(hf_hub_download("winattn/window-attention", "README.md", repo_type="kernel", revision="main",
                                endpoint=url, local_dir=card_dir))
    text = card.read_text()
    integrity = text.split("## Integrity\n", 1)[1].split("\n## ", 1)[0].strip()
    variants = text.split("## Variants", 1)[1].split("\n## ", 1)[0]
    assert integrity.startswith("Every variant is **signed** by the key with fingerprint "
                                f"`sha256:{public_key_fingerprint(public_key)}`")
    assert "kernels verify-signature` cannot check these bundles" in integrity
    assert "| yes |" in variants and "| no |" not in variants
    ws = tmp_path / "user"
    ws.mkdir()
    shutil.copy(public_key, ws / "publisher.pub.pem")
    env = _base_env(ws, tmp_path / "home")
    env.update(HF_ENDPOINT=url, PYTHONPATH=str(REPO_ROOT),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]]))
    snippets = extract(card, card_dir)
    ran, skipped = run_blocks(snippets, ws, env, tmp_path)
    assert len(ran) == len(snippets) >= 5 and not skipped
    assert (ws / "vendor" / "window-attention.lock").is_file()


def test_what_the_readme_walkthrough_writes_is_git_ignored():
    """token.txt and the private key must never be committed by a later `git add -A`."""
    written = ["token.txt", "signing-key.pem", "signing-key.pub.pem", "hub-store/", "vendor/", "downloaded/"]
    readme = (REPO_ROOT / "README.md").read_text()
    assert all(name.rstrip("/") in readme for name in written)
    r = subprocess.run(["git", "check-ignore", "--no-index", "--verbose", "--non-matching", *written],
                       cwd=REPO_ROOT, capture_output=True, text=True)
    not_ignored = [line.split("\t")[-1] for line in r.stdout.splitlines() if line.startswith("::")]
    assert not not_ignored, f"not ignored: {not_ignored}"
