"""kernel-src/cuda/host_env.h, the cached WINATTN_* reads of the CUDA planner, checked on any machine: a small C++
program (host compiler only, no CUDA) flips variables with setenv / putenv / unsetenv between reads, as
os.environ and monkeypatch do under the GPU tests, and every read must give the current value while the
generation changes exactly when the environment did."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include "cuda/host_env.h"
using namespace winattn::cuda;
#define CHECK(c) do { if (!(c)) { std::printf("FAIL line %d: %s\n", __LINE__, #c); return 1; } } while (0)
int main() {
  unsetenv("WINATTN_TEST_A");
  CHECK(env_int("WINATTN_TEST_A", 7) == 7);
  const auto g0 = env_generation();
  CHECK(env_int("WINATTN_TEST_A", 7) == 7 && env_generation() == g0);  // nothing changed: same generation
  setenv("WINATTN_TEST_A", "3", 1);
  CHECK(env_int("WINATTN_TEST_A", 7) == 3);
  const auto g1 = env_generation();
  CHECK(g1 != g0);
  setenv("WINATTN_TEST_A", "5", 1);  // an existing variable, new value
  CHECK(env_int("WINATTN_TEST_A", 7) == 5 && env_generation() != g1);
  setenv("WINATTN_TEST_A", "3", 1);  // back to an earlier value (glibc may hand back the same string)
  CHECK(env_int("WINATTN_TEST_A", 7) == 3);
  CHECK(env_int("WINATTN_TEST_A", 9) == 3);  // the fallback is the caller's, per read
  setenv("WINATTN_TEST_A", "", 1);  // empty = unset
  CHECK(env_int("WINATTN_TEST_A", 7) == 7 && !env_flag("WINATTN_TEST_A", false) && env_flag("WINATTN_TEST_A", true));
  setenv("WINATTN_TEST_A", "1", 1);
  CHECK(env_flag("WINATTN_TEST_A", false) && env_int("WINATTN_TEST_A", 0) == 1);
  static char buf[] = "WINATTN_TEST_B=42";
  putenv(buf);  // a new variable through putenv: the array grows
  CHECK(env_int("WINATTN_TEST_B", 0) == 42 && env_int("WINATTN_TEST_A", 0) == 1);
  unsetenv("WINATTN_TEST_A");  // removal: the array shrinks
  CHECK(env_int("WINATTN_TEST_A", 7) == 7 && env_int("WINATTN_TEST_B", 0) == 42);
  for (int i = 0; i < 100; ++i) {  // many changes, each seen at once
    char v[16];
    std::snprintf(v, sizeof v, "%d", i);
    setenv("WINATTN_TEST_C", v, 1);
    CHECK(env_int("WINATTN_TEST_C", -1) == i);
  }
  std::printf("OK\n");
  return 0;
}
"""


def test_cached_knobs_follow_every_environment_change(tmp_path):
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    src = tmp_path / "env_test.cpp"
    src.write_text(PROGRAM)
    exe = tmp_path / "env_test"
    subprocess.run([cxx, "-std=c++17", "-O1", f"-I{REPO_ROOT / 'kernel-src'}", str(src), "-o", str(exe)], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "OK", run.stdout + run.stderr
