"""kernels' own offline flow against the embedded Hub, on a release `winattn publish` made: `kernels lock` →
`kernels download` → `kernels.load_kernel(lockfile=...)`, and an offline `kernels.get_kernel`.

kernels 0.17.2's cache resolver calls `snapshot_download(local_files_only=True)` with no `allow_patterns`, and
huggingface_hub 2.4 compares the cached tree listing of the whole commit (trees/<sha>.json) with what is on disk: any
file of the commit that `kernels download` did not fetch gives IncompleteSnapshotError → "Cannot find a local
snapshot" (hub-protocol.md §6 pitfall 2). So `winattn publish` keeps the version branch to `build/` (benchmarks and
the card go to `main`): with one variant the flow works as is; with several, `kernels download --all-variants` is
needed (this machine's variant alone is not the whole commit). `winattn vendor` (plain directory + lock, no HF cache)
has neither limit.
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

project, sha = Path(sys.argv[1]), sys.argv[2]
for command in ("lock", "download"):  # = `kernels lock DIR`, `kernels download DIR`, HF_ENDPOINT at the server
    sys.argv = ["kernels", command, str(project)]
    main()
constants.HF_HUB_OFFLINE = True  # from here on any Hub request raises OfflineModeIsEnabled

import kernels
k = kernels.load_kernel("{repo}", lockfile=project / "kernels.lock")
q = torch.randn(1, 8, 2, 16)
torch.testing.assert_close(k.attention(q, q, q), k.reference.attention(q, q, q), atol=1e-4, rtol=1e-4)
print("loaded offline from", Path(k.__file__).parent)
g = kernels.get_kernel("{repo}", revision=sha)   # offline, the locked commit: from the cache
print("get_kernel offline from", Path(g.__file__).parent)
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
    """kernels' own CLI (lock, download) with HF_ENDPOINT at the server, then `load_kernel` and `get_kernel` in
    offline mode (`revision=` the locked commit), on a release as `winattn publish` makes it (benchmarks and card
    included).

    One subprocess: this process may already hold the build's ops namespace (session `kernel` fixture)."""
    (src_root / "benchmarks" / "benchmark.py").write_text("# benchmark\n")
    (src_root / "benchmarks" / "RESULTS.md").write_text("# Results\n")
    sha = publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text(f'[tool.kernels.dependencies]\n"{REPO}" = 1\n')
    r = subprocess.run(
        [sys.executable, "-c", LOCK_DOWNLOAD_LOAD.format(repo=REPO), str(project), sha],
        env=hub.env, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    locks = json.loads((project / "kernels.lock").read_text())
    assert locks == [{"dependency": {"repo-id": REPO, "version": 1}, "lock": {"commit": sha}}]
    variant = next(build_copy.iterdir()).name
    assert f"loaded offline from {hub.env['HF_HUB_CACHE']}" in r.stdout
    assert r.stdout.count(f"snapshots/{sha}/build/{variant}") == 2


@pytest.mark.parametrize("all_variants, loads", [(False, False), (True, True)])
def test_with_several_variants_load_kernel_needs_them_all_downloaded(
    hub, build_copy, src_root, tmp_path, monkeypatch, make_variant, all_variants, loads
):
    """Two variants on the branch: `kernels download` (this machine's variant) is not enough for kernels 0.17.2's
    offline resolver, `kernels download --all-variants` is (module docstring; the README says so). Fails loudly
    once kernels fixes it."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import IncompleteSnapshotError
    from kernels.resolver import resolve_hub_cache_kernel

    (src_root / "benchmarks" / "benchmark.py").write_text("# benchmark\n")  # on main: does not matter
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
    assert "torch29-cxx11" in str(e.value.__cause__)


def test_kernels_benchmark_cannot_fetch_a_kernel_repo(hub, build_copy, src_root, monkeypatch):
    """Why the card does not advise `kernels benchmark REPO@v1`: kernels 0.17.2 downloads the repository as a model
    repository (no repo_type), which a kernel repository is not. Fails loudly once kernels fixes it."""
    from huggingface_hub.errors import RepositoryNotFoundError
    from kernels.cli import benchmark

    (src_root / "benchmarks" / "benchmark.py").write_text("# benchmark\n")
    publish(REPO, build_dir=build_copy, endpoint=hub.url, token=TOKEN, repo_root=src_root)
    monkeypatch.setattr(benchmark, "MISSING_DEPS", [])  # `kernels[benchmark]` is not installed here
    with pytest.raises(RepositoryNotFoundError) as e:
        benchmark.run_benchmark(f"{REPO}@v1", branch=None, version=None)
    assert f"/api/models/{REPO}" in str(e.value) or "models" in str(e.value.response.url)
