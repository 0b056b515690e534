"""Persistence and concurrency of the embedded Hub's store."""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path

import pytest
from huggingface_hub import CommitOperationAdd, HfApi, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError

from winattn.errors import HubProtocolError
from winattn.hub import HubServer

from .conftest import TOKEN, point_clients_at, raw_request


def test_data_survives_restart(tmp_path, monkeypatch):
    root = tmp_path / "store"
    with HubServer(root, tokens=[TOKEN]) as first:
        api = HfApi(endpoint=first.url, token=TOKEN)
        api.create_repo("acme/keep", repo_type="kernel", private=True)
        api.create_branch("acme/keep", branch="v1", repo_type="kernel")
        sha = api.upload_file(
            path_or_fileobj=b"persisted", path_in_repo="f.txt", repo_id="acme/keep", repo_type="kernel", revision="v1"
        ).oid
    with pytest.raises(HubProtocolError):
        _ = first.url  # stopped
    with HubServer(root, tokens=[TOKEN]) as second:
        point_clients_at(second.url, tmp_path / "home", monkeypatch)
        api = HfApi(endpoint=second.url, token=TOKEN)
        refs = api.list_repo_refs("acme/keep", repo_type="kernel")
        assert {b.name: b.target_commit for b in refs.branches}["v1"] == sha
        assert api.repo_info("acme/keep", repo_type="kernel").private is True
        path = hf_hub_download("acme/keep", "f.txt", repo_type="kernel", revision="v1", token=TOKEN)
        assert Path(path).read_bytes() == b"persisted"


def test_root_must_be_a_store_or_empty(tmp_path):
    (tmp_path / "notes.txt").write_text("not a hub store")
    with pytest.raises(HubProtocolError, match="not a hub store"):
        HubServer(tmp_path).start()


def test_stop_releases_the_port_and_connections(tmp_path):
    srv = HubServer(tmp_path / "store").start()
    url = srv.url
    assert raw_request(url, "GET", "/api/agent-harnesses")[0] == 200
    srv.stop()
    srv.stop()  # idempotent
    with pytest.raises(OSError):
        raw_request(url, "GET", "/api/agent-harnesses")


def test_concurrent_commits_are_serialized(api):
    api.create_repo("acme/busy")
    base = api.repo_info("acme/busy").sha
    errors, per_thread = [], 3

    def writer(t: int) -> None:
        try:
            for i in range(per_thread):
                # Each commit adds a pair of files: readers must never see one without the other.
                api.create_commit(
                    "acme/busy",
                    [
                        CommitOperationAdd(f"t{t}/c{i}/a.txt", f"{t}-{i}".encode()),
                        CommitOperationAdd(f"t{t}/c{i}/b.txt", f"{t}-{i}".encode()),
                    ],
                    commit_message=f"thread {t} commit {i}",
                )
        except Exception as e:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(e)

    stop, torn = threading.Event(), []

    def reader() -> None:
        while not stop.is_set():
            files = set(api.list_repo_files("acme/busy"))
            torn.extend(f for f in files if f.endswith("a.txt") and f.replace("a.txt", "b.txt") not in files)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for th in readers + threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    stop.set()
    for th in readers:
        th.join(timeout=60)
    assert errors == [] and torn == []

    commits = api.list_repo_commits("acme/busy")
    assert len(commits) == 4 * per_thread + 1 and commits[-1].commit_id == base
    assert len(api.list_repo_files("acme/busy")) == 4 * per_thread * 2
    # A linear history: each commit's parent is the next one in the log.
    for newer, older in itertools.pairwise(commits):
        assert api.list_repo_commits("acme/busy", revision=newer.commit_id)[1].commit_id == older.commit_id


def test_concurrent_commits_with_parent_get_412(api):
    api.create_repo("acme/race")
    head = api.repo_info("acme/race").sha
    barrier, results = threading.Barrier(4), []

    def writer(t: int) -> None:
        barrier.wait()
        try:
            api.create_commit(
                "acme/race", [CommitOperationAdd(f"{t}.txt", b"x")], commit_message=f"{t}", parent_commit=head
            )
            results.append("ok")
        except HfHubHTTPError as e:
            results.append(e.response.status_code)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert sorted(results, key=str) == [412, 412, 412, "ok"]
    assert len(api.list_repo_files("acme/race")) == 1
    assert len(api.list_repo_commits("acme/race")) == 2


def test_refs_file_is_replaced_atomically(hub, api):
    """Readers only ever see complete refs.json files (written elsewhere, then os.replace'd)."""
    api.create_repo("acme/refs")
    refs_file = hub.root / "repos" / "model" / "acme" / "refs" / "refs.json"
    inode = refs_file.stat().st_ino
    api.create_branch("acme/refs", branch="dev")
    assert refs_file.stat().st_ino != inode
    assert set(json.loads(refs_file.read_text())["branches"]) == {"main", "dev"}
