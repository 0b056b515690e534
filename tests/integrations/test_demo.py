"""`make demo` (the README quickstart's first command) end to end: `python -m winattn demo` builds the CPU variant,
publishes it signed to an embedded Hub, loads it through `kernels.get_kernel` and the verifying `winattn.load` in
child processes and prints its report. A loader change once broke it (a module `kernels` imported was refused by
`winattn.load` in the same process) with every other test green."""

import os
import subprocess
import sys

from .conftest import REPO_ROOT


def test_demo_runs_end_to_end_and_reports_ok(tmp_path):
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf-home"))
    for name in ("HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_TOKEN", "LOCAL_KERNELS"):
        env.pop(name, None)
    r = subprocess.run([sys.executable, "-m", "winattn", "demo"], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=600)
    assert r.returncode == 0, r.stdout
    assert "  result       OK" in r.stdout.splitlines(), r.stdout
    assert "published winattn/window-attention v1 at commit" in r.stdout, r.stdout
