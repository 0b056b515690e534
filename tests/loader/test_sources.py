"""One source chain (`winattn.sources`): `winattn info` and `winattn.load` pick the same variant and commit from each
source; a wrong key is not "repaired" by a download; a kernel of another API version is refused by name."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

import winattn
from winattn.cli import main
from winattn.digest import compute_digest
from winattn.variant import LOCK_FILENAME

from .conftest import REPO, publish_build, run_child

# A stable-ABI variant for this machine's torch: kernels prefers it to the build's abi210 one (highest ABI first).
NEWER_VARIANT = "torch-stable-abi{}-cpu-x86_64-linux"


def _info(args, capsys) -> dict:
    rc = main(["info", *args, "--json"])
    info = json.loads(capsys.readouterr().out)
    assert rc == 0, info
    return info


def _newer_variant() -> str:
    import torch

    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return NEWER_VARIANT.format(f"{major}{minor}")


@pytest.mark.parametrize("source", ["hub", "offline-cache", "vendored"])
def test_info_and_load_pick_the_same_variant_and_commit(source, hub, hf_cache, make_build, tmp_path, capsys,
                                                        monkeypatch):
    from huggingface_hub import constants

    from winattn.vendor import vendor

    build = make_build()
    commit = publish_build(hub, build)
    kwargs, args = dict(version=1, endpoint=hub.url), [REPO, "--endpoint", hub.url]
    if source == "offline-cache":
        winattn.load(REPO, version=1, endpoint=hub.url)  # the online load that verifies and records the cache entry
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    elif source == "vendored":
        out = vendor(REPO, version=1, out_dir=tmp_path / "vendored", endpoint=hub.url)
        # A compatible variant kernels would prefer, but not in the lock: winattn.load ignores it, so must info.
        shutil.copytree(out / build.variant, out / _newer_variant())
        kwargs, args = dict(vendored=out), [str(out)]
    info = _info(args, capsys)
    module = winattn.load(REPO, **kwargs)
    loaded = module.__winattn_info__
    assert (loaded.source, loaded.variant, loaded.commit) == (source, build.variant, commit)
    assert info["selected"] == loaded.variant
    assert (info.get("commit"), info.get("source")) == (loaded.commit, loaded.source)
    if source == "vendored":
        assert {"variant": _newer_variant(), "reason": f"not in {LOCK_FILENAME}"} in info["rejected"]


def test_a_wrong_key_is_not_downloaded_again(hub, hf_cache, make_build, keys, caplog):
    build = make_build()
    publish_build(hub, build, signing_key=keys["other"][0])
    kwargs = dict(version=1, endpoint=hub.url, public_keys=[keys["good"][1]], require_signature=True)
    for _ in range(2):  # the second load finds the first one's cached copy
        with caplog.at_level(logging.WARNING, logger="winattn"), pytest.raises(winattn.VerificationError,
                                                                                match="unknown key"):
            winattn.load(REPO, **kwargs)
    assert "downloading it again" not in caplog.text


def test_a_kernel_of_another_api_version_is_refused_by_name(hub, hf_cache, make_build):
    build = make_build()
    init = build.variant_dir / "__init__.py"
    init.write_text(init.read_text().replace("API_VERSION = 1", "API_VERSION = 2"))
    meta_path = build.variant_dir / "metadata.json"
    metadata = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps(dict(metadata, digest=compute_digest(build.variant_dir)), indent=2))
    publish_build(hub, build)
    # In a fresh interpreter: this one already imported the build's op namespace.
    result, = run_child([{"name": "api", "kwargs": {"repo_id": REPO, "version": 1, "endpoint": hub.url}}])
    assert result["error_type"] == "IncompatibleKernelError", result.get("traceback")
    assert "VerificationError" in result["error_mro"]
    assert "API_VERSION is 2, but this winattn speaks API version 1: upgrade winattn" in result["error"]


def test_a_listed_variant_no_machine_here_loads_is_still_a_candidate_to_install(hub, hf_cache, make_build):
    """`NoVariant.for_variant` (what `verify REPO --all-variants` checks): a `Candidate` of the same commit, which
    `fetch.install` downloads into the cache as a `LocalVariant` held to the source's terms."""
    from winattn import fetch, sources

    from .conftest import push, variant_files

    build = make_build()
    cuda = "torch-stable-abi210-cu126-x86_64-linux"
    commit = push(hub, REPO, {k.replace(build.variant, cuda): v for k, v in variant_files(build).items()})
    missing = sources.locate(REPO, version=1, endpoint=hub.url, enforce_trust=False)
    assert isinstance(missing, sources.NoVariant) and missing.listing.names == (cuda,)
    candidate = missing.for_variant(cuda)
    assert (candidate.source, candidate.commit, candidate.variant) == ("hub", commit, cuda)
    local = fetch.install(candidate)
    assert (local.path / "metadata.json").is_file() and local.path.name == cuda
    assert local.expect == {"repo_id": REPO, "version": 1} and local.lock_entry is None
