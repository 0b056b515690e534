"""The embedded Hub driven by the real huggingface_hub client: repos, refs, commits, listings, downloads, auth."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from winattn.hub import HubServer

from .conftest import TOKEN, TRUSTED, UNTRUSTED, point_clients_at


def _v1_repo(api, repo_id="acme/relu", repo_type="kernel") -> str:
    api.create_repo(repo_id, repo_type=repo_type)
    api.create_branch(repo_id, branch="v1", repo_type=repo_type)
    info = api.create_commit(
        repo_id,
        [
            CommitOperationAdd("build/torch-cpu/__init__.py", b"X = 1\n"),
            CommitOperationAdd("build/torch-cpu/metadata.json", b"{}"),
            CommitOperationAdd("build/torch-cuda/__init__.py", b"X = 2\n"),
            CommitOperationAdd("benchmarks/benchmark.py", b"pass\n"),
            CommitOperationAdd("README.md", b"# relu\n"),
        ],
        commit_message="v1 build",
        repo_type=repo_type,
        revision="v1",
    )
    return info.oid


def test_create_repo_kernel_and_model_with_conflict(api):
    url = api.create_repo("acme/relu", repo_type="kernel")
    assert url.repo_type == "kernel" and url.repo_id == "acme/relu"
    assert str(url) == f"{api.endpoint}/kernels/acme/relu"
    model_url = api.create_repo("acme/relu", repo_type="model")  # same id, other type: another repo
    assert model_url.repo_type == "model" and str(model_url) == f"{api.endpoint}/acme/relu"

    with pytest.raises(HfHubHTTPError) as exc:
        api.create_repo("acme/relu", repo_type="kernel", exist_ok=False)
    assert exc.value.response.status_code == 409
    assert exc.value.response.json()["url"] == str(url)
    assert api.create_repo("acme/relu", repo_type="kernel", exist_ok=True) == url
    assert api.repo_exists("acme/relu", repo_type="kernel")
    assert not api.repo_exists("acme/other", repo_type="kernel")


def test_branch_commit_and_listings(api):
    api.create_repo("acme/relu", repo_type="kernel")
    main_sha = api.repo_info("acme/relu", repo_type="kernel").sha
    api.create_branch("acme/relu", branch="v1", repo_type="kernel")
    with pytest.raises(HfHubHTTPError) as exc:
        api.create_branch("acme/relu", branch="v1", repo_type="kernel")
    assert exc.value.response.status_code == 409
    api.create_branch("acme/relu", branch="v1", repo_type="kernel", exist_ok=True)

    first = _v1_repo_commit = api.create_commit(
        "acme/relu",
        [
            CommitOperationAdd("build/torch-cpu/__init__.py", b"X = 1\n"),
            CommitOperationAdd("build/torch-cpu/metadata.json", b"{}"),
            CommitOperationAdd("build/torch-old/__init__.py", b"old\n"),
            CommitOperationAdd("stale.txt", b"stale\n"),
        ],
        commit_message="first",
        repo_type="kernel",
        revision="v1",
    )
    assert len(first.oid) == 40 and first.commit_url.endswith(f"/kernels/acme/relu/commit/{first.oid}")
    # One commit: an addition, a file deletion and a folder deletion.
    second = api.create_commit(
        "acme/relu",
        [
            CommitOperationAdd("build/torch-cuda/__init__.py", b"X = 2\n"),
            CommitOperationDelete("stale.txt"),
            CommitOperationDelete("build/torch-old/"),
        ],
        commit_message="second",
        repo_type="kernel",
        revision="v1",
        parent_commit=_v1_repo_commit.oid,
    )

    refs = api.list_repo_refs("acme/relu", repo_type="kernel")
    assert {b.name: b.target_commit for b in refs.branches} == {"main": main_sha, "v1": second.oid}
    assert [b.ref for b in refs.branches] == ["refs/heads/main", "refs/heads/v1"]
    assert refs.tags == [] and refs.converts == []

    tree = api.list_repo_tree("acme/relu", repo_type="kernel", revision="v1", recursive=True)
    files = sorted(e.path for e in tree if e.__class__.__name__ == "RepoFile")
    assert files == ["build/torch-cpu/__init__.py", "build/torch-cpu/metadata.json", "build/torch-cuda/__init__.py"]
    assert api.list_repo_files("acme/relu", repo_type="kernel", revision="v1") == files
    top = api.list_repo_tree("acme/relu", "build", repo_type="kernel", revision=second.oid)
    assert sorted(e.path for e in top) == ["build/torch-cpu", "build/torch-cuda"]
    assert api.list_repo_files("acme/relu", repo_type="kernel") == []  # main untouched

    infos = api.get_paths_info(
        "acme/relu", ["build/torch-cpu/metadata.json", "build", "missing.txt"], repo_type="kernel", revision="v1"
    )
    assert [(i.path, type(i).__name__) for i in infos] == [
        ("build/torch-cpu/metadata.json", "RepoFile"),
        ("build", "RepoFolder"),
    ]
    assert infos[0].size == 2 and len(infos[0].blob_id) == 40
    expanded = api.get_paths_info(
        "acme/relu", ["build/torch-cpu/__init__.py"], repo_type="kernel", revision="v1", expand=True
    )
    assert expanded[0].last_commit.oid == first.oid

    commits = api.list_repo_commits("acme/relu", repo_type="kernel", revision="v1")
    assert [c.commit_id for c in commits] == [second.oid, first.oid, main_sha]
    assert [c.title for c in commits[:2]] == ["second", "first"]

    api.delete_branch("acme/relu", branch="v1", repo_type="kernel")
    assert [b.name for b in api.list_repo_refs("acme/relu", repo_type="kernel").branches] == ["main"]


def test_parent_commit_mismatch_is_412(api):
    api.create_repo("acme/model")
    head = api.repo_info("acme/model").sha
    api.upload_file(path_or_fileobj=b"one", path_in_repo="a.txt", repo_id="acme/model")
    with pytest.raises(HfHubHTTPError) as exc:
        api.create_commit(
            "acme/model", [CommitOperationAdd("b.txt", b"two")], commit_message="stale", parent_commit=head
        )
    assert exc.value.response.status_code == 412
    assert exc.value.response.headers["X-Error-Code"] == "PreconditionFailed"
    assert api.list_repo_files("acme/model") == ["a.txt"]


def test_downloads_info_and_existence(api, tmp_path):
    sha = _v1_repo(api)
    info = api.repo_info("acme/relu", repo_type="kernel", revision="v1")
    assert info.sha == sha and info.id == "acme/relu" and info.private is False
    assert api.kernel_info("acme/relu", revision=sha).sha == sha

    path = hf_hub_download("acme/relu", "build/torch-cpu/__init__.py", repo_type="kernel", revision="v1")
    assert Path(path).read_bytes() == b"X = 1\n"
    assert f"kernels--acme--relu/snapshots/{sha}/" in path

    snap = snapshot_download("acme/relu", repo_type="kernel", revision="v1", allow_patterns=["build/torch-cpu/*"])
    got = sorted(str(p.relative_to(snap)) for p in Path(snap).rglob("*") if p.is_file())
    assert got == ["build/torch-cpu/__init__.py", "build/torch-cpu/metadata.json"]

    local = api.snapshot_download("acme/relu", repo_type="kernel", revision="v1", local_dir=tmp_path / "copy")
    assert (Path(local) / "README.md").read_bytes() == b"# relu\n"

    assert api.file_exists("acme/relu", "README.md", repo_type="kernel", revision="v1")
    assert not api.file_exists("acme/relu", "README.md", repo_type="kernel")  # not on main
    assert not api.file_exists("acme/relu", "nope.txt", repo_type="kernel", revision="v1")
    assert not api.file_exists("acme/relu", "README.md", repo_type="kernel", revision="v9")
    assert not api.file_exists("acme/nope", "README.md", repo_type="kernel")
    assert api.revision_exists("acme/relu", "v1", repo_type="kernel")
    assert not api.revision_exists("acme/relu", "v2", repo_type="kernel")


def test_tags(api):
    sha = _v1_repo(api)
    api.create_tag("acme/relu", tag="v1.0.0", revision="v1", repo_type="kernel", tag_message="release")
    refs = api.list_repo_refs("acme/relu", repo_type="kernel")
    assert [(t.name, t.ref, t.target_commit) for t in refs.tags] == [("v1.0.0", "refs/tags/v1.0.0", sha)]
    path = hf_hub_download("acme/relu", "README.md", repo_type="kernel", revision="refs/tags/v1.0.0")
    assert Path(path).read_bytes() == b"# relu\n"
    with pytest.raises(HfHubHTTPError) as exc:
        api.create_tag("acme/relu", tag="v1.0.0", repo_type="kernel")
    assert exc.value.response.status_code == 409
    api.delete_tag("acme/relu", tag="v1.0.0", repo_type="kernel")
    assert api.list_repo_refs("acme/relu", repo_type="kernel").tags == []


def test_upload_folder_stays_off_xet(api, tmp_path):
    folder = tmp_path / "build"
    (folder / "torch-cpu").mkdir(parents=True)
    (folder / "torch-cpu" / "__init__.py").write_text("Y = 3\n")
    (folder / "torch-cpu" / "blob.bin").write_bytes(bytes(range(256)) * 4096)  # 1 MiB, LFS-sized on the Hub
    api.create_repo("acme/folder", repo_type="kernel")
    api.upload_folder(folder_path=folder, path_in_repo="build", repo_id="acme/folder", repo_type="kernel")
    assert api.list_repo_files("acme/folder", repo_type="kernel") == [
        "build/torch-cpu/__init__.py",
        "build/torch-cpu/blob.bin",
    ]
    path = hf_hub_download("acme/folder", "build/torch-cpu/blob.bin", repo_type="kernel")
    assert Path(path).read_bytes() == bytes(range(256)) * 4096
    # Re-uploading identical files is a no-op for the client (preupload returns the remote oids).
    head = api.repo_info("acme/folder", repo_type="kernel").sha
    api.upload_folder(folder_path=folder, path_in_repo="build", repo_id="acme/folder", repo_type="kernel")
    assert api.repo_info("acme/folder", repo_type="kernel").sha == head


def test_whoami_and_organization_overview(api, anon):
    me = api.whoami()
    assert me["name"] == "local" and me["auth"]["accessToken"]["role"] == "write"
    assert TRUSTED in [o["name"] for o in me["orgs"]]
    with pytest.raises(HfHubHTTPError):
        HfApi(endpoint=api.endpoint, token="wrong-token").whoami()

    api.create_repo(f"{UNTRUSTED}/k", repo_type="kernel")
    assert anon.get_organization_overview(TRUSTED).trustedKernelPublisher is True
    untrusted = anon.get_organization_overview(UNTRUSTED)
    assert untrusted.trustedKernelPublisher is False and untrusted.name == UNTRUSTED
    with pytest.raises(HfHubHTTPError) as exc:
        anon.get_organization_overview("nobody-here")
    assert exc.value.response.status_code == 404


def test_private_repo_needs_token_to_read(api, anon):
    api.create_repo("acme/secret", private=True)
    api.upload_file(path_or_fileobj=b"s3cret", path_in_repo="key.txt", repo_id="acme/secret")
    assert api.repo_info("acme/secret").private is True
    with pytest.raises(RepositoryNotFoundError):
        anon.repo_info("acme/secret")
    with pytest.raises(RepositoryNotFoundError):
        anon.list_repo_files("acme/secret")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("acme/secret", "key.txt", token=False)
    assert not anon.file_exists("acme/secret", "key.txt")
    assert Path(hf_hub_download("acme/secret", "key.txt", token=TOKEN)).read_bytes() == b"s3cret"
    with pytest.raises(HfHubHTTPError) as exc:
        HfApi(endpoint=api.endpoint, token="wrong-token").repo_info("acme/secret")
    assert exc.value.response.status_code == 401
    assert "acme/secret" not in [m.id for m in anon.list_models()]
    assert "acme/secret" in [m.id for m in api.list_models(author="acme")]


def test_writes_need_a_token(api, anon, tmp_path, monkeypatch):
    with pytest.raises(HfHubHTTPError) as exc:
        anon.create_repo("acme/anon")
    assert exc.value.response.status_code == 401 and exc.value.response.headers["X-Error-Code"] == "Unauthorized"
    api.create_repo("acme/target")
    for client in (anon, HfApi(endpoint=api.endpoint, token="wrong-token")):
        with pytest.raises(HfHubHTTPError) as exc:
            client.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="acme/target")
        assert exc.value.response.status_code == 401
        with pytest.raises(HfHubHTTPError):
            client.create_branch("acme/target", branch="dev")
        with pytest.raises(HfHubHTTPError):
            client.delete_repo("acme/target")
    assert api.list_repo_files("acme/target") == []

    # A server without tokens is read-only.
    with HubServer(tmp_path / "ro-store") as ro:
        point_clients_at(ro.url, tmp_path / "ro-home", monkeypatch)
        with pytest.raises(HfHubHTTPError) as exc:
            HfApi(endpoint=ro.url, token=TOKEN).create_repo("acme/ro")
        assert exc.value.response.status_code == 401
        with pytest.raises(HfHubHTTPError) as exc:
            HfApi(endpoint=ro.url, token=False).create_repo("acme/ro")
        assert exc.value.response.status_code == 401


def test_an_invalid_token_is_refused_for_public_reads_too(api, anon):
    """As the Hub answers: a token it does not know is 401 whatever the request, never silently read as anonymous
    (a mistyped HF_TOKEN would otherwise only show up at the first write)."""
    _v1_repo(api)
    wrong = HfApi(endpoint=api.endpoint, token="wrong-token")
    for call in (lambda c: c.repo_info("acme/relu", repo_type="kernel"),
                 lambda c: c.list_repo_refs("acme/relu", repo_type="kernel"),
                 lambda c: c.get_organization_overview(TRUSTED),
                 lambda c: c.hf_hub_download("acme/relu", "build/torch-cpu/__init__.py", repo_type="kernel",
                                             revision="v1")):
        with pytest.raises(HfHubHTTPError) as exc:
            call(wrong)
        assert exc.value.response.status_code == 401
        assert "Invalid credentials in Authorization header" in str(exc.value)
        call(anon)  # public: fine without a token


def test_delete_repo(api):
    _v1_repo(api)
    api.delete_repo("acme/relu", repo_type="kernel")
    assert not api.repo_exists("acme/relu", repo_type="kernel")
    with pytest.raises(RepositoryNotFoundError):
        api.delete_repo("acme/relu", repo_type="kernel")
    api.delete_repo("acme/relu", repo_type="kernel", missing_ok=True)
    api.create_repo("acme/relu", repo_type="kernel")  # the name is free again, with a fresh history
    assert api.list_repo_files("acme/relu", repo_type="kernel") == []


def test_client_raises_typed_errors(api):
    _v1_repo(api)
    with pytest.raises(RepositoryNotFoundError):
        api.repo_info("acme/missing", repo_type="kernel")
    with pytest.raises(RevisionNotFoundError):
        api.repo_info("acme/relu", repo_type="kernel", revision="v7")
    with pytest.raises(RevisionNotFoundError):
        api.list_repo_tree("acme/relu", repo_type="kernel", revision="0" * 40).__next__()
    with pytest.raises(EntryNotFoundError) as exc:
        hf_hub_download("acme/relu", "build/missing.py", repo_type="kernel", revision="v1")
    assert isinstance(exc.value, RemoteEntryNotFoundError)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download("acme/relu", "README.md", repo_type="kernel", revision="v7")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("acme/missing", "README.md", repo_type="kernel")
    with pytest.raises(EntryNotFoundError):
        list(api.list_repo_tree("acme/relu", "nope", repo_type="kernel", revision="v1"))
    with pytest.raises(RevisionNotFoundError):  # commits go to existing branches only
        api.upload_file(path_or_fileobj=b"x", path_in_repo="x", repo_id="acme/relu", repo_type="kernel", revision="v2")
    with pytest.raises(EntryNotFoundError):
        api.delete_file("not-there.txt", "acme/relu", repo_type="kernel", revision="v1")
