"""`winattn vendor` against an embedded HubServer: pinned download, lock file, variant selection by kernels."""

import hashlib
import json

import pytest

from winattn.cli import main
from winattn.errors import KernelNotFoundError, OfflineError, VerificationError
from winattn.publish import publish
from winattn.vendor import LOCK_FILENAME, lock_sha256, read_lock, vendor

from .conftest import REPO, TOKEN


def _sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_vendor_writes_the_variant_and_a_lock_pinned_to_the_commit(
    hub, build_copy, src_root, make_variant, keypair, tmp_path
):
    variant = next(build_copy.iterdir()).name
    other = make_variant(build_copy, name="torch29-cxx11-cpu-x86_64-linux").name  # not for this machine (torch 2.13)
    sha1 = publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    out = tmp_path / "vendor"

    assert vendor(REPO, version=1, out_dir=out, endpoint=hub.url) == out
    lock = read_lock(out)
    assert sorted(p.name for p in out.iterdir()) == sorted([variant, LOCK_FILENAME])  # kernels picked this machine's
    assert (lock["repo"], lock["version"], lock["revision"], lock["commit"]) == (REPO, 1, "v1", sha1)
    assert lock["variants"] == {
        variant: {"metadata_sha256": _sha256(out / variant / "metadata.json"), "signature_sha256": None}
    }
    assert lock["variants"][variant]["metadata_sha256"] == _sha256(build_copy / variant / "metadata.json")
    assert sorted(p.name for p in (out / variant).iterdir()) == sorted(p.name for p in (build_copy / variant).iterdir())
    assert not any(p.is_symlink() for p in (out / variant).iterdir())

    # Signed re-publish = new commit on v1: the lock follows it and records the signature's hash.
    sha2 = publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root,
                   signing_key=keypair[0])
    assert sha2 != sha1
    main(["vendor", "--repo", REPO, "--version", "1", "--out", str(out), "--all-variants", "--endpoint", hub.url])
    lock = read_lock(out)
    assert lock["commit"] == sha2 and sorted(lock["variants"]) == sorted([variant, other])
    for name in (variant, other):
        assert lock["variants"][name] == {
            "metadata_sha256": _sha256(out / name / "metadata.json"),
            "signature_sha256": _sha256(out / name / "metadata.json.sigstore"),
        }

    # By commit sha, one named variant, into a fresh dir.
    single = tmp_path / "single"
    vendor(REPO, revision=sha1, out_dir=single, variants=[other], endpoint=hub.url)
    lock = read_lock(single)
    assert (lock["version"], lock["revision"], lock["commit"], list(lock["variants"])) == (None, sha1, sha1, [other])


def test_unknown_variant_is_a_clear_error(hub, build_copy, src_root, tmp_path, capsys):
    publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    variant = next(build_copy.iterdir()).name
    with pytest.raises(KernelNotFoundError, match=f"variant\\(s\\) torch-nope not in {REPO}@.*available: {variant}"):
        vendor(REPO, version=1, out_dir=tmp_path / "v", variants=["torch-nope"], endpoint=hub.url)
    rc = main(["vendor", "--repo", REPO, "--version", "1", "--out", str(tmp_path / "v"), "--variant", "torch-nope",
               "--endpoint", hub.url])
    err = capsys.readouterr().err
    assert rc == 1 and "winattn vendor: error: variant(s) torch-nope not in" in err and variant in err
    assert not (tmp_path / "v" / LOCK_FILENAME).exists()


def test_unknown_version_and_repo(hub, build_copy, src_root, tmp_path):
    publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    with pytest.raises(KernelNotFoundError, match="version 7 of .* not found .*available versions: v1$"):
        vendor(REPO, version=7, out_dir=tmp_path / "v", endpoint=hub.url)
    with pytest.raises(KernelNotFoundError, match="kernel repo winattn/nope not found"):
        vendor("winattn/nope", version=1, out_dir=tmp_path / "v", endpoint=hub.url)


def test_read_lock_errors(tmp_path):
    with pytest.raises(OfflineError, match="does not exist"):
        read_lock(tmp_path)
    (tmp_path / LOCK_FILENAME).write_text(json.dumps({"format": 1, "repo": "a/b", "commit": "xyz", "variants": {}}))
    with pytest.raises(VerificationError, match="commit 'xyz' is not a 40-hex sha"):
        read_lock(tmp_path)


def test_variant_not_matching_its_digest_is_not_vendored(hub, api, make_variant, tmp_path):
    from huggingface_hub import CommitOperationAdd

    v = make_variant(tmp_path / "b", name="torch-cpu")
    (v / "helpers.py").write_text("tampered = True\n")  # after the digest was written
    api.create_repo(REPO, repo_type="kernel")
    api.create_branch(REPO, branch="v1", repo_type="kernel")
    api.create_commit(
        REPO,
        [CommitOperationAdd(f"build/torch-cpu/{p.name}", str(p)) for p in v.iterdir()],
        commit_message="bypass publish checks",
        repo_type="kernel",
        revision="v1",
    )
    out = tmp_path / "vendor"
    with pytest.raises(VerificationError, match="variant torch-cpu of .*digest mismatch.*helpers.py"):
        vendor(REPO, version=1, out_dir=out, endpoint=hub.url)
    assert sorted(p.name for p in out.iterdir()) == []


def test_vendor_of_another_repository_prints_a_load_line_that_loads_it(hub, build_copy, src_root, tmp_path, capsys):
    """The printed load line names the repository (without it, winattn.load asks for winattn/window-attention and the
    lock refuses); --quiet prints only the lock line."""
    import winattn

    other = "winattn/other-kernel"
    publish(other, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    out = tmp_path / "v"
    assert main(["vendor", other, "--local-dir", str(out), "--endpoint", hub.url]) == 0
    captured = capsys.readouterr()
    hint = captured.err.strip().splitlines()[-1]
    assert hint == f"load it with: winattn.load({other!r}, vendored={str(out)!r})"
    module = eval(hint.split(": ", 1)[1], {"winattn": winattn})  # as printed
    assert module.__winattn_info__.source == "vendored" and module.__winattn_info__.repo_id == other

    assert main(["vendor", other, "--local-dir", str(out), "--endpoint", hub.url, "--quiet"]) == 0
    captured = capsys.readouterr()
    lock_line = f"{out / LOCK_FILENAME}: {other}@{read_lock(out)['commit']} (lock sha256 {lock_sha256(out)})"
    assert captured.out.splitlines() == [lock_line]
    assert captured.err == ""
