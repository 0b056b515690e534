"""Shared fixtures: the compiled kernel under test and device selection.

The `kernel` fixture builds the variant for this machine once per session with `winattn build` (incremental: a
no-op when nothing changed) and loads it the way `winattn.load` does (verified, from a private copy). On a GPU machine the CUDA variant is
built beforehand (`make gpu-check`) and loaded the same way.
"""

from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_DIR = REPO_ROOT / "build"


# The files that took longest in a `make test` on the 2-core CI machine type (seconds, pytest --durations, summed per
# file): under xdist (`make test` hands out whole files, in collection order) they start first, so that the run does
# not end with one worker on a long file while the other idles. Only the order changes; without xdist it is kept.
_LONG_FILES_FIRST = [
    "docs/test_snippets.py",  # 71
    "unit/test_kernel_headers.py",  # 31 (two nvcc at a time)
    "unit/test_build.py",  # 29
    "integrations/test_fastvideo.py",  # 22
    "integrations/test_diffusers.py",  # 21
    "loader/test_cache_and_network.py",  # 18
    "security/test_kernel_inputs.py",  # 17
    "security/test_loader_hostile_hub.py",  # 16
    "loader/test_refusals.py",  # 16
    "test_attention.py",  # 16
]


def _long_files_first(items):
    tests_dir = Path(__file__).resolve().parent
    rank = {name: i for i, name in enumerate(_LONG_FILES_FIRST)}

    def key(item):
        try:
            rel = Path(item.path).resolve().relative_to(tests_dir).as_posix()
        except ValueError:
            return len(rank)
        return rank.get(rel, len(rank))

    items.sort(key=key)  # (stable: collection order within a file and among the rest)


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):
        _long_files_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `make gpu-check` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session):
    """CI's CUDA compile (tests/unit/ci_cuda_units.py, ~500 CPU-seconds) started now, nice'd, when its test is
    selected and nvcc is here: it runs on the core the mostly single-process suite leaves idle, and the test, which
    runs late, waits for it (~5 of CI's 25 minutes otherwise). Under pytest-xdist (`make test` runs two workers) the
    controller starts it instead, once for all workers (`pytest_xdist_node_collection_finished` below)."""
    import tempfile

    from unit.ci_cuda_units import TEST_NAME, start_in_background

    from winattn._build import toolchain

    if session.config.option.collectonly or hasattr(session.config, "workerinput"):
        return
    if not any(i.name == TEST_NAME for i in session.items) or not toolchain.find_cuda(required=False):
        return
    obj_root = Path(tempfile.mkdtemp(prefix="winattn-ci-cuda-"))
    session.config._ci_cuda_compile = (obj_root, start_in_background(obj_root))


# pytest-xdist (`make test` runs `pytest -n 2`): the controller, idle otherwise, runs the one early CUDA compile
# for all workers. It tells each worker where (`pytest_configure_node`), starts the compile once a worker's
# collection holds the test, before any test runs (xdist schedules only after every worker has collected), and marks
# it started; whichever worker runs the test waits for the exit code a thread here writes
# (unit.ci_cuda_units.early_compile). Without nvcc nothing starts and the test compiles (and fails) on its own.


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    import tempfile

    from unit.ci_cuda_units import XDIST_KEY

    config = node.config
    if not hasattr(config, "_ci_cuda_dir"):
        config._ci_cuda_dir = Path(tempfile.mkdtemp(prefix="winattn-ci-cuda-"))
    node.workerinput[XDIST_KEY] = str(config._ci_cuda_dir)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    import threading

    from unit.ci_cuda_units import EXIT_CODE, STARTED, TEST_NAME, start_in_background

    from winattn._build import toolchain

    config = node.config
    obj_root = getattr(config, "_ci_cuda_dir", None)
    if obj_root is None or hasattr(config, "_ci_cuda_compile") or config.option.collectonly:
        return
    if not any(i.split("[")[0].endswith(f"::{TEST_NAME}") for i in ids) or not toolchain.find_cuda(required=False):
        return
    proc = start_in_background(obj_root)
    config._ci_cuda_compile = (obj_root, proc)

    def record_exit_code():
        rc = proc.wait()
        try:
            (obj_root / f"{EXIT_CODE}.tmp").write_text(str(rc))
            (obj_root / f"{EXIT_CODE}.tmp").replace(obj_root / EXIT_CODE)
        except OSError:  # (the session is over: pytest_unconfigure killed the compile and removed its dir)
            pass

    threading.Thread(target=record_exit_code, daemon=True).start()
    (obj_root / STARTED).touch()


def pytest_unconfigure(config):
    """The early compile never outlives the session (an interrupted run, a failing test before it)."""
    import os
    import shutil
    import signal
    import subprocess

    early = getattr(config, "_ci_cuda_compile", None)
    if early is not None:
        obj_root, proc = early
        if proc.poll() is None:  # (a process group of its own; ninja stops its nvcc jobs on SIGTERM)
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(obj_root, ignore_errors=True)
    if getattr(config, "_ci_cuda_dir", None) is not None:  # (xdist's controller; it made the dir for the workers)
        shutil.rmtree(config._ci_cuda_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def built_variant() -> Path:
    """Path of the variant directory built for this machine's backend.

    WINATTN_VARIANT_DIR points at a prebuilt variant instead (the GPU machine runs what was compiled here).
    """
    import os

    if os.environ.get("WINATTN_VARIANT_DIR"):
        return Path(os.environ["WINATTN_VARIANT_DIR"]).resolve()
    from winattn.build import build_variant

    backend = "cuda" if torch.cuda.is_available() else "cpu"
    return build_variant(REPO_ROOT, backend=backend, build_dir=BUILD_DIR)


@pytest.fixture(scope="session")
def kernel(built_variant, tmp_path_factory):
    """The window-attention module of the build under test, imported as `winattn.load` imports: verified, from
    winattn's private copy (a vendored directory made of the build, so no Hub is needed).

    Why not `kernels.get_local_kernel(built_variant)`: winattn hands back only modules it imported itself
    (`KernelConflictError` otherwise), so a module kernels imported first would make every later in-process
    `winattn.load` of this build refuse. This way those loads get this module back (`LoadInfo.reused_from`).
    """
    import json
    import shutil

    import winattn
    from winattn.variant import DEFAULT_REPO, LOCK_FILENAME
    from winattn.vendor import LOCK_FORMAT, variant_lock_entry

    root = tmp_path_factory.mktemp("kernel-under-test")
    vendored = root / "vendored"
    shutil.copytree(built_variant, vendored / built_variant.name,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    lock = {"format": LOCK_FORMAT, "repo": DEFAULT_REPO, "version": 1, "revision": "v1", "commit": "0" * 40,
            "variants": {built_variant.name: variant_lock_entry(vendored / built_variant.name)}}
    (vendored / LOCK_FILENAME).write_text(json.dumps(lock))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WINATTN_CACHE", str(root / "winattn-cache"))
        return winattn.load(DEFAULT_REPO, vendored=vendored)


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


# Folders whose tests never import a build (the Hub's HTTP tests; the builder's own tests on throwaway trees): the
# autouse fixture below does not compile the kernel for them, so `pytest tests/hub` starts at once.
_NO_BUILD_DIRS = {"hub"}
_NO_BUILD_FILES = {"unit/test_build.py", "unit/test_matrix.py", "unit/test_repo_config.py",
                   "unit/test_variant_resolution.py", "unit/test_demo_report.py"}


def _needs_build(path: Path) -> bool:
    try:
        rel = Path(path).resolve().relative_to(Path(__file__).resolve().parent).as_posix()
    except ValueError:
        return True
    return rel.split("/")[0] not in _NO_BUILD_DIRS and rel not in _NO_BUILD_FILES


@pytest.fixture(autouse=True)
def _build_imported_first(request):
    """Import the build directory's module before any test loads the same build from another path.

    All copies of one build share an op namespace and a module name, which torch registers once per process. With the
    build imported first by winattn (`kernel`), every in-process `winattn.load` of it verifies its own copy and then
    reuses that module (`LoadInfo.reused_from`); loads that must really import run in child processes.

    Skipped for the folders and files that never import a build (`_NO_BUILD_DIRS`, `_NO_BUILD_FILES`); everywhere
    else the session-scoped `kernel` fixture is built once and reused.
    """
    if _needs_build(request.node.path):
        return request.getfixturevalue("kernel")
    return None
