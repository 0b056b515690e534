"""File-system steps in directories that someone else may write (a shared Hugging Face cache, a vendored directory)
or trees that someone else made (a downloaded variant).

- `write_atomic`: a cache ref, a verified-receipt or a vendor lock is written to a temporary file with a random name,
  created exclusively (`O_EXCL`) without following a link (`O_NOFOLLOW`), in the target's own directory opened without
  following a link, then renamed over the target (a rename replaces a link, never writes through it). A predictable
  temporary name that follows links let whoever can write the directory make the writer overwrite any file it can
  write.
- `touch_lock`: create a lock file, or open the existing one, without following a link and without truncating.
- `read_small`: read a small regular file (a ref) without following a link or blocking on a FIFO.
- `walk` / `remove_tree`: iterative (a tree 1,100 levels deep exhausted Python's recursion in `os.walk`,
  `shutil.rmtree` and the old recursive listing), and links are never followed: a link is removed, not entered.

Only the last directory of a target is opened without following links: its ancestors (`~/.cache` may be a link) are
the caller's to trust, as with `winattn.importer`'s private directories, which check every ancestor.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def write_atomic(path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace `path` with a file holding `data`, atomically, never writing through a link (see the module
    docstring). The directory must exist. Raises OSError (a link in place of the directory included)."""
    path = Path(path)
    parent = os.open(path.parent, _DIR_FLAGS)
    try:
        for _ in range(16):
            tmp = f".{path.name[:200]}.{secrets.token_hex(8)}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                             dir_fd=parent)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"cannot create a temporary file next to {path}")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.rename(tmp, path.name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=parent)
            except OSError:
                pass
            raise
    finally:
        os.close(parent)


def touch_lock(path) -> None:
    """Create the lock file `path` if missing (never through a link, never truncating an existing one). Raises
    OSError, e.g. on a read-only cache or when `path` is a link."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    os.close(fd)


def read_small(path, limit: int) -> bytes:
    """The bytes of the regular file `path` (at most `limit`), opened without following a link or blocking.
    Raises OSError when it is missing, a link, not a regular file or larger than `limit`."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(f"{path} is larger than {limit} bytes")
    return data


def walk(root):
    """`os.walk(root)` (top-down, names sorted) without recursion and without entering links: yields
    `(dirpath, dirnames, filenames)`, where links of any kind are among the filenames."""
    stack = [os.fspath(root)]
    while stack:
        top = stack.pop()
        dirs, files = [], []
        with os.scandir(top) as it:
            for entry in it:
                (dirs if entry.is_dir(follow_symlinks=False) else files).append(entry.name)
        dirs.sort()
        files.sort()
        yield top, dirs, files
        stack.extend(os.path.join(top, d) for d in reversed(dirs))


def remove_tree(path) -> None:
    """Remove `path` and everything under it, iteratively; a link is removed, never followed. Missing is fine.
    Raises OSError when something cannot be removed."""
    path = os.fspath(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    directories = []
    for top, _, files in walk(path):
        directories.append(top)
        for name in files:
            try:
                os.unlink(os.path.join(top, name))
            except FileNotFoundError:
                pass
    for top in reversed(directories):
        os.rmdir(top)
