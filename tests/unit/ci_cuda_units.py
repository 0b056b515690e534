"""CI's CUDA check: which units of the real kernel sources CI compiles, and a runner that compiles them.

One unit of each kernel family (the name without `_hdimNN`) compiled for sm_90 with the flags of a real build
(`winattn.build.compile_sources`); `test_matrix.py::test_real_cuda_sources_compile_for_one_arch` checks the list
against build.toml and the result. Chosen for coverage, not speed: every .cu is one family's instantiations at one
head dim, and the families share their headers across head dims. All 35 units are ~1750 CPU-seconds (~15 minutes
of CI's 2 cores, past its budget); every unit, linked and ABI-checked, is compiled by each GPU session's build
(scripts/gpu_ab.sh) and by `make matrix`. These 13 are ~500 CPU-seconds of nvcc, a fifth of CI's 25 minutes on 2 cores, and the
rest of the suite leaves CPU idle: so `tests/conftest.py` starts this file as a nice'd process when the test is
collected (`start_in_background`; under `make test`'s two xdist workers, once, from the controller), and the test,
which runs late, waits for it (`early_compile`). Run alone:

    python tests/unit/ci_cuda_units.py OBJ_DIR      (exit 0: every unit compiled, listed in OBJ_DIR/compiled.json)
"""

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TEST_NAME = "test_real_cuda_sources_compile_for_one_arch"

# In the order ninja starts them: the longest compiles first (seconds on the 2-core CI machine, nice'd beside the
# tests), so that no long unit is left alone at the end while the tests wait.
CI_CUDA_UNITS = {
    # D 64 holds the most v3 forward tiles: two-CTA, 192-row, ragged, persistent, split
    "kernel-src/cuda/instantiations/fwd_v3_sm90_hdim64.cu": "v3 forward",  # 150
    "kernel-src/cuda/instantiations/bwd_v3_sm90_hdim64.cu": "v3 backward, the pair kernel",  # 80
    "kernel-src/cuda/instantiations/fwd_windows_sm90_hdim64.cu": "window forward",  # 60
    # two more v3 backward head dims, each a consumer of its own
    "kernel-src/cuda/instantiations/bwd_v3_sm90_hdim96.cu": "v3 backward on 16-column blocks (32-byte swizzle)",  # 50
    "kernel-src/cuda/instantiations/bwd_windows_wide_sm90_hdim32.cu": "wide-window backward",  # 45
    "kernel-src/cuda/instantiations/bwd_hdim64.cu": "v1 backward",  # 30
    "kernel-src/cuda/instantiations/fwd_hdim64.cu": "v1 forward (any arch: mma.sync)",  # 20
    "kernel-src/cuda/winattn_cuda.cu": "the planner (kernel_choice.h) and the dispatch",  # 15
    "kernel-src/cuda/instantiations/bwd_sm90_hdim32.cu": "window backward",  # 15
    "kernel-src/cuda/instantiations/fwd_decode.cu": "split-KV decode and its combine",  # 10
    "torch-ext/torch_binding.cpp": "the op schemas and argument checks",
    "kernel-src/cuda/instantiations/bwd_v3_sm90_hdim256.cu": "v3 backward, the split head-dim consumer",
    "kernel-src/cuda/instantiations/fwd_decode_sm90.cu": "the TMA decode",
}


def compile_units(obj_dir: Path, log=print) -> list[str]:
    from winattn.build import compile_sources

    return compile_sources(REPO_ROOT, "cuda", list(CI_CUDA_UNITS), ["9.0"], obj_dir=obj_dir, log=log)


def start_in_background(obj_dir: Path) -> subprocess.Popen:
    """This file as a child at the lowest CPU priority (the tests keep their core; the compile takes what is idle),
    its output into OBJ_DIR/compile.log. A process group of its own (killed whole by tests/conftest.py), but not a
    session: with the kernel's autogroup scheduling a new session gets a fair share whatever its nice value, and
    the compile then slowed the tests down as much as it saved (a make test of 1304 s against 1179)."""
    obj_dir.mkdir(parents=True, exist_ok=True)
    log = open(obj_dir / "compile.log", "w")  # (the child holds it; closed here once handed over)
    try:
        return subprocess.Popen(["nice", "-n", "19", sys.executable, __file__, str(obj_dir)], stdout=log,
                                stderr=subprocess.STDOUT, cwd=REPO_ROOT, process_group=0)
    finally:
        log.close()


XDIST_KEY = "winattn_ci_cuda_dir"  # workerinput key: the object dir of the compile xdist's controller runs
STARTED, EXIT_CODE = "started", "exit-code"  # files the controller writes there


class _ControllerCompile:
    """An xdist worker's handle on the compile the controller started (tests/conftest.py): `wait()` returns its exit
    code, which a thread of the controller writes into the object dir."""

    def __init__(self, obj_dir: Path):
        self.exit_code = obj_dir / EXIT_CODE

    def wait(self) -> int:
        import time

        while not self.exit_code.is_file():
            time.sleep(0.5)
        return int(self.exit_code.read_text())


def early_compile(config) -> tuple[Path, "subprocess.Popen | _ControllerCompile"] | None:
    """(object dir, process) of the compile started before the tests ran (tests/conftest.py), or None: this pytest
    process's own child, or, in an xdist worker, the controller's (started before any test, if at all)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return getattr(config, "_ci_cuda_compile", None)
    obj_dir = Path(workerinput[XDIST_KEY]) if workerinput.get(XDIST_KEY) else None
    if obj_dir is None or not (obj_dir / STARTED).is_file():
        return None
    return obj_dir, _ControllerCompile(obj_dir)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    out = Path(sys.argv[1])
    compiled = compile_units(out)
    (out / "compiled.json").write_text(json.dumps(compiled))
    sys.exit(0 if sorted(compiled) == sorted(CI_CUDA_UNITS) else 1)
