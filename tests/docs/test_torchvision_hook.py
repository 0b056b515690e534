"""The dev venv's torchvision hook: `import timm` / diffusers models work as written, with no call in user code."""

import os
import subprocess
import sys

_CHILD = """
import site, sys
# Only the directory under test may install the hook: drop the one the dev venv's own .pth added.
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "TorchvisionFinder"]
if sys.argv[1] != "-":
    site.addsitedir(sys.argv[1])        # processes the .pth, as interpreter start does for site-packages
import timm, torchvision
from diffusers import FluxTransformer2DModel
print("ok", torchvision.__version__)
"""


def _run(site_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
    return subprocess.run([sys.executable, "-c", _CHILD, str(site_dir)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)


def test_hook_makes_timm_and_diffusers_import_as_written(tmp_path):
    from winattn.integrations.torchvision_hook import PTH_NAME, install, uninstall

    site_dir = tmp_path / "site"
    site_dir.mkdir()
    module, pth = install(site_dir)
    assert pth.name == PTH_NAME and module.is_file()
    r = _run(site_dir, tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr[-3000:]
    if "+cu" in r.stdout:  # PyPI's CUDA wheel beside CPU torch: without the hook the same import fails
        r = _run("-", tmp_path)
        assert r.returncode != 0 and "torchvision::nms does not exist" in r.stderr, r.stderr[-3000:]
    uninstall(site_dir)
    assert list(site_dir.iterdir()) == []


def test_the_dev_venv_has_the_hook():
    """`make setup` installs it: plain `import timm` in the venv's python works (fails before issue 18)."""
    r = subprocess.run([sys.executable, "-c", "import timm, torchvision; print('ok')"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
