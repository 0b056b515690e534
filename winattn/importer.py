"""Import exactly the verified bytes: a private copy, its own `__init__.py`, source only, and nothing left behind.

Why not `kernels.get_local_kernel(variant_dir)`: it re-resolves the directory it is given (a variant-named or
`build/` subdirectory wins over the directory itself, and links are followed), and it imports from a path that
anyone who can write the cache can change after verification. Here:

- `private_copy_dir()` makes a fresh directory (mode 0700, under `$WINATTN_CACHE/imports`) that
  `winattn.verify.verify_variant(copy_to=...)` fills with the bytes it hashed; nothing else is in it. Every ancestor
  of it is checked (owned by this user or root, not writable by others unless sticky, like /tmp): a parent that
  others can write would let them swap `imports/` after the copy was made.
- `import_package` imports `<copy>/__init__.py` through an importlib spec under the op-namespace id, as kernels
  does, but with a source-only loader: bytecode is never read (not `__pycache__/`, not `PYTHONPYCACHEPREFIX`, not
  an unchecked-hash .pyc) and never written. The package's directories get the same source-only finder in
  `sys.path_importer_cache`, so submodules imported later (lazily) come from the copy's sources too. During the
  import `sys.pycache_prefix` also points at a private empty directory and `sys.dont_write_bytecode` is set, for
  anything the kernel's code imports from elsewhere meanwhile (process-wide settings, restored right after).
- `imported(id)` is the module this importer imported under an op-namespace id (with its copy and digest): the only
  module `winattn.load` hands back a second time. `foreign(id)` describes any other module of that id in the process
  (imported by `kernels.get_kernel` or a plain import), which `winattn.load` refuses to return: its bytes were never
  verified here, and torch cannot register the namespace twice.
- `forget` removes `<id>` and every `<id>.*` from `sys.modules` (and kernels' registry) after a failed load, and
  remembers the id: a refused build's native code may have registered ops under it, which torch cannot undo, so a
  second load of that id in this process is refused with `StaleKernelError` instead of running next to it.
"""

from __future__ import annotations

import atexit
import importlib.machinery
import importlib.util
import logging
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Optional

from ._kernels_private import forget_loaded_kernels, register_loaded_kernel
from .errors import StaleKernelError, WinattnError
from .safe_fs import remove_tree, walk

logger = logging.getLogger("winattn")

_REFUSED: dict = {}  # op-namespace id -> why a load of it failed after its code ran
_OWNED: list = []  # private copy roots of this process, removed at exit
_IMPORTED: dict = {}  # op-namespace id -> (module, private copy, digest files) of what this importer imported


def _imports_root() -> Path:
    from .cache_layout import winattn_cache_dir

    return winattn_cache_dir() / "imports"


def _check_private(path: Path) -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() \
            or stat.S_IMODE(st.st_mode) & 0o077:
        raise WinattnError(
            f"{path} is not a private directory (a link, not owned by uid {os.getuid()}, or open to others: mode "
            f"{stat.S_IMODE(st.st_mode):o}); winattn copies verified kernels there before importing them. Remove it, "
            "or point WINATTN_CACHE at a directory only you can write"
        )


def check_ancestors(path: Path) -> None:
    """Refuse (`WinattnError`) when a directory above `path` (links resolved) could let someone else replace it: one
    owned by another user than this one or root, or writable by group or others without the sticky bit (/tmp is
    fine: its sticky bit keeps others from renaming what is ours)."""
    real = Path(os.path.realpath(path))
    for ancestor in reversed(real.parents):
        st = os.stat(ancestor)
        mode = stat.S_IMODE(st.st_mode)
        owner_ok = st.st_uid in (0, os.getuid())
        open_to_others = mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX
        if not owner_ok or open_to_others:
            why = f"owned by uid {st.st_uid}" if not owner_ok else f"writable by others (mode {mode:o}, no sticky bit)"
            raise WinattnError(
                f"{ancestor}, a parent of winattn's private import directory {path}, is {why}: whoever can write it "
                "could replace the verified copy before it is imported. Point WINATTN_CACHE at a directory whose "
                "every parent only you (or root) can write, or fix that directory's owner / mode"
            )


def _sweep(root: Path) -> None:
    """Remove copies left by processes that are gone (named p<pid>-...)."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for e in entries:
        pid = e.name[1:].split("-", 1)[0]
        if not (e.name.startswith("p") and pid.isdigit()) or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            _remove(e.path)
        except OSError:
            pass


def _remove(path) -> None:
    try:
        remove_tree(path)
    except OSError as e:
        logger.debug("cannot remove %s: %s", path, e)


def private_copy_dir(variant: str) -> Path:
    """A new, empty directory `<root>/p<pid>-<random>/<variant>` that only this user can enter, for one load.

    `<root>` is `$WINATTN_CACHE/imports` (default `~/.cache/winattn/imports`); if that cannot be created (read-only
    home), a fresh `mkdtemp` directory in the system temporary directory. An existing root that is a link or open to
    others, or a parent that others could replace it in (`check_ancestors`), is refused (`WinattnError`), never used.
    """
    root = _imports_root()
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        logger.debug("cannot create %s (%s); using the system temporary directory", root, e)
        check_ancestors(Path(tempfile.gettempdir()) / "x")
        base = Path(tempfile.mkdtemp(prefix=f"winattn-import-p{os.getpid()}-"))
    else:
        check_ancestors(root)
        _check_private(root)
        _sweep(root)
        base = Path(tempfile.mkdtemp(prefix=f"p{os.getpid()}-", dir=root))  # mode 0700, unique
    _OWNED.append((os.getpid(), base))
    copy = base / variant
    copy.mkdir(mode=0o700)
    (base / "pycache").mkdir(mode=0o700)  # the private, empty sys.pycache_prefix of the import
    return copy


def discard(copy: Optional[Path]) -> None:
    """Remove a private copy that will not be (or was not) imported."""
    if copy is None:
        return
    base = Path(copy).parent
    _remove(base)
    for item in list(_OWNED):
        if item[1] == base:
            _OWNED.remove(item)


@atexit.register
def _cleanup() -> None:
    # Imported copies stay for the life of the process (tracebacks and lazy imports read their sources); a forked
    # child inherits the list but leaves the parent's copies alone.
    for pid, base in _OWNED:
        if pid == os.getpid():
            _remove(base)


class SourceOnlyLoader(importlib.machinery.SourceFileLoader):
    """A `SourceFileLoader` that compiles the source it is given and never reads or writes bytecode."""

    def get_code(self, fullname):
        source = self.get_data(self.path)
        return self.source_to_code(source, self.path)

    def set_data(self, path, data, *, _mode=0o666):  # never write bytecode
        return None


def _finder(directory: str):
    return importlib.machinery.FileFinder(
        directory,
        (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
        (SourceOnlyLoader, importlib.machinery.SOURCE_SUFFIXES),
    )  # no SourcelessFileLoader: a bare .pyc is never importable from the copy


def refused(module_id: str) -> Optional[str]:
    """Why an earlier load of `module_id` in this process failed after running its code, or None."""
    return _REFUSED.get(module_id)


def import_package(copy: Path, module_id: str):
    """Import the package `<copy>/__init__.py` as `module_id` (the op-namespace id, as kernels names it).

    Raises:
        StaleKernelError: an earlier load of `module_id` failed in this process (see `forget`).
        FileNotFoundError: the variant has no top-level `__init__.py`.
        whatever the package raises while it is imported (then `forget` has run).
    """
    if module_id in _REFUSED:
        raise StaleKernelError(stale_message(module_id))
    init = Path(copy) / "__init__.py"
    if not init.is_file():
        raise FileNotFoundError(f"the verified variant has no __init__.py at its top level ({copy}); winattn imports "
                                "only that file (no module subdirectory lookup)")
    for dirpath, dirnames, _ in walk(copy):
        sys.path_importer_cache[dirpath] = _finder(dirpath)
    loader = SourceOnlyLoader(module_id, str(init))
    spec = importlib.util.spec_from_file_location(module_id, str(init), loader=loader,
                                                  submodule_search_locations=[str(copy)])
    module = importlib.util.module_from_spec(spec)
    saved = sys.dont_write_bytecode, sys.pycache_prefix
    sys.dont_write_bytecode, sys.pycache_prefix = True, str(Path(copy).parent / "pycache")
    sys.modules[module_id] = module
    try:
        loader.exec_module(module)
    except BaseException as e:
        forget(module_id, copy, f"importing it raised {type(e).__name__}: {e}")
        raise
    finally:
        sys.dont_write_bytecode, sys.pycache_prefix = saved
    return module


def forget(module_id: str, copy: Optional[Path], why: str) -> None:
    """After a failed load whose code ran: drop `<id>` and `<id>.*` from sys.modules and kernels' registry, and
    refuse later loads of `<id>` in this process (its native ops may be registered and cannot be unregistered)."""
    for name in [m for m in sys.modules if m == module_id or m.startswith(module_id + ".")]:
        sys.modules.pop(name, None)
    if module_id in _IMPORTED and (copy is None or Path(_IMPORTED[module_id][1]) == Path(copy)):
        del _IMPORTED[module_id]
    try:
        forget_loaded_kernels(module_id, copy)
    except ImportError:
        pass
    _REFUSED[module_id] = why


def stale_message(module_id: str) -> str:
    return (
        f"a build with the op namespace '{module_id}' failed to load earlier in this process ({_REFUSED[module_id]}); "
        "its Python modules were removed, but its native code may have registered ops under that namespace, which "
        "torch cannot undo, so no other build of it is imported next to it. Start a new process to load it."
    )


def register_loaded(copy: Path, metadata, module) -> None:
    """Record the import as this importer's own (`imported`) and in kernels' registry (`kernels.get_loaded_kernels()`),
    as `get_local_kernel` would."""
    _IMPORTED[metadata.id] = (module, Path(copy), dict(metadata.digest.files))
    register_loaded_kernel(copy, metadata, module)


def imported(module_id: str) -> Optional[tuple]:
    """(module, private copy, digest files) of the build this importer imported under `module_id`, or None."""
    return _IMPORTED.get(module_id)


def foreign(module_id: str) -> Optional[str]:
    """Where a module of `module_id` that this importer did not import comes from (`sys.modules` or kernels'
    registry), or None when there is none."""
    own = _IMPORTED.get(module_id, (None,))[0]
    module = sys.modules.get(module_id)
    if module is not None and module is not own:
        return f"sys.modules['{module_id}'] (from {getattr(module, '__file__', None) or 'an unknown file'})"
    if own is None:
        # A failed import elsewhere (kernels.get_kernel whose `__init__` raised) drops `<id>` but keeps the submodules
        # it had imported: the verified `__init__`'s relative imports (`from .interface import ...`) would be handed
        # those unverified modules from sys.modules instead of the copy's files. Any `<id>.*` is foreign here.
        for name in sorted(m for m in list(sys.modules) if m.startswith(module_id + ".")):
            sub = sys.modules.get(name)
            return f"sys.modules['{name}'] (from {getattr(sub, '__file__', None) or 'an unknown file'})"
    try:
        from kernels import get_loaded_kernels
    except ImportError:
        return None
    for loaded in get_loaded_kernels():
        if loaded.metadata.id == module_id and loaded.module is not own:
            return f"kernels' registry (from {getattr(loaded.module, '__file__', None) or 'an unknown file'})"
    return None
