"""The loader against a real Hub server and cache: interrupted downloads, corrupted cache, concurrent processes,
server restart, offline mode, vendored directories, fallback to the reference."""

import hashlib
import logging
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

import winattn
from winattn.errors import (
    DownloadError,
    KernelNotFoundError,
    UntrustedKernelError,
    VerificationError,
)

from .conftest import CHILD, REPO, REPO_ROOT, isolate_cache, publish_build, push, start_hub, variant_files


def _statuses(module) -> dict:
    return {c.name: c.status for c in module.__winattn_info__.checks}


def _imported_from(root: Path) -> list:
    """Evidence, in this process, of a kernel imported or mapped from under `root`."""
    from kernels import importer

    loaded = [str(p) for p in importer._loaded_kernels if str(p).startswith(str(root))]
    with open("/proc/self/maps") as f:
        mapped = sorted({line.split()[-1] for line in f if str(root) in line})
    return loaded + mapped


@pytest.fixture
def request_log(monkeypatch):
    """Record (method, path, Range) of every request the in-process Hub server answers."""
    from winattn.hub import routes

    log = []
    original = routes.HubApp.handle

    def handle(self, req):
        log.append((req.method, "/".join(req.segments), req.headers.get("Range")))
        return original(self, req)

    monkeypatch.setattr(routes.HubApp, "handle", handle)
    return log


def _so_gets(log, so_name):
    return [entry for entry in log if entry[0] == "GET" and entry[1].endswith(so_name)]


# ----------------------------------------------------------------------------------------------------------------------


def test_interrupted_download_is_a_clean_error_and_retry_resumes(hub, hf_cache, make_build, monkeypatch, request_log):
    """The Hub dies in the middle of the .so: DownloadError naming repo/revision/variant, nothing imported; the next
    load resumes the partial file (Range request) and verifies."""
    from huggingface_hub import file_download

    from winattn.hub import routes

    build = make_build()
    publish_build(hub, build)
    state = {"cut": True, "down": False}
    inner = routes.HubApp.handle  # request_log's recorder

    def handle(self, req):
        if state["down"]:
            return routes.Response(503, {"X-Error-Code": "ServiceUnavailable"}, b'{"error": "hub is down"}')
        resp = inner(self, req)
        if state["cut"] and req.method == "GET" and "/".join(req.segments).endswith(build.so_name) and resp.file:
            half = hf_cache.parent / "half.bin"
            data = Path(resp.file).read_bytes()[resp.offset: resp.offset + resp.length // 2]
            half.write_bytes(data)
            resp.file, resp.offset = half, 0  # Content-Length stays the full size: the stream breaks mid-file
            state["down"] = True
        return resp

    monkeypatch.setattr(routes.HubApp, "handle", handle)
    monkeypatch.setattr(file_download, "time", types.SimpleNamespace(sleep=lambda s: None, time=time.time))

    with pytest.raises(DownloadError) as e:
        winattn.load(REPO, endpoint=hub.url)
    msg = str(e.value)
    assert REPO in msg and "v1" in msg and build.variant in msg and "Nothing was imported" in msg
    assert _imported_from(hf_cache) == []
    assert list(hf_cache.glob("kernels--*/blobs/*.incomplete")), "the partial download should be kept for resuming"

    state.update(cut=False, down=False)
    module = winattn.load(REPO, endpoint=hub.url)
    assert _statuses(module)["digest"] == "pass" and _statuses(module)["smoke-test"] == "pass"
    gets = _so_gets(request_log, build.so_name)
    assert gets[-1][2] and gets[-1][2].startswith("bytes="), f"expected a resumed (Range) GET, got {gets}"
    assert not list(hf_cache.glob("kernels--*/blobs/*.incomplete"))


def test_corrupted_cache_is_caught_and_downloaded_again(hub, hf_cache, make_build, caplog, request_log):
    build = make_build()
    publish_build(hub, build)
    module = winattn.load(REPO, endpoint=hub.url)
    so_link = Path(module.__winattn_info__.variant_path) / build.so_name
    blob = so_link.resolve()
    good = hashlib.sha256(blob.read_bytes()).hexdigest()
    with open(blob, "r+b") as f:  # same size, different bytes: a corrupted cache entry
        f.seek(blob.stat().st_size // 3)
        f.write(b"\0" * 64)
    assert hashlib.sha256(blob.read_bytes()).hexdigest() != good
    before = len(_so_gets(request_log, build.so_name))

    with caplog.at_level(logging.WARNING, logger="winattn"):
        module = winattn.load(REPO, endpoint=hub.url)
    assert "failed verification" in caplog.text and "File hash mismatch" in caplog.text
    assert hashlib.sha256(so_link.resolve().read_bytes()).hexdigest() == good
    assert len(_so_gets(request_log, build.so_name)) == before + 1
    assert _statuses(module)["digest"] == "pass" and not module.__winattn_info__.receipt_hit


def test_unchanged_cache_uses_the_receipt(hub, hf_cache, make_build, request_log):
    build = make_build()
    publish_build(hub, build)
    first = winattn.load(REPO, endpoint=hub.url)
    assert not first.__winattn_info__.receipt_hit
    n = len(request_log)
    second = winattn.load(REPO, endpoint=hub.url)
    assert second.__winattn_info__.receipt_hit
    # the second load only asked the Hub for trust and the branch head: no file was downloaded again
    assert not [r for r in request_log[n:] if "resolve" in r[1]]


def test_four_processes_share_one_download(hub, hf_cache, make_build, request_log, tmp_path):
    build = make_build()
    commit = publish_build(hub, build)
    go = tmp_path / "go"
    case = ('[{"name": "p", "wait_for": "%s", "kwargs": {"endpoint": "%s", "version": 1}}]' % (go, hub.url))
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    procs = [subprocess.Popen([sys.executable, str(CHILD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT) for _ in range(4)]
    for p in procs:
        p.stdin.write(case)
        p.stdin.close()
    deadline = time.time() + 60
    while len(list(tmp_path.glob("go.ready.*"))) < 4 and time.time() < deadline:
        time.sleep(0.05)
    go.touch()  # all four have imported torch and kernels: start the loads together
    import json

    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1])["results"][0])
    assert all(r["ok"] for r in results), [r.get("traceback") for r in results]
    assert {r["info"]["commit"] for r in results} == {commit}
    assert len(_so_gets(request_log, build.so_name)) == 1, "the .so must be downloaded exactly once"
    assert len(list(hf_cache.glob("kernels--*/snapshots/*/build/*"))) == 1


def test_hub_restart_loses_nothing(tmp_path, hf_cache, make_build, monkeypatch):
    root = tmp_path / "restart-hub"
    srv = start_hub(root)
    build = make_build()
    try:
        commit = publish_build(srv, build)
    finally:
        srv.stop()
    srv = start_hub(root)  # a new process would see the same: the store is on disk
    try:
        isolate_cache(monkeypatch, tmp_path / "fresh-cache")  # download everything again from the restarted hub
        module = winattn.load(REPO, endpoint=srv.url)
        assert module.__winattn_info__.commit == commit
        assert _statuses(module)["digest"] == "pass"
    finally:
        srv.stop()


# ----------------------------------------------------------------------------------------------------------------------
# Offline and vendored


def test_offline_load_from_verified_cache(hub, hf_cache, make_build, keys, offline, no_network, caplog):
    build = make_build()
    commit = publish_build(hub, build, signing_key=keys["good"][0])
    winattn.load(REPO, endpoint=hub.url, public_keys=[keys["good"][1]], require_signature=True)
    hub.stop()
    offline()
    attempts = no_network()
    with caplog.at_level(logging.WARNING, logger="winattn"):
        module = winattn.load(REPO, version=1, public_keys=[keys["good"][1]], require_signature=True)
    info = module.__winattn_info__
    assert info.source == "offline-cache" and info.commit == commit
    assert info.trust == "offline: trusted publisher winattn"
    assert "Skipping publisher trust check" in caplog.text
    assert _statuses(module)["signature"] == "pass" and info.receipt_hit
    assert attempts == []


def test_offline_refuses_unverified_cache_entry_unless_trusted(hub, hf_cache, make_build, offline, no_network):
    """A cache entry winattn never verified online (here: downloaded by plain huggingface_hub) gets no free pass."""
    from huggingface_hub import HfApi

    build = make_build()
    commit = publish_build(hub, build)
    HfApi(endpoint=hub.url).snapshot_download(REPO, repo_type="kernel", revision="v1")
    hub.stop()
    offline()
    no_network()
    with pytest.raises(UntrustedKernelError, match="offline mode"):
        winattn.load(REPO, version=1)
    module = winattn.load(REPO, version=1, trust_remote_code=True)
    assert module.__winattn_info__.commit == commit and module.__winattn_info__.trust == "trust_remote_code"


def test_offline_tampered_cache_is_refused(hub, hf_cache, make_build, offline, no_network):
    build = make_build()
    publish_build(hub, build)
    module = winattn.load(REPO, endpoint=hub.url)
    init = Path(module.__winattn_info__.variant_path) / "__init__.py"
    blob = init.resolve()
    blob.write_bytes(blob.read_bytes() + b"\n# edited in the cache\n")
    hub.stop()
    offline()
    no_network()
    with pytest.raises(VerificationError, match="File hash mismatch for __init__.py") as e:
        winattn.load(REPO, version=1)
    assert any(not passed for _, passed, _ in e.value.checks)


def test_vendored_load_without_network(hub, hf_cache, make_build, keys, tmp_path, no_network):
    from winattn.vendor import vendor

    build = make_build()
    commit = publish_build(hub, build, signing_key=keys["good"][0])
    out = vendor(REPO, version=1, out_dir=tmp_path / "vendored", endpoint=hub.url)
    hub.stop()
    attempts = no_network()
    module = winattn.load(REPO, vendored=out, public_keys=[keys["good"][1]], require_signature=True)
    info = module.__winattn_info__
    assert info.source == "vendored" and info.commit == commit and info.variant == build.variant
    statuses = _statuses(module)
    assert statuses["lock"] == "pass" and statuses["signature"] == "pass" and statuses["digest"] == "pass"
    assert attempts == []


def test_vendored_tampering_is_refused(hub, hf_cache, make_build, keys, tmp_path, no_network):
    import json

    from winattn.vendor import vendor

    build = make_build()
    publish_build(hub, build, signing_key=keys["good"][0])
    out = vendor(REPO, version=1, out_dir=tmp_path / "vendored", endpoint=hub.url)
    hub.stop()
    no_network()
    variant_dir = out / build.variant
    lock_path = out / "window-attention.lock"
    lock = json.loads(lock_path.read_text())

    with pytest.raises(VerificationError, match="not 'winattn/other'"):
        winattn.load("winattn/other", vendored=out)
    with pytest.raises(VerificationError, match="pins version 1, not 2"):
        winattn.load(REPO, version=2, vendored=out)

    # the lock's metadata hash no longer matches (e.g. metadata.json swapped together with its files)
    bad = json.loads(lock_path.read_text())
    bad["variants"][build.variant]["metadata_sha256"] = "0" * 64
    lock_path.write_text(json.dumps(bad))
    with pytest.raises(VerificationError, match="locked"):
        winattn.load(REPO, vendored=out)
    lock_path.write_text(json.dumps(lock))

    so = variant_dir / build.so_name
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    so.write_bytes(bytes(data))
    with pytest.raises(VerificationError, match="File hash mismatch for " + build.so_name):
        winattn.load(REPO, vendored=out, public_keys=[keys["good"][1]], require_signature=True)
    assert _imported_from(out) == []


# ----------------------------------------------------------------------------------------------------------------------
# No fitting variant


@pytest.fixture
def cuda_only_repo(hub, make_build):
    """A repo whose only variant is a CUDA build: nothing fits this CPU machine."""
    build = make_build()
    cuda = "torch-stable-abi210-cu126-x86_64-linux"
    files = {k.replace(build.variant, cuda): v for k, v in variant_files(build).items()}
    push(hub, "winattn/cuda-only", files)
    return "winattn/cuda-only", cuda


def test_no_variant_raises_with_every_reason(hub, hf_cache, cuda_only_repo):
    repo, cuda = cuda_only_repo
    with pytest.raises(KernelNotFoundError) as e:
        winattn.load(repo, endpoint=hub.url)
    assert isinstance(e.value, FileNotFoundError)
    msg = str(e.value)
    assert repo in msg and "v1" in msg
    assert f"{cuda}: backend (cu126) does not match selected backend (cpu)" in msg


def test_fallback_reference_logs_reasons_and_works(hub, hf_cache, cuda_only_repo, caplog):
    import torch

    repo, cuda = cuda_only_repo
    with caplog.at_level(logging.WARNING, logger="winattn"):
        module = winattn.load(repo, endpoint=hub.url, fallback="reference")
    assert f"{cuda}: backend (cu126) does not match selected backend (cpu)" in caplog.text
    assert module.__winattn_info__.source == "reference"
    assert module.__winattn_info__.rejected == ((cuda, "backend (cu126) does not match selected backend (cpu)"),)
    q, k, v = (torch.randn(1, 12, 2, 16) for _ in range(3))
    out = module.attention(q, k, v, causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    assert torch.allclose(out, ref, atol=1e-5)
    assert module.window_attention is module.reference.window_attention
    assert not list(hf_cache.glob("kernels--*/snapshots/*/build/*/*.so")), "nothing should have been downloaded"


def test_fallback_does_not_hide_tampering(hub, hf_cache, make_build):
    build = make_build()
    publish_build(hub, build)
    push(hub, REPO, {build.path_in_repo("extra.py"): b"x = 1\n"})
    with pytest.raises(VerificationError, match="Unknown file: extra.py"):
        winattn.load(REPO, endpoint=hub.url, fallback="reference")
