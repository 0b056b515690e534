"""The loader against a real Hub server and cache: interrupted downloads, corrupted cache, concurrent processes,
server restart, offline mode, vendored directories, fallback to the reference."""

import hashlib
import logging
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

from .conftest import REPO, isolate_cache, publish_build, push, start_hub, variant_files


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


def test_interrupted_download_is_a_clean_error_and_retry_succeeds(hub, hf_cache, make_build, monkeypatch,
                                                                     request_log):
    """The Hub dies in the middle of the .so (the stream breaks, then every request gets 503): DownloadError naming
    repo/revision/variant, nothing imported, no partial file left in the cache; the next load succeeds."""
    from huggingface_hub import file_download
    from huggingface_hub.utils import _http

    from winattn.hub import routes

    build = make_build()
    publish_build(hub, build)
    state = {"cut": True, "down": False}
    inner = routes.HubApp.handle  # request_log's recorder

    def handle(self, req):
        resp = inner(self, req)
        if state["down"]:
            return routes.Response(503, {"X-Error-Code": "ServiceUnavailable"}, b'{"error": "hub is down"}')
        if state["cut"] and req.method == "GET" and "/".join(req.segments).endswith(build.so_name) and resp.file:
            half = hf_cache.parent / "half.bin"
            half.write_bytes(Path(resp.file).read_bytes()[resp.offset: resp.offset + resp.length // 2])
            resp.file, resp.offset = half, 0  # Content-Length stays the full size: the stream breaks mid-file
            state["down"] = True
        return resp

    monkeypatch.setattr(routes.HubApp, "handle", handle)
    no_sleep = types.SimpleNamespace(sleep=lambda s: None, time=time.time, monotonic=time.monotonic)
    monkeypatch.setattr(file_download, "time", no_sleep)  # huggingface_hub's resume/backoff pauses
    monkeypatch.setattr(_http, "time", no_sleep)

    with pytest.raises(DownloadError) as e:
        winattn.load(REPO, endpoint=hub.url)
    msg = str(e.value)
    assert REPO in msg and "v1" in msg and build.variant in msg and "Nothing was imported" in msg
    assert len(_so_gets(request_log, build.so_name)) == 2  # the GET cut mid-file, then huggingface_hub's retry
    assert _imported_from(hf_cache) == []
    assert not list(hf_cache.glob("kernels--*/blobs/*incomplete*")), "no partial file may stay in the cache"
    assert not list(hf_cache.glob(f"kernels--*/snapshots/*/build/*/{build.so_name}"))

    state.update(cut=False, down=False)
    module = winattn.load(REPO, endpoint=hub.url)
    assert _statuses(module)["digest"] == "pass" and _statuses(module)["smoke-test"] == "pass"
    assert len(_so_gets(request_log, build.so_name)) == 3  # downloaded again, whole


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


def test_unchanged_cache_is_not_downloaded_again_but_hashed_again(hub, hf_cache, make_build, request_log):
    """A load imports the private copy it hashes (tests/security), so it never takes the receipt's no-rehash
    shortcut (`winattn verify` does); the cache is still reused."""
    build = make_build()
    publish_build(hub, build)
    first = winattn.load(REPO, endpoint=hub.url)
    assert not first.__winattn_info__.receipt_hit
    n = len(request_log)
    second = winattn.load(REPO, endpoint=hub.url)
    assert not second.__winattn_info__.receipt_hit
    assert "copied while hashed" in second.__winattn_info__.check("digest").detail
    # the second load only asked the Hub for trust and the branch head: no file was downloaded again
    assert not [r for r in request_log[n:] if "resolve" in r[1]]


def test_four_processes_share_one_download(hub, hf_cache, make_build, request_log):
    """Four fresh processes (multiprocessing, spawn) load at the same moment: all succeed, the .so is downloaded
    once (huggingface_hub's blob locks plus winattn's per-variant lock around download+verify)."""
    import multiprocessing

    from ._child import spawn_worker

    build = make_build()
    commit = publish_build(hub, build)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    case = {"name": "p", "kwargs": {"endpoint": hub.url, "version": 1}}
    procs = [ctx.Process(target=spawn_worker, args=(case, barrier, results)) for _ in range(4)]
    for p in procs:
        p.start()
    out = [results.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert all(r["ok"] for r in out), [r.get("traceback") for r in out]
    assert {r["info"]["commit"] for r in out} == {commit}
    assert len({r["info"]["variant"] for r in out}) == 1
    assert len(_so_gets(request_log, build.so_name)) == 1, "the .so must be downloaded exactly once"
    assert len(list(hf_cache.glob("kernels--*/snapshots/*/build/*"))) == 1


def test_same_build_from_a_second_path_reuses_the_imported_module(hub, hf_cache, make_build, monkeypatch, tmp_path):
    """torch cannot register one op namespace twice: a second verified copy of the same build (other cache, vendored
    dir) returns the module already imported, after its own verification."""
    build = make_build()
    publish_build(hub, build)
    first = winattn.load(REPO, endpoint=hub.url)
    isolate_cache(monkeypatch, tmp_path / "second-cache")
    second = winattn.load(REPO, endpoint=hub.url)
    assert second is first
    info = second.__winattn_info__
    assert info.variant_path.startswith(str(tmp_path / "second-cache"))
    assert info.reused_from is not None and not info.reused_from.startswith(str(tmp_path / "second-cache"))
    assert _statuses(second)["digest"] == "pass"


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
    assert _statuses(module)["signature"] == "pass" and "copied while hashed" in info.check("digest").detail
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
    with pytest.raises(UntrustedKernelError):  # an offline opt-in is not remembered as trust
        winattn.load(REPO, version=1)


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
    # a lock made from a revision (no version) loads without version=
    import json

    lock_path = out / "window-attention.lock"
    lock_path.write_text(json.dumps(dict(json.loads(lock_path.read_text()), version=None, revision=commit)))
    assert winattn.load(REPO, vendored=out).__winattn_info__.commit == commit
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


def _closed_port() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_hub_down_is_one_short_error_with_its_cause_kept(hf_cache):
    """An unreachable Hub: a `DownloadError` whose traceback is winattn's own frames and one message (not 90 lines of
    chained client frames), the client's exception kept as `.cause`, and advice a Python caller can follow (no CLI
    flags)."""
    import traceback

    with pytest.raises(DownloadError) as e:
        winattn.load(REPO, endpoint=_closed_port())
    err = e.value
    shown = "".join(traceback.format_exception(err))
    assert err.__cause__ is None and err.__suppress_context__
    assert len(shown.splitlines()) <= 25, shown
    assert type(err.cause).__name__ == "ConnectError" and "Connection refused" in str(err)
    assert "--endpoint" not in shown and "--token" not in shown and "HF_ENDPOINT" in str(err)


def test_fallback_replaces_only_no_variant(hub, hf_cache, make_build, cuda_only_repo, offline, caplog):
    """`fallback="reference"` applies to `NoVariantError` (the kernel exists, no variant fits this machine) and to
    nothing else; each other failure has its own class, none of them a `NoVariantError`."""
    from winattn.errors import NoVariantError, OfflineError

    repo, _ = cuda_only_repo
    with pytest.raises(NoVariantError):
        winattn.load(repo, endpoint=hub.url)
    assert winattn.load(repo, endpoint=hub.url, fallback="reference").__winattn_info__.source == "reference"
    publish_build(hub, make_build())
    failures = [
        (dict(repo_id=REPO, version=7), KernelNotFoundError, "version 7 of"),           # no such version
        (dict(repo_id="winattn/nope"), KernelNotFoundError, "winattn/nope not found"),  # no such repository
        (dict(repo_id=REPO, revision="nosuch"), KernelNotFoundError, "revision 'nosuch'"),
        (dict(repo_id=REPO, endpoint=_closed_port()), DownloadError, "Connection refused"),  # Hub down
    ]
    for kwargs, cls, text in failures:
        kwargs.setdefault("endpoint", hub.url)
        with pytest.raises(cls, match=text) as e:
            winattn.load(**kwargs, fallback="reference")
        assert not isinstance(e.value, NoVariantError), kwargs
    offline()
    with pytest.raises(OfflineError):
        winattn.load("winattn/never-loaded", fallback="reference")


def test_a_token_the_hub_does_not_know_is_reported_not_ignored(hub, hf_cache, make_build):
    """The embedded Hub answers 401 to an unknown token, as the Hub does: the load says so (and not that the
    publisher is untrusted)."""
    publish_build(hub, make_build())
    with pytest.raises(DownloadError, match=r"HTTP 401: Invalid credentials in Authorization header \(set HF_TOKEN "
                                            r"to a token this Hub accepts") as e:
        winattn.load(REPO, endpoint=hub.url, token="hf_not_a_token_of_this_hub")
    assert "retry" not in str(e.value) and e.value.cause.response.status_code == 401
