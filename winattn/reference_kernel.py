"""The pure-PyTorch reference of window-attention as a kernel-like module (`winattn.load(fallback="reference")`).

The kernel's Python package (torch-ext/window_attention, reachable as `winattn/kernel_python`) cannot be imported as a
whole without a build: its `__init__` imports the compiled `_ops`. This module registers a synthetic package whose
`__path__` points at that directory WITHOUT executing its `__init__`, then imports only the `reference` submodule (and
`_args`, which it needs). Nothing compiled is loaded.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import threading
import types
from pathlib import Path

from .variant import KERNEL_API_VERSION

# Module name of the synthetic package. Distinct from every kernel's metadata id (`_window_attention_<backend>_<id>`).
PACKAGE_NAME = "_winattn_reference_kernel"

_LOCK = threading.Lock()


def package_dir() -> Path:
    """Directory of the kernel's Python package (torch-ext/window_attention through the winattn/kernel_python link)."""
    return (Path(__file__).resolve().parent / "kernel_python").resolve()


def load_reference() -> types.ModuleType:
    """Return a module with the kernel's API (`attention`, `window_attention`, the low-level ops, `BUILD_DEVICE`
    None, `API_VERSION`) and `reference`, backed by the reference only.

    The module is created once per process and cached in sys.modules under `PACKAGE_NAME`.
    """
    with _LOCK:
        pkg = sys.modules.get(PACKAGE_NAME)
        if pkg is not None and hasattr(pkg, "reference"):
            return pkg
        directory = package_dir()
        if not (directory / "reference.py").is_file():
            raise FileNotFoundError(f"the window-attention reference is missing: {directory / 'reference.py'}")
        spec = importlib.machinery.ModuleSpec(PACKAGE_NAME, None, is_package=True)
        spec.submodule_search_locations = [str(directory)]
        pkg = types.ModuleType(PACKAGE_NAME, "window-attention reference implementation (pure PyTorch fallback)")
        pkg.__spec__ = spec
        pkg.__path__ = [str(directory)]
        pkg.__package__ = PACKAGE_NAME
        pkg.__file__ = None
        sys.modules[PACKAGE_NAME] = pkg
        try:
            reference = importlib.import_module(f"{PACKAGE_NAME}.reference")
        except BaseException:
            for name in [n for n in sys.modules if n == PACKAGE_NAME or n.startswith(PACKAGE_NAME + ".")]:
                del sys.modules[name]
            raise
        pkg.reference = reference
        # The kernel package's API (its __all__, `layers` aside: layers need the compiled ops), from the reference.
        for name in ("attention", "window_attention", "attention_forward", "attention_backward", "BUILD_DEVICE"):
            setattr(pkg, name, getattr(reference, name))
        pkg.API_VERSION = KERNEL_API_VERSION
        pkg.__all__ = ["attention", "window_attention", "attention_forward", "attention_backward", "BUILD_DEVICE",
                       "API_VERSION", "reference"]
        pkg.IS_REFERENCE = True
        return pkg
