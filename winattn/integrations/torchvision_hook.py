"""Make `import torchvision` work in the dev venv without any call in the user's code.

The PyPI torchvision 0.28.0 wheel is a cu130 build: beside CPU torch 2.13.0 its import fails with "operator
torchvision::nms does not exist" (see `_torchvision_shim`). So that the README and docs snippets run as written
(`import timm`, `from diffusers import FluxTransformer2DModel`), `make setup` installs this file into the venv's
site-packages as `_winattn_torchvision_hook.py` with a one-line `.pth` that imports it at interpreter start:

    python -m winattn.integrations.torchvision_hook install     # what `make setup` runs
    python -m winattn.integrations.torchvision_hook uninstall

At start it only adds one `sys.meta_path` entry (nothing is imported). When torchvision is first imported, the entry
wraps torchvision's own loader: the import runs unchanged; only if it fails with exactly that error are the two op
schemas defined and the import re-run. A working torchvision (a matching CPU or CUDA build) is never touched, and
defining the schemas before it loads would abort the process (its `_C` defines them too). This file is copied, so it
imports nothing from winattn: a broken or absent winattn cannot break interpreter start.
"""

import sys

_MARK = "torchvision::nms"


class _RetryingLoader:
    """torchvision's loader, re-run once after defining the op schemas when its import hits the cu130/CPU mismatch."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        try:
            self._loader.exec_module(module)
        except RuntimeError as e:
            if _MARK not in str(e):
                raise
            for name in [m for m in sys.modules if m.startswith("torchvision.")]:
                del sys.modules[name]  # half-imported submodules: re-run their code below
            import torch

            lib = torch.library.Library("torchvision", "DEF")
            lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            _RetryingLoader.library = lib  # keeps the definitions alive for the process
            self._loader.exec_module(module)

    def __getattr__(self, name):  # get_resource_reader, is_package, ... as torchvision's own loader
        return getattr(self._loader, name)


class TorchvisionFinder:
    """A meta-path finder for the top-level `torchvision` package only; every other name is "not mine"."""

    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _RetryingLoader(spec.loader)
        return spec


def install_finder() -> None:
    if not any(isinstance(f, TorchvisionFinder) or type(f).__name__ == "TorchvisionFinder" for f in sys.meta_path):
        sys.meta_path.insert(0, TorchvisionFinder())


HOOK_MODULE = "_winattn_torchvision_hook"
PTH_NAME = HOOK_MODULE + ".pth"


def _site_packages():
    import sysconfig
    from pathlib import Path

    return Path(sysconfig.get_paths()["purelib"])


def install(site_packages=None):
    """Copy this file into site-packages and add the `.pth` that imports it; returns the two paths."""
    from pathlib import Path

    site = Path(site_packages or _site_packages())
    module, pth = site / f"{HOOK_MODULE}.py", site / PTH_NAME
    module.write_text(Path(__file__).read_text())
    pth.write_text(f"import {HOOK_MODULE}; {HOOK_MODULE}.install_finder()\n")
    return module, pth


def uninstall(site_packages=None):
    from pathlib import Path

    site = Path(site_packages or _site_packages())
    for path in (site / PTH_NAME, site / f"{HOOK_MODULE}.py"):
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["install"]:
        for p in install():
            print(p)
    elif sys.argv[1:] == ["uninstall"]:
        uninstall()
    else:
        sys.exit("usage: python -m winattn.integrations.torchvision_hook install|uninstall")
