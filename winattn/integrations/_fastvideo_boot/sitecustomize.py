"""Boot hook for FastVideo worker processes (this directory is put on PYTHONPATH; it is not a package).

`winattn.integrations.fastvideo.register()` prepends this directory to PYTHONPATH and sets
WINATTN_FASTVIDEO_AUTOREGISTER in `os.environ`, so each Python process started from then on (FastVideo's spawned
workers included) imports this `sitecustomize` at startup. With the variable set it adds one `sys.meta_path`
entry and imports nothing else: the first time the process imports `fastvideo`, that entry installs winattn's
post-import hook (`winattn.integrations._fastvideo_hook.install_fastvideo_autoregister`), which registers the WINDOW_ATTN_HUB
backend with the parent's settings as soon as FastVideo has finished importing, before any model is built.

Python imports only the first `sitecustomize` on sys.path, so this one then runs the one it shadows, if any.
"""

import importlib.machinery
import importlib.util
import os
import sys


class _WinattnFastVideoTrigger:
    """Waits for the first import of FastVideo, then hands over to winattn's post-import hook."""

    names = ("fastvideo", "fastvideo.platforms")

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        from winattn.integrations._fastvideo_hook import install_fastvideo_autoregister

        finder = install_fastvideo_autoregister()
        return None if finder is None else finder.find_spec(fullname, path, target)


def _winattn_boot():
    value = os.environ.get("WINATTN_FASTVIDEO_AUTOREGISTER", "").strip()
    if value and value.lower() not in ("0", "false", "no", "off"):
        sys.meta_path.insert(0, _WinattnFastVideoTrigger())
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_winattn_boot()
del _winattn_boot
