"""Fixtures for the embedded Hub tests: a server on 127.0.0.1 over a tmp store, and the real clients pointed at it.

huggingface_hub reads HF_ENDPOINT, HF_HOME and friends once at import, so the `hub` fixture monkeypatches the values
in `huggingface_hub.constants` (what HfApi(), hf_hub_download and kernels read at call time) instead of the
environment, and isolates every cache and token path in tmp_path.
"""

from __future__ import annotations

import http.client
import json
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from hub_clients import point_clients_at, running_hub  # noqa: F401  (re-exported for the tests)

TOKEN = "test-token"
TRUSTED = "trusted-org"
UNTRUSTED = "untrusted-org"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A running HubServer (token TOKEN, trusted org TRUSTED) with the clients pointed at it."""
    with running_hub(tmp_path / "store", token=TOKEN, trusted_orgs=[TRUSTED], home=tmp_path / "hf-home",
                     monkeypatch=monkeypatch) as srv:
        yield srv


@pytest.fixture
def api(hub):
    from huggingface_hub import HfApi

    return HfApi(endpoint=hub.url, token=TOKEN)


@pytest.fixture
def anon(hub):
    from huggingface_hub import HfApi

    return HfApi(endpoint=hub.url, token=False)


def raw_request(url: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """One plain HTTP request (no client-side validation): (status, headers, body bytes).

    A `body` that is an iterator of bytes is sent with chunked transfer encoding.
    """
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    chunked = body is not None and not isinstance(body, (bytes, bytearray))
    try:
        try:
            conn.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
        except (BrokenPipeError, ConnectionResetError):
            # a server that answers early (413 on the Content-Length) may close before the body is sent; its
            # answer is still in the socket's receive buffer
            pass
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


def ndjson(*items) -> bytes:
    return b"".join(json.dumps(i).encode() + b"\n" for i in items)


def metadata_json(kernel_id: str) -> bytes:
    return json.dumps(
        {
            "id": kernel_id,
            "name": "hub-test-kernel",
            "version": 1,
            "license": "apache-2.0",
            "python-depends": [],
            "backend": {"type": "cpu"},
        }
    ).encode()


def upload_cpu_kernel(api, repo_id: str, answer: int) -> str:
    """Kernel repo `repo_id` whose branch v1 holds a pure-Python noarch CPU variant: `answer()` returns `answer`.

    Returns the metadata id (= the module name kernels imports it under), unique per call.
    """
    from huggingface_hub import CommitOperationAdd

    kernel_id = f"_hub_test_{uuid.uuid4().hex[:12]}"
    api.create_repo(repo_id, repo_type="kernel")
    api.create_branch(repo_id, branch="v1", repo_type="kernel")
    variant = "build/torch-cpu"
    api.create_commit(
        repo_id,
        [
            CommitOperationAdd(f"{variant}/__init__.py", f"def answer():\n    return {answer}\n".encode()),
            CommitOperationAdd(f"{variant}/metadata.json", metadata_json(kernel_id)),
        ],
        commit_message="Add torch-cpu variant",
        repo_type="kernel",
        revision="v1",
    )
    return kernel_id
