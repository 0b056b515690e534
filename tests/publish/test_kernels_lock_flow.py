"""kernels' own offline flow against the embedded Hub: `kernels lock` → `kernels download` → `kernels.load_kernel`.

Works for a version branch that holds only the variant directory. With anything else on the branch (benchmarks/,
another variant not downloaded), kernels 0.17.2 `load_kernel` fails: its cache resolver calls
`snapshot_download(local_files_only=True)` with no `allow_patterns`, and huggingface_hub 2.4 compares the cached
tree listing of the whole commit (trees/<sha>.json) with what is on disk → IncompleteSnapshotError → kernels'
"Cannot find a local snapshot" (hub-protocol.md §6 pitfall 2). `winattn vendor` does not have that limitation.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from winattn.publish import publish

from .conftest import REPO, TOKEN

LOAD_LOCKED = """
import sys, torch, kernels
from pathlib import Path
k = kernels.load_kernel("{repo}", lockfile=Path(sys.argv[1]))
q = torch.randn(1, 8, 2, 16)
torch.testing.assert_close(k.attention(q, q, q), k.reference.attention(q, q, q), atol=1e-4, rtol=1e-4)
print("loaded offline from", Path(k.__file__).parent)
"""


def _lock_and_download(project, sha):
    from kernels.cli.download import download_kernels
    from kernels.cli.lock import lock_kernels

    project.mkdir(exist_ok=True)
    (project / "pyproject.toml").write_text(f'[tool.kernels.dependencies]\n"{REPO}" = 1\n')
    lock_kernels(argparse.Namespace(project_dir=project))
    locks = json.loads((project / "kernels.lock").read_text())
    assert locks == [{"dependency": {"repo-id": REPO, "version": 1}, "lock": {"commit": sha}}]
    download_kernels(argparse.Namespace(project_dir=project, all_variants=False))


def test_kernels_lock_download_and_offline_load_kernel(hub, build_copy, src_root, tmp_path):
    """The real `kernels` CLI with HF_ENDPOINT at the server, then `load_kernel` with the server stopped."""
    sha = publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(f'[tool.kernels.dependencies]\n"{REPO}" = 1\n')
    cli = [str(Path(sys.executable).with_name("kernels"))]
    for args in (["lock", str(project)], ["download", str(project)]):
        r = subprocess.run(cli + args, env=hub.env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"kernels {args[0]}: {r.stderr[-3000:]}"
    locks = json.loads((project / "kernels.lock").read_text())
    assert locks == [{"dependency": {"repo-id": REPO, "version": 1}, "lock": {"commit": sha}}]

    hub.stop()  # the load is fully offline
    env = dict(hub.env, HF_HUB_OFFLINE="1")
    r = subprocess.run(
        [sys.executable, "-c", LOAD_LOCKED.format(repo=REPO), str(tmp_path / "project" / "kernels.lock")],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"snapshots/{sha}/build/{next(build_copy.iterdir()).name}" in r.stdout


def test_load_kernel_fails_when_the_branch_has_files_outside_the_variant(hub, build_copy, src_root, tmp_path,
                                                                          monkeypatch):
    """Documents the kernels 0.17.2 limitation (module docstring); fails loudly once kernels fixes it."""
    from huggingface_hub import HfApi, constants
    from kernels.resolver import resolve_hub_cache_kernel

    (src_root / "benchmarks" / "benchmark.py").write_text("# benchmark\n")
    sha = publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    _lock_and_download(tmp_path / "project", sha)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    # What load_kernel's LockedHubCacheResolver does, minus the import.
    from huggingface_hub.errors import IncompleteSnapshotError

    with pytest.raises(FileNotFoundError, match="Cannot find a local snapshot") as e:
        resolve_hub_cache_kernel(HfApi(), REPO, revision=sha, backend=None)
    assert isinstance(e.value.__cause__, IncompleteSnapshotError)
    assert "benchmarks/benchmark.py" in str(e.value.__cause__)
