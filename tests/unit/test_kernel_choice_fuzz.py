"""Property-based fuzz of the kernel choice (kernel-src/cuda/kernel_choice.h). tests/unit/kernel_choice_fuzz.cpp draws
random calls from what the binding accepts (shapes at the rules' edges up to fill_common's limits, every broadcast,
dtype, stride and offset of the bias and mask, key padding, bands, scale <= 0, the Swin table, gradients), plans each
on an H200-like, an H200 MIG-slice-like and an A100-like device, unforced and under WINATTN_FORCE_KERNEL names, and
checks every choice against what the kernels, their launchers and the planner rely on: one line per invariant.
Built with UBSan and ASan where the compiler has them, so a signed overflow or a bad shift in the choice aborts.

    python tests/unit/test_kernel_choice_fuzz.py --seed 7 --calls 100000   # a longer run: its failures, if any
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FUZZ = ROOT / "tests" / "unit" / "kernel_choice_fuzz.cpp"
# ~2.5 s under the sanitizers (each call: 3 devices x (unforced + 3 forced)). The seed was redrawn when the forced
# names grew (bwd_v3_dq_*): with 20261223 the new draws of forced names left the pair path unreached.
SEED, CALLS = 20261206, 6000
SANITIZERS = ["-fsanitize=undefined,address", "-fno-sanitize-recover=all"]
ENV = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0", "UBSAN_OPTIONS": "print_stacktrace=1"}

# Bugs the fuzz found, each with its reproduction (kernel_choice_fuzz.cpp kRepros), which must stay clean. The last
# three are counts the kernels keep in int (a mask-bits plane's words, forward v3's tile index, decode's 1-D grid):
# kernel_choice.h now refuses those kernels past kIntCountMax, and a call falls through to one that takes it.
FIXED = ["decode_rows_overflow", "v3_bits_96_key_blocks", "bwd_dbias_writers_overflow", "mask_bits_plane_overflow",
         "v3_tiles_overflow", "decode_grid_overflow"]
# every kernel and score-term path the random calls must reach (the fuzz proves nothing about a path it never takes)
MUST_COVER = [
    "fwd_v1", "fwd_decode", "fwd_decode_tma", "fwd_windows bn=64", "fwd_windows bn=64 folded", "fwd_windows bn=128",
    "fwd_windows bn=160 bits", "fwd_windows bn=256", "fwd_windows bn=256 folded",
    *[f"fwd_v3 terms={t} tile=0" for t in range(8)], "fwd_v3 terms=0 tile=1", "fwd_v3 terms=0 tile=2",
    "fwd_v3 terms=0 tile=6", "fwd_v3 rows192 d48", "fwd_v3 rows192 d64",
    "fwd_v3 rows192 d96", "fwd_v3 terms=0 tile=8", "fwd_v3 kv-resident",
    "fwd_v3 two-ctas staged", "fwd_v3 ragged staged", "fwd_v3 terms=4 tile=3",
    "bwd_v1", "bwd_windows", "bwd_windows_wide N128", "bwd_windows_wide N144", "bwd_windows_wide N256",
    "bwd_windows_wide N256 bits", "bwd_v3 terms=0 dbias=0", "bwd_v3 terms=1 dbias=2", "bwd_v3 terms=1 dbias=3 pair",
    "bwd_v3 terms=2 dbias=4", "bwd_v3 terms=3 dbias=0", "bwd_v3 terms=4 dbias=0", "bwd_v3 terms=7 dbias=4",
    "bwd_v3 dq-direct", "bwd_v3 dq-resident",
]


def build(out_dir: Path) -> Path:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = out_dir / "kernel_choice_fuzz"
    cmd = [cxx, "-std=c++17", "-O0", "-Wall", "-Werror", "-I", str(ROOT / "kernel-src"), str(FUZZ), "-o", str(exe)]
    try:  # (a compiler without the sanitizer runtimes still runs the invariants)
        subprocess.run(cmd[:1] + SANITIZERS + cmd[1:], check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    return exe


def run(exe: Path, *args: str) -> dict:
    """Runs the fuzz; returns {"checks": {name: (passed, failed)}, "fails": {name: call}, "cover": {path: n}}."""
    r = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 0, f"the fuzz aborted (a sanitizer finding?):\n{r.stderr[-4000:]}"
    out = {"checks": {}, "fails": {}, "cover": {}}
    for line in r.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "check":
            name, passed, failed = rest.split()
            out["checks"][name] = (int(passed), int(failed))
        elif kind == "fail":
            name, _, call = rest.partition(" | ")
            out["fails"][name] = call
        elif kind == "cover":
            path, _, n = rest.rpartition(" ")
            out["cover"][path] = int(n)
    return out


@pytest.fixture(scope="module")
def fuzz_exe(tmp_path_factory):
    try:
        return build(tmp_path_factory.mktemp("fuzz"))
    except subprocess.CalledProcessError as e:
        pytest.fail(f"kernel_choice_fuzz.cpp does not compile:\n{e.stderr}")


@pytest.fixture(scope="module")
def random_run(fuzz_exe):
    return run(fuzz_exe, "--seed", str(SEED), "--calls", str(CALLS))


def test_random_calls_keep_every_invariant(random_run):
    failed = random_run["fails"]
    assert not failed, "invariants broken (first call of each; rerun it with the --seed / --only it names):\n" + \
        "\n".join(f"{name}: {call}" for name, call in sorted(failed.items()))


def test_random_calls_reach_every_kernel_and_check_every_invariant(random_run):
    missing = [path for path in MUST_COVER if random_run["cover"].get(path, 0) == 0]
    assert not missing, f"kernel paths the random calls never reached: {missing}"
    unchecked = [name for name, (passed, _) in random_run["checks"].items() if passed == 0]
    assert not unchecked, f"invariants that never held once (vacuous or always broken): {unchecked}"
    assert len(random_run["checks"]) >= 100, sorted(random_run["checks"])


@pytest.mark.parametrize("name", FIXED)
def test_fixed_bug_stays_fixed(fuzz_exe, name):
    r = run(fuzz_exe, "--repro", name)
    assert not r["fails"], r["fails"]


if __name__ == "__main__":
    if sys.argv[1:2] and sys.argv[1].startswith("--"):
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            exe = build(Path(d))
            r = subprocess.run([str(exe), *sys.argv[1:]], capture_output=True, text=True, env=ENV)
            print("\n".join(line for line in r.stdout.splitlines() if not line.startswith(("check", "cover"))))
            print(r.stderr, end="")
            sys.exit(r.returncode)
    sys.exit(pytest.main([__file__, "-q"]))
