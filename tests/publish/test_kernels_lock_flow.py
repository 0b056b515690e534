"""kernels' own offline flow against the embedded Hub: `kernels lock` → `kernels download` → `kernels.load_kernel`.

Works for a version branch that holds only the variant directory. With anything else on the branch (benchmarks/,
another variant not downloaded), kernels 0.17.2 `load_kernel` fails: its cache resolver calls
`snapshot_download(local_files_only=True)` with no `allow_patterns`, and huggingface_hub 2.4 compares the cached
tree listing of the whole commit (trees/<sha>.json) with what is on disk → IncompleteSnapshotError → kernels'
"Cannot find a local snapshot" (hub-protocol.md §6 pitfall 2). `kernels download --all-variants` is a workaround
only when the branch holds nothing but build/, which `winattn publish` does not promise (benchmarks/ goes there, as
with kernel-builder). `winattn vendor` (plain directory + lock, no HF cache) does not have that limitation.
"""

import argparse
import json
import subprocess
import sys

import pytest

from winattn.publish import publish

from .conftest import REPO, TOKEN

LOCK_DOWNLOAD_LOAD = """
import sys, torch
from pathlib import Path
from huggingface_hub import constants
from kernels.cli import main

project = Path(sys.argv[1])
for command in ("lock", "download"):  # = `kernels lock DIR`, `kernels download DIR`, HF_ENDPOINT at the server
    sys.argv = ["kernels", command, str(project)]
    main()
constants.HF_HUB_OFFLINE = True  # from here on any Hub request raises OfflineModeIsEnabled

import kernels
k = kernels.load_kernel("{repo}", lockfile=project / "kernels.lock")
q = torch.randn(1, 8, 2, 16)
torch.testing.assert_close(k.attention(q, q, q), k.reference.attention(q, q, q), atol=1e-4, rtol=1e-4)
print("loaded offline from", Path(k.__file__).parent)
"""


def _lock_and_download(project, sha, all_variants=False):
    from kernels.cli.download import download_kernels
    from kernels.cli.lock import lock_kernels

    project.mkdir(exist_ok=True)
    (project / "pyproject.toml").write_text(f'[tool.kernels.dependencies]\n"{REPO}" = 1\n')
    lock_kernels(argparse.Namespace(project_dir=project))
    locks = json.loads((project / "kernels.lock").read_text())
    assert locks == [{"dependency": {"repo-id": REPO, "version": 1}, "lock": {"commit": sha}}]
    download_kernels(argparse.Namespace(project_dir=project, all_variants=all_variants))


def test_kernels_lock_download_and_offline_load_kernel(hub, build_copy, src_root, tmp_path):
    """kernels' own CLI (lock, download) with HF_ENDPOINT at the server, then `load_kernel` in offline mode.

    One subprocess: this process may already hold the build's ops namespace (session `kernel` fixture)."""
    sha = publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(f'[tool.kernels.dependencies]\n"{REPO}" = 1\n')
    r = subprocess.run(
        [sys.executable, "-c", LOCK_DOWNLOAD_LOAD.format(repo=REPO), str(project)],
        env=hub.env, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    locks = json.loads((project / "kernels.lock").read_text())
    assert locks == [{"dependency": {"repo-id": REPO, "version": 1}, "lock": {"commit": sha}}]
    assert f"snapshots/{sha}/build/{next(build_copy.iterdir()).name}" in r.stdout


@pytest.mark.parametrize(
    "extra, all_variants, loads",
    [
        ("benchmarks", False, False),
        ("benchmarks", True, False),  # `--all-variants` fetches build/* only: benchmarks/ still missing
        ("second-variant", False, False),  # only this machine's variant was fetched
        ("second-variant", True, True),  # the workaround when the branch holds nothing but build/
    ],
)
def test_load_kernel_needs_every_file_of_the_commit_in_the_cache(
    hub, build_copy, src_root, tmp_path, monkeypatch, make_variant, extra, all_variants, loads
):
    """Documents the kernels 0.17.2 limitation (module docstring); fails loudly once kernels fixes it."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import IncompleteSnapshotError
    from kernels.resolver import resolve_hub_cache_kernel

    if extra == "benchmarks":
        (src_root / "benchmarks" / "benchmark.py").write_text("# benchmark\n")
    else:
        make_variant(build_copy, name="torch29-cxx11-cpu-x86_64-linux")
    sha = publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    _lock_and_download(tmp_path / "project", sha, all_variants=all_variants)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    # What load_kernel's LockedHubCacheResolver does, minus the import.
    if loads:
        kernel = resolve_hub_cache_kernel(HfApi(), REPO, revision=sha, backend=None)
        assert kernel.variant_path.name == next(p.name for p in build_copy.iterdir() if "stable-abi" in p.name)
        return
    with pytest.raises(FileNotFoundError, match="Cannot find a local snapshot") as e:
        resolve_hub_cache_kernel(HfApi(), REPO, revision=sha, backend=None)
    assert isinstance(e.value.__cause__, IncompleteSnapshotError)
    assert ("benchmarks/benchmark.py" if extra == "benchmarks" else "torch29-cxx11") in str(e.value.__cause__)
