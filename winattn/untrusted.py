"""Words from outside this process: checked before a path is built from them, escaped before they are printed.

A Hub's answers (commit ids, ref names, file names, sizes, ETags), the cache's ref files, verified-receipts and vendor
locks are written by someone else: a hostile Hub, anyone in the path of a plain-HTTP endpoint, anyone who can write a
shared cache. Each word is checked here against what it must be before it is used (a commit is 40 lowercase hex, a ref
name follows git's rules, a file name is a relative path with no `..`, no absolute part, no control character), and a
path built from one is checked to stay under its root once resolved (`contained`). A refusal is a `RemoteValueError`
naming the word, where it came from and what it must be; `shown` escapes control and bidi characters so that a name
cannot rewrite the terminal or reorder the message it is printed in.

The `is_*` predicates answer without raising, for callers that refuse with their own error (a caller's own argument
is a ValueError, not a remote word).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from .errors import RemoteValueError

_COMMIT = re.compile(r"[0-9a-f]{40}")
_ETAG = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # git blob ids and sha256: the blob names of an HF cache
# git check-ref-format: no control character, space, ~ ^ : ? * [ \ anywhere
_REF_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")
MAX_REF_CHARS = 255
MAX_PATH_CHARS = 1024
MAX_COMPONENT_BYTES = 255  # a file name on Linux file systems
_SHOWN = 80  # characters of a refused word quoted in a message


def shown(text) -> str:
    """`text` safe to print: every character that is not printable (C0/C1 controls such as the ESC of ANSI
    sequences, bidi overrides and isolates, zero-width and other format characters, line separators) as a Python
    escape (`\\x1b`, `\\u202e`). Printable text, non-ASCII letters included, is left as it is."""
    text = str(text)
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def _quoted(value) -> str:
    text = value if isinstance(value, str) else repr(value)
    if len(text) > _SHOWN:
        text = text[:_SHOWN] + "..."
    return f"'{shown(text)}'" if isinstance(value, str) else shown(text)


def refuse(what: str, value, source: str, must: str):
    """Raise the `RemoteValueError` for `value` (from `source`), which is not a valid `what`."""
    detail = f"{source} gave {_quoted(value)} as {what}; {must}"
    raise RemoteValueError(f"{detail}. It was refused before any use (nothing written, nothing imported)",
                           checks=[("remote-value", False, detail)])


# ----------------------------------------------------------------------------------------------------------------------
# Predicates


def is_commit(value) -> bool:
    return isinstance(value, str) and _COMMIT.fullmatch(value) is not None


def is_ref_name(value) -> bool:
    """git's rules for a ref name (`git check-ref-format --allow-onelevel`), plus: printable characters only, at most
    255 characters. `v1`, `main`, `refs/heads/v1` and `refs/pr/1` pass; `..`, `a/../b`, `/x`, `x.lock`, `.x` do not."""
    if not isinstance(value, str) or not value or len(value) > MAX_REF_CHARS or not value.isprintable():
        return False
    if _REF_FORBIDDEN.search(value) or ".." in value or "@{" in value or value == "@" or value.endswith("."):
        return False
    parts = value.split("/")
    return all(p and not p.startswith(".") and not p.endswith(".lock") for p in parts)


def is_revision(value) -> bool:
    """A commit id or a ref name."""
    return is_commit(value) or is_ref_name(value)


def path_problem(value) -> Optional[str]:
    """Why `value` is not a relative POSIX file path inside its root, or None when it is one."""
    if not isinstance(value, str) or not value:
        return "a file name is a non-empty string"
    if len(value) > MAX_PATH_CHARS:
        return f"a file name has at most {MAX_PATH_CHARS} characters"
    if not value.isprintable():
        return "a file name holds no control, bidi or other non-printable character"
    if value.startswith("/") or "\\" in value:
        return "a file name is relative and uses '/' only"
    for part in value.split("/"):
        if part in ("", ".", ".."):
            return "a file name has no empty, '.' or '..' component"
        if len(part.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES:
            return f"a file name's components have at most {MAX_COMPONENT_BYTES} bytes"
    return None


# ----------------------------------------------------------------------------------------------------------------------
# Checks that raise RemoteValueError


def commit_id(value, *, source: str) -> str:
    """`value` when it is a commit id (40 lowercase hex digits)."""
    if not is_commit(value):
        refuse("a commit id", value, source, "a commit id is 40 lowercase hex digits")
    return value


def ref_name(value, *, source: str) -> str:
    if not is_ref_name(value):
        refuse("a ref name", value, source, "a ref name follows git's rules (no '..', no component starting with "
               "'.', no control character, space or ~^:?*[\\)")
    return value


def repo_path(value, *, source: str, under: Optional[str] = None) -> str:
    """`value` when it is a relative file path (and, with `under`, one inside that directory of the repository)."""
    problem = path_problem(value)
    if problem is None and under is not None and not value.startswith(under.rstrip("/") + "/"):
        problem = f"only files under {under}/ were asked for"
    if problem is not None:
        refuse("a file name", value, source, problem)
    return value


def name(value, *, source: str) -> str:
    """`value` when it is one path component (a variant directory name)."""
    problem = path_problem(value)
    if problem is None and "/" in value:
        problem = "a directory name has no '/'"
    if problem is not None:
        refuse("a directory name", value, source, problem)
    return value


def etag(value, *, source: str) -> str:
    if not isinstance(value, str) or _ETAG.fullmatch(value) is None:
        refuse("an ETag", value, source, "an ETag names a blob of the cache: 40 or 64 lowercase hex digits")
    return value


def size(value, *, source: str, limit: Optional[int] = None) -> int:
    """`value` when it is an integer number of bytes in [0, limit]; a decimal string is accepted (HTTP headers)."""
    number = value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
        number = int(value)
    if isinstance(number, bool) or not isinstance(number, int) or number < 0:
        refuse("a size", value, source, "a size is a non-negative integer number of bytes")
    if limit is not None and number > limit:
        refuse("a size", value, source, f"at most {limit} bytes are accepted here (WINATTN_MAX_VARIANT_BYTES)")
    return number


def contained(root, path, *, source: str) -> Path:
    """`path` when, with every link and `..` resolved, it is `root` or lies under it (both resolved the same way)."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and os.path.commonpath([real_root, real]) != real_root:
        refuse("a path", str(path), source, f"it resolves to {shown(real)}, outside {shown(real_root)}")
    return Path(path)
