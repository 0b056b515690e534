"""FastVideo's post-import hook (stdlib only): register the backend in processes that never import winattn.

FastVideo spawns worker processes that build models without running the parent's `register()`. The boot
`sitecustomize` (`_fastvideo_boot/`, put on their PYTHONPATH by `winattn.integrations.fastvideo.register()`) calls
`install_fastvideo_autoregister()` here; it installs a `sys.meta_path` post-import hook that imports
`winattn.integrations.fastvideo` (which imports FastVideo itself) and registers the backend as soon as FastVideo has
finished importing. This module must stay importable without FastVideo, torch or winattn's loader: that is why it is
apart from `fastvideo.py`, whose body needs FastVideo's base classes.
"""

from __future__ import annotations

import os
import threading
from typing import Optional

class _PostImportLoader:
    """Delegates to the real loader and calls `callback(module)` after the module body ran."""

    def __init__(self, loader, callback):
        self._loader = loader
        self._callback = callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        try:
            module.__loader__ = self._loader  # introspection (inspect, importlib.resources) sees the real loader
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self._loader
        except AttributeError:
            pass
        self._loader.exec_module(module)
        self._callback(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class PostImportFinder:
    """A `sys.meta_path` finder that calls `callback(module)` after each module named in `names` is imported.

    It finds nothing itself: it asks the finders behind it for the spec and wraps the spec's loader. Modules already
    imported when the finder is installed are passed to the callback at once.
    """

    def __init__(self, names, callback):
        self.names = frozenset(names)
        self.callback = callback
        self._busy = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names or getattr(self._busy, fullname, False):
            return None
        import sys

        setattr(self._busy, fullname, True)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            setattr(self._busy, fullname, False)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PostImportLoader(spec.loader, self.callback)
        return spec


def install_post_import_hook(names, callback) -> PostImportFinder:
    """Install a `PostImportFinder` at the front of `sys.meta_path` (and run it on already imported modules)."""
    import sys

    finder = PostImportFinder(names, callback)
    sys.meta_path.insert(0, finder)
    for name in names:
        module = sys.modules.get(name)
        if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
            callback(module)
    return finder


FASTVIDEO_AUTOREGISTER_ENV = "WINATTN_FASTVIDEO_AUTOREGISTER"


def boot_dir() -> str:
    """Directory whose `sitecustomize` auto-registers the backend in child processes (put it on PYTHONPATH)."""
    return os.path.join(os.path.dirname(os.path.realpath(__file__)), "_fastvideo_boot")


def main(argv=None) -> int:
    """`python -m winattn.integrations.fastvideo --boot-dir`: print the boot directory and nothing else.

    Runs before FastVideo is imported (FastVideo prints log lines on stdout at import, which a shell's
    `$(...)` would capture into PYTHONPATH).
    """
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m winattn.integrations.fastvideo",
        description="Print the directory to prepend to PYTHONPATH so that processes which never call register() "
        "(torchrun ranks, FastVideo's spawned workers) register WINDOW_ATTN_HUB when they import FastVideo; "
        f"set {FASTVIDEO_AUTOREGISTER_ENV}=1 (or the JSON settings) beside it. FastVideo is not imported.",
    )
    parser.add_argument("--boot-dir", action="store_true", required=True,
                        help="print the boot directory (for PYTHONPATH) and exit")
    parser.parse_args(argv)
    print(boot_dir())
    return 0


def fastvideo_autoregister_requested() -> bool:
    value = os.environ.get(FASTVIDEO_AUTOREGISTER_ENV, "").strip()
    return bool(value) and value.lower() not in ("0", "false", "no", "off")


def install_fastvideo_autoregister() -> Optional[PostImportFinder]:
    """If WINATTN_FASTVIDEO_AUTOREGISTER is set, register the FastVideo backend as soon as FastVideo is imported.

    Cheap and stdlib-only until FastVideo is actually imported; idempotent. Called by the boot `sitecustomize` that
    `winattn.integrations.fastvideo.register()` puts on the PYTHONPATH of child processes.
    """
    import sys

    if not fastvideo_autoregister_requested():
        return None
    for finder in sys.meta_path:
        if isinstance(finder, PostImportFinder) and getattr(finder, "_winattn_fastvideo", False):
            return finder

    def _on_import(module):
        # Register once the real `fastvideo` package ran its __init__, or when `fastvideo.platforms` is imported
        # outside a running `fastvideo` __init__ (lightweight imports that skip the package __init__).
        if module.__name__ != "fastvideo":
            top = sys.modules.get("fastvideo")
            if top is not None and getattr(getattr(top, "__spec__", None), "_initializing", False):
                return
        ours = sys.modules.get("winattn.integrations.fastvideo")
        if ours is not None and getattr(getattr(ours, "__spec__", None), "_initializing", False):
            return  # FastVideo is being imported by the integration itself, which registers when its body ends
        import importlib

        importlib.import_module("winattn.integrations.fastvideo")._register_from_env()

    finder = install_post_import_hook(("fastvideo", "fastvideo.platforms"), _on_import)
    finder._winattn_fastvideo = True
    return finder
