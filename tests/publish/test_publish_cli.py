"""`winattn publish` as a newcomer meets it (issue 18): a summary, --commit-message, no signature it did not make,
build/ never rewritten, the repository root found from a subdirectory; `winattn vendor` defaults and trust note;
`winattn info --json` fields."""

import hashlib
import json
import os

import pytest

from winattn.cli import main
from winattn.errors import PublishError
from winattn.publish import publish, publish_report
from winattn.signing import SIGNATURE_FILENAME, public_key_fingerprint

from .conftest import REPO, TOKEN


def _tree_digest(path):
    return {p.relative_to(path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def test_cli_prints_a_summary_and_takes_a_commit_message(hub, api, build_copy, src_root, keypair, capsys):
    rc = main(["publish", "--build-dir", str(build_copy), "--repo-root", str(src_root), "--endpoint", hub.url,
               "--token", TOKEN, "--signing-key", str(keypair[0]), "--commit-message", "Release 1.0.1"])
    assert rc == 0
    out = capsys.readouterr().out
    (variant,) = [p.name for p in build_copy.iterdir()]
    head = api.list_repo_commits(REPO, repo_type="kernel", revision="v1")[0]
    assert head.title == "Release 1.0.1"
    assert f"{REPO} v1 at {hub.url}: uploaded" in out
    assert f"variant  {variant} (signed by key sha256:{public_key_fingerprint(keypair[1])})" in out
    assert f"commit   {head.commit_id}" in out and f"/commit/{head.commit_id}" in out
    assert "card     main README.md updated" in out

    # Publishing the same build again: said once, by us, not twice by huggingface_hub.
    rc = main(["publish", "--build-dir", str(build_copy), "--repo-root", str(src_root), "--endpoint", hub.url,
               "--token", TOKEN, "--signing-key", str(keypair[0])])
    captured = capsys.readouterr()
    assert rc == 0 and "No files have been modified" not in captured.err + captured.out


def test_signing_never_rewrites_the_build_dir(hub, api, build_copy, src_root, keypair):
    variant_dir = next(build_copy.iterdir())
    before = _tree_digest(build_copy)
    publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root, signing_key=keypair[0])
    assert _tree_digest(build_copy) == before and not (variant_dir / SIGNATURE_FILENAME).exists()
    assert f"build/{variant_dir.name}/{SIGNATURE_FILENAME}" in api.list_repo_files(REPO, repo_type="kernel",
                                                                                    revision="v1")


def test_a_signature_publish_did_not_make_is_refused(hub, api, build_copy, src_root, keypair, other_keypair):
    """The demo leaves a signature made with its throwaway key in build/: a later unsigned publish must not upload
    it; with --signing-key, ours replaces it in the upload and build/ keeps the old file."""
    from winattn.signing import sign_variant

    variant_dir = next(build_copy.iterdir())
    sign_variant(variant_dir, other_keypair[0], repo_id=REPO, version=1)
    with pytest.raises(PublishError, match=r"a signature this publish did not make .*--signing-key.*rm "):
        publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    assert not api.repo_exists(REPO, repo_type="kernel")  # refused before anything was created or uploaded

    old = (variant_dir / SIGNATURE_FILENAME).read_bytes()
    result = publish_report(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root,
                            signing_key=keypair[0])
    assert result.signer == f"sha256:{public_key_fingerprint(keypair[1])}"
    assert (variant_dir / SIGNATURE_FILENAME).read_bytes() == old  # build/ untouched
    from winattn.load import load

    wa = load(REPO, version=1, endpoint=hub.url, public_keys=[keypair[1]], require_signature=True)
    assert wa.__winattn_info__.commit == result.commit


def test_publish_finds_the_repo_root_from_a_subdirectory(hub, api, build_copy, src_root, monkeypatch, capsys):
    import shutil

    shutil.move(str(build_copy), str(src_root / "build"))
    (src_root / "benchmarks" / "deep").mkdir()
    monkeypatch.chdir(src_root / "benchmarks" / "deep")
    assert main(["publish", "--endpoint", hub.url, "--token", TOKEN]) == 0
    assert "uploaded" in capsys.readouterr().out

    monkeypatch.chdir(src_root.parent)  # no build.toml here or above
    assert main(["publish", "--endpoint", hub.url, "--token", TOKEN]) == 1
    err = capsys.readouterr().err
    assert "--repo-root DIR" in err and "repo_root" not in err.replace("--repo-root", "")


def test_vendor_defaults_to_version_1_and_notes_that_vendoring_is_the_trust_decision(
        hub, api, build_copy, src_root, tmp_path, monkeypatch, capsys):
    publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    publish("evil/window-attention", build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    monkeypatch.chdir(tmp_path)
    assert main(["vendor", "--endpoint", hub.url]) == 0  # REPO_ID, version 1 and vendor/ are the defaults
    err = capsys.readouterr().err
    assert json.loads((tmp_path / "vendor" / "window-attention.lock").read_text())["revision"] == "v1"
    assert "not a trusted kernel publisher" not in err
    assert "winattn.load('winattn/window-attention', vendored='vendor')" in err

    assert main(["vendor", "evil/window-attention", "--local-dir", "evil", "--endpoint", hub.url]) == 0
    err = capsys.readouterr().err
    assert "note: evil is not a trusted kernel publisher" in err and "by vendoring it you decided to trust it" in err
    assert "winattn.load('evil/window-attention', vendored='evil')" in err


def test_info_json_carries_ids_and_the_full_commit(hub, api, build_copy, src_root, capsys):
    commit = publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    assert main(["info", "--endpoint", hub.url, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["repo_id"], info["version"], info["revision"], info["commit"]) == (REPO, 1, "v1", commit)
    assert info["selected"] == next(build_copy.iterdir()).name


def test_hub_serve_writes_a_missing_token_file_mode_0600(tmp_path):
    from winattn.hub.cli import create_token_file

    path = tmp_path / "token.txt"
    assert create_token_file(path) == path.resolve()
    token = path.read_text().strip()
    assert len(token) >= 32 and os.stat(path).st_mode & 0o777 == 0o600
    assert create_token_file(path) is None and path.read_text().strip() == token  # never overwritten


@pytest.mark.parametrize("command", ["vendor", "info", "verify"])
@pytest.mark.parametrize("flags", [["--version", "-1"], ["--revision", "a..b"], ["--revision", "x y"]])
def test_a_bad_version_or_revision_is_a_usage_error_not_a_traceback(command, flags, capsys):
    """`--version -1` / `--revision a..b` raised ValueError out of resolve.check_version_args with a traceback (the
    CLI maps only winattn's and the Hub client's errors); they are usage errors naming the flag, before any Hub call."""
    with pytest.raises(SystemExit) as exc:
        main([command, *flags, "--endpoint", "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"argument {flags[0]}" in err and "Traceback" not in err


def test_vendor_into_a_path_that_is_no_directory_is_one_line(tmp_path, hub, api, build_copy, src_root, capsys):
    """`winattn vendor --local-dir FILE` (or an unwritable place) ended in a FileExistsError traceback from mkdir; it
    is one line naming the path, and the file is left as it was."""
    publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    target = tmp_path / "a-file"
    target.write_text("keep me\n")
    capsys.readouterr()
    assert main(["vendor", "--local-dir", str(target), "--endpoint", hub.url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("winattn vendor: error: ") and str(target) in err and "Traceback" not in err
    assert target.read_text() == "keep me\n"


@pytest.mark.parametrize("name", ["RESULTS.md", "benchmark_secret.py"])
def test_publish_refuses_a_benchmark_file_that_is_a_link(hub, api, build_copy, src_root, tmp_path, name):
    """benchmarks/ is uploaded to main as it is: a link there (git stores links; a contributed RESULTS.md ->
    ~/.ssh/id_ed25519) made publish upload the file it points at, publicly, and quote RESULTS.md's target into the
    card. A link is refused, naming it, before anything is uploaded."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOKEN=hunter2\n")
    (src_root / "benchmarks" / name).symlink_to(secret)
    with pytest.raises(PublishError, match=f"benchmarks/{name}.* link"):
        publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    assert not api.repo_exists(REPO, repo_type="kernel")


def test_publish_refuses_a_card_template_that_is_a_link(hub, api, build_copy, src_root, tmp_path):
    """CARD.md becomes the public README.md: a link there published the file it points at."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOKEN=hunter2\n")
    (src_root / "CARD.md").unlink()
    (src_root / "CARD.md").symlink_to(secret)
    with pytest.raises(PublishError, match="CARD.md.* link"):
        publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    assert not api.repo_exists(REPO, repo_type="kernel")
