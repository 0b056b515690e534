"""`winattn publish` against an embedded HubServer, with the real CPU build, loaded back by `kernels.get_kernel`."""

import subprocess
import sys

import pytest
import yaml

from winattn.cli import main
from winattn.errors import PublishError
from winattn.publish import publish

from .conftest import REPO, TOKEN, redigest

RUN_ATTENTION = """
import sys, torch, kernels
from pathlib import Path
from winattn.signing import verify_variant_signature
k = kernels.get_kernel("{repo}", version=1)
variant = Path(k.__file__).parent
print("signed by", verify_variant_signature(variant, [Path(sys.argv[1])]))
q, kk, v = (torch.randn(2, 16, 2, 32) for _ in range(3))
bias = torch.randn(2, 2, 16, 16)
out = k.attention(q, kk, v, bias=bias)
torch.testing.assert_close(out, k.reference.attention(q, kk, v, bias=bias), atol=1e-4, rtol=1e-4)
print("attention ok", tuple(out.shape), variant.name)
"""


def _files(api, revision):
    return sorted(api.list_repo_files(REPO, repo_type="kernel", revision=revision))


def test_publish_creates_repo_branch_and_card_in_one_commit(hub, api, build_copy, src_root):
    (src_root / "benchmarks" / "benchmark.py").write_text("# benchmark\n")
    (src_root / "benchmarks" / "RESULTS.md").write_text("# Results\n\n| case | ms |\n|---|---|\n| swin | 1.0 |\n")
    (src_root / "benchmarks" / "notes.txt").write_text("not published\n")
    variant = next(build_copy.iterdir())

    sha = publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)

    branches = {b.name: b.target_commit for b in api.list_repo_refs(REPO, repo_type="kernel").branches}
    assert branches["v1"] == sha and "main" in branches
    commits = api.list_repo_commits(REPO, repo_type="kernel", revision="v1")
    assert commits[0].commit_id == sha
    before = set(api.list_repo_files(REPO, repo_type="kernel", revision=commits[1].commit_id))
    expected = sorted(f"build/{variant.name}/{p.name}" for p in variant.iterdir() if p.is_file())
    assert _files(api, "v1") == expected  # only build/: README and benchmarks of main are not carried onto it
    assert not before & set(expected)  # every variant file arrived in that one commit

    assert _files(api, "main") == ["README.md", "benchmarks/RESULTS.md", "benchmarks/benchmark.py"]
    assert len(api.list_repo_commits(REPO, repo_type="kernel", revision="main")) == 2  # card + benchmarks: one commit
    readme = (hub_file := api.hf_hub_download(REPO, "README.md", repo_type="kernel", revision="main"))
    text = open(readme).read()
    front = yaml.safe_load(text.split("---\n")[1])
    assert front == {"library_name": "kernels", "license": "apache-2.0", "tags": ["kernel", "attention"]}
    assert f'get_kernel("{REPO}", version=1)' in text and f"`{variant.name}`" in text
    assert "- `attention`:" in text and "- `window_attention`:" in text
    assert "| swin | 1.0 |" in text and "{{" not in text
    assert "`benchmarks/RESULTS.md`, `benchmarks/benchmark.py` are on branch `main`" in text
    del hub_file


def test_benchmarks_an_earlier_publish_put_on_the_version_branch_move_to_main(hub, api, build_copy, src_root):
    """Releases published before the benchmarks moved to main: the next publish leaves v1 with build/ only."""
    from huggingface_hub import CommitOperationAdd

    publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    api.create_commit(REPO, [CommitOperationAdd(path_in_repo="benchmarks/benchmark.py", path_or_fileobj=b"# old\n")],
                      commit_message="as an older winattn publish did", repo_type="kernel", revision="v1")
    (src_root / "benchmarks" / "benchmark.py").write_text("# benchmark\n")
    publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    assert all(f.startswith("build/") for f in _files(api, "v1"))
    assert "benchmarks/benchmark.py" in _files(api, "main")


def test_second_publish_deletes_stale_files_and_keeps_other_variants(
    hub, api, build_copy, src_root, make_variant, capsys
):
    variant = next(build_copy.iterdir())
    (variant / "extra.py").write_text("stale = True\n")
    redigest(variant)
    other = make_variant(build_copy, name="torch29-cxx11-cpu-x86_64-linux")
    publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    assert f"build/{variant.name}/extra.py" in _files(api, "v1")

    (variant / "extra.py").unlink()
    redigest(variant)
    import shutil

    shutil.rmtree(other)  # not rebuilt this time: must stay on the branch untouched
    rc = main(["publish", "--repo", REPO, "--build-dir", str(build_copy), "--repo-root", str(src_root),
               "--endpoint", hub.url, "--token", TOKEN])
    assert rc == 0
    (sha,) = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("  commit ")]
    files = _files(api, "v1")
    assert api.list_repo_commits(REPO, repo_type="kernel", revision="v1")[0].commit_id == sha
    assert f"build/{variant.name}/extra.py" not in files
    assert f"build/{variant.name}/metadata.json" in files
    assert f"build/{other.name}/metadata.json" in files and f"build/{other.name}/helpers.py" in files


@pytest.mark.parametrize("breakage", ["tampered-so", "missing-ops"])
def test_broken_variant_is_refused_and_nothing_is_uploaded(hub, api, build_copy, src_root, breakage):
    variant = next(build_copy.iterdir())
    if breakage == "tampered-so":
        so = next(variant.glob("*.abi3.so"))
        data = bytearray(so.read_bytes())
        data[len(data) // 2] ^= 0xFF
        so.write_bytes(bytes(data))
        cause = f"digest mismatch.*{so.name}"
    else:
        (variant / "_ops.py").unlink()
        cause = "_ops.py is missing"
    with pytest.raises(PublishError, match=f"variant {variant.name} refused: {cause}"):
        publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    assert not api.repo_exists(REPO, repo_type="kernel")


def test_cli_reports_a_refused_variant_in_one_line(hub, build_copy, src_root, capsys):
    (next(build_copy.iterdir()) / "_ops.py").unlink()
    rc = main(["publish", "--build-dir", str(build_copy), "--repo-root", str(src_root), "--endpoint", hub.url,
               "--token", TOKEN])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("winattn publish: error: variant ") and "_ops.py is missing" in err


def test_get_kernel_loads_the_signed_published_variant(hub, api, build_copy, src_root, keypair):
    sha = publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root,
                  signing_key=keypair[0])
    variant = next(build_copy.iterdir()).name
    assert f"build/{variant}/metadata.json.sigstore" in _files(api, sha)
    # A subprocess: the session's `kernel` fixture may already hold this build's ops namespace in this process.
    r = subprocess.run(
        [sys.executable, "-c", RUN_ATTENTION.format(repo=REPO), str(keypair[1])],
        env=hub.env, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"signed by {keypair[1]}" in r.stdout and f"attention ok (2, 16, 2, 32) {variant}" in r.stdout


def test_private_repo_is_invisible_without_the_token(hub, api, build_copy, src_root):
    from huggingface_hub import HfApi

    publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root, private=True)
    assert api.repo_info(REPO, repo_type="kernel").private is True
    assert not HfApi(endpoint=hub.url, token=False).repo_exists(REPO, repo_type="kernel")


def test_dirty_build_is_flagged_on_the_card(tmp_path, build_copy, src_root, capsys):
    import json

    from winattn.card import render_card

    variant = next(build_copy.iterdir())
    meta = json.loads((variant / "metadata.json").read_text())
    meta["provenance"] = {"kernel-builder": {"version": "x", "commit": "a" * 40, "dirty": True},
                          "kernel": {"commit": "a" * 40, "dirty": True}}
    (variant / "metadata.json").write_text(json.dumps(meta))
    card = render_card(src_root, repo_id=REPO, name="window-attention", version=1, license="apache-2.0",
                       variant_dirs=[variant])
    assert f"`{variant.name}` was built from a dirty git tree" in card


def test_publishing_an_older_major_leaves_the_card_of_the_newer_one(hub, api, build_copy, src_root, capsys):
    publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    card_commit = api.list_repo_commits(REPO, repo_type="kernel", revision="main")[0].commit_id
    api.create_branch(REPO, branch="v2", repo_type="kernel")
    (next(build_copy.iterdir()) / "extra.py").write_text("fix = 1\n")
    redigest(next(build_copy.iterdir()))
    sha = publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    assert api.list_repo_commits(REPO, repo_type="kernel", revision="v1")[0].commit_id == sha
    assert api.list_repo_commits(REPO, repo_type="kernel", revision="main")[0].commit_id == card_commit
    assert "v2 is newer than v1" in capsys.readouterr().err


def test_an_unsigned_publish_over_a_signed_version_warns(hub, api, build_copy, src_root, keypair, capsys):
    variant = next(build_copy.iterdir()).name
    publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root, signing_key=keypair[0])
    assert "holds" not in capsys.readouterr().err
    publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    err = capsys.readouterr().err
    assert f"warning: v1 holds {variant} signed; this publish replaces them unsigned" in err
    assert f"build/{variant}/metadata.json.sigstore" not in _files(api, "v1")
    publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    assert "holds" not in capsys.readouterr().err  # unsigned over unsigned: nothing to say
