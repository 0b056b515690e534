"""Reading a variant's files before anything in it is trusted: list without following links, read bounded, hash
streamed, copy what was hashed.

- `scan_variant` lists a variant without following any link and without reading any file (`Listing` of `Entry`s);
- `read_entry` reads metadata.json and its signature with a size limit, `hash_entry` hashes a file in 1 MiB chunks
  (kernels' base64 format) and writes the bytes hashed to a private copy (`private_file`);
- every open refuses a link and a FIFO swapped in since the listing (`open_regular`), and a file that changes while it
  is read raises `FileChanged`.

The verifier (`winattn.verify`) and the digest check (`winattn.digest`) read files only through this module.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from .cache_layout import blobs_dir
from .variant import METADATA_FILENAME, SIGNATURE_FILENAME, is_bytecode

CHUNK_BYTES = 1 << 20  # hashing is streamed: at most this much of a file is in memory at once
MAX_METADATA_BYTES = 16 << 20
MAX_SIGNATURE_BYTES = 4 << 20
DEFAULT_MAX_VARIANT_BYTES = 16 << 30  # $WINATTN_MAX_VARIANT_BYTES: refuse bigger variants before reading them


@dataclass(frozen=True)
class Entry:
    """A file of the variant as listed, before anything is read.

    Attributes:
        rel: POSIX path relative to the variant.
        path: what is opened: the file itself, or the blob an HF cache snapshot link points to.
        size: its size (lstat) at listing time.
        stat_key: (size, mtime_ns, ctime_ns, inode, device) at listing time, for the verified-receipt.
    """

    rel: str
    path: str
    size: int
    stat_key: tuple


@dataclass
class Listing:
    """`scan_variant`'s result: regular files (metadata.json and its signature apart), stray bytecode, and every
    entry that the digest cannot cover (links, FIFOs, devices, sockets), as one line each."""

    files: dict = field(default_factory=dict)
    bytecode: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    metadata: Optional[Entry] = None
    signature: Optional[Entry] = None


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), f"a special file (mode {mode:o})")


def _key(st: os.stat_result) -> tuple:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


def scan_variant(variant_path: Path, *, follow_file_links: bool = False) -> Listing:
    """List a variant without following any link and without reading any file.

    Regular files become `Entry`s; in an HF cache snapshot a link to a regular file directly in the repository's
    `blobs/` is a file too (its blob is what is read). Anything else is a problem line: the digest only covers regular
    files, and an import that followed a link to a directory (kernels' variant lookup does) would run files nobody
    hashed. `__pycache__/` and `*.pyc` (of any kind) are stray bytecode. `follow_file_links` (tooling on the
    publisher's own files, never a load) takes any link to a regular file as that file, as kernels' hashing does.
    """
    listing = Listing()
    root = Path(variant_path)
    blobs = blobs_dir(root)

    def add(full: str, rel: str, st: os.stat_result) -> Optional[Entry]:
        if stat.S_ISREG(st.st_mode):
            return Entry(rel, full, st.st_size, _key(st))
        if stat.S_ISLNK(st.st_mode):
            target = os.path.realpath(full)
            if follow_file_links or (blobs is not None and os.path.dirname(target) == blobs):
                try:
                    tst = os.lstat(target)
                except OSError:
                    tst = None
                if tst is not None and stat.S_ISREG(tst.st_mode):
                    return Entry(rel, target, tst.st_size, _key(tst))
            what = "a directory" if os.path.isdir(full) else "a file" if os.path.isfile(full) else "nothing readable"
            listing.problems.append(f"{rel}: symbolic link to {os.readlink(full)!r} ({what}): links are not covered "
                                    "by the digest")
            return None
        listing.problems.append(f"{rel}: {_kind(st.st_mode)}, not a regular file (not covered by the digest)")
        return None

    def sorted_entries(directory: str) -> list:
        with os.scandir(directory) as it:
            return sorted(it, key=lambda e: e.name)

    # Depth-first in name order, as a stack of (entries left, relative prefix, inside bytecode) instead of recursion:
    # a tree 1,100 levels deep exhausted the interpreter's recursion limit (RecursionError) in the old walk.
    stack = [(iter(sorted_entries(str(root))), "", False)]
    while stack:
        entries, prefix, in_bytecode = stack[-1]
        e = next(entries, None)
        if e is None:
            stack.pop()
            continue
        rel = prefix + e.name
        st = e.stat(follow_symlinks=False)
        bytecode = in_bytecode or is_bytecode(rel)
        if stat.S_ISDIR(st.st_mode):
            stack.append((iter(sorted_entries(e.path)), rel + "/", bytecode))
        elif bytecode:
            listing.bytecode.append(rel)
        elif prefix == "" and e.name in (METADATA_FILENAME, SIGNATURE_FILENAME):
            entry = add(e.path, rel, st)
            if e.name == METADATA_FILENAME:
                listing.metadata = entry
            else:
                listing.signature = entry
        else:
            entry = add(e.path, rel, st)
            if entry is not None:
                listing.files[rel] = entry
    return listing


def list_files(variant_path: Path) -> tuple[list, list]:
    """(files, bytecode) of the variant as sorted POSIX relative paths, without metadata.json and its signature
    (`scan_variant`; entries that are not regular files are in neither list)."""
    listing = scan_variant(Path(variant_path))
    return sorted(listing.files), sorted(listing.bytecode)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _remove_under(root_fd: int, parts: list) -> None:
    """Remove `parts` (a file, a link, or a directory tree) under the directory `root_fd`, walking down by file
    descriptor without following a link: a component swapped for a link since the listing raises OSError (ELOOP /
    ENOTDIR) instead of being followed out of the variant."""
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        st = os.lstat(parts[-1], dir_fd=fd)
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(parts[-1], dir_fd=fd)  # the fd-based rmtree: never follows a link inside either
        else:
            os.unlink(parts[-1], dir_fd=fd)
    finally:
        os.close(fd)


def purge_bytecode(variant_path: Path, bytecode: Iterable[str]) -> list:
    """Remove stray bytecode (it is never part of a published variant); return what could not be removed.
    Links are removed, never followed, and neither is a directory above them: each removal walks down from the
    variant by file descriptor (`_remove_under`), since whoever writes a shared cache can swap a parent directory
    for a link between the listing and the purge (a path-based removal then deleted `__pycache__/` elsewhere)."""
    left = []
    dirs = set()
    try:
        root = os.open(variant_path, _DIR_FLAGS)
    except OSError:
        return list(bytecode)
    try:
        for rel in bytecode:
            parts = rel.split("/")
            try:
                _remove_under(root, parts)
            except FileNotFoundError:
                pass
            except OSError:
                left.append(rel)
            if "__pycache__" in parts:
                dirs.add(tuple(parts[: parts.index("__pycache__") + 1]))
        for d in sorted(dirs, reverse=True):
            try:
                _remove_under(root, list(d))
            except OSError:
                pass
    finally:
        os.close(root)
    return left


def max_variant_bytes() -> int:
    """The size limit of a variant ($WINATTN_MAX_VARIANT_BYTES, default 16 GiB), checked before hashing."""
    raw = os.environ.get("WINATTN_MAX_VARIANT_BYTES")
    if not raw:
        return DEFAULT_MAX_VARIANT_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"WINATTN_MAX_VARIANT_BYTES must be an integer number of bytes, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"WINATTN_MAX_VARIANT_BYTES must be positive, got {value}")
    return value


class FileChanged(Exception):
    """A file stopped being the regular file of the listing while it was read."""


def open_regular(entry: Entry) -> int:
    """Open the listed file without following a link (O_NOFOLLOW), without blocking on a FIFO swapped in since the
    listing (O_NONBLOCK), and check that it is still a regular file."""
    fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileChanged(f"{entry.rel} is no longer a regular file")
    return fd


def read_entry(entry: Entry, limit: int) -> bytes:
    if entry.size > limit:
        raise FileChanged(f"{entry.rel} is {entry.size} bytes, more than the {limit} a {entry.rel} may have")
    fd = open_regular(entry)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileChanged(f"{entry.rel} grew past {limit} bytes while it was read")
    return data


def hash_entry(entry: Entry, algorithm: str, copy_fd: Optional[int]) -> str:
    """base64 digest of the file (kernels' format), streamed; the bytes hashed are written to `copy_fd` as read."""
    h = hashlib.new(algorithm)
    seen = 0
    fd = open_regular(entry)
    with os.fdopen(fd, "rb", buffering=0) as f:
        while True:
            chunk = f.read(CHUNK_BYTES)
            if not chunk:
                break
            seen += len(chunk)
            if seen > entry.size:
                raise FileChanged(f"{entry.rel} grew past its listed {entry.size} bytes while it was hashed")
            h.update(chunk)
            if copy_fd is not None:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(copy_fd, view):]
    return base64.b64encode(h.digest()).decode()


def private_file(copy_to: Path, rel: str) -> int:
    """Create `copy_to/rel` (and its directories, mode 0700) for writing; never follows or reuses an entry."""
    parts = rel.split("/")
    d = copy_to
    for part in parts[:-1]:
        d = d / part
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            if d.is_symlink() or not d.is_dir():
                raise
    return os.open(d / parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
