"""Extract the code blocks of README.md and docs/*.md, with the markers that say how a block may be run.

A fenced block in `python`, `bash` or `sh` is code and is run. A block of any other language (or none) is output or
configuration shown to the reader and is not run. An HTML comment on the line right above a fence marks the block:

    <!-- snippet: gpu -->              needs a CUDA GPU: skipped without one
    <!-- snippet: multi-gpu -->        needs several GPUs (torchrun): skipped here
    <!-- snippet: background -->       a server: started in the background, the next blocks run while it serves
    <!-- snippet: skip(REASON) -->     not run, REASON says why (installs packages, needs Nix, minutes of nvcc)

A document can ask for a prepared Hub with `<!-- snippets: setup=published -->` anywhere in it: the test then
points HF_ENDPOINT/HF_TOKEN at a Hub holding the signed CPU kernel before its first block; `setup=published+key` also
puts the signer's public key in the working directory as `signing-key.pub.pem` (a reader who followed the README's
walkthrough has both).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RUNNABLE = {"python": "python", "bash": "bash", "sh": "bash"}
_FENCE = re.compile(r"^```(\S*)\s*$")
_MARK = re.compile(r"^<!--\s*snippet:\s*(gpu|multi-gpu|background|skip\((?P<reason>.+)\))\s*-->\s*$")
_SETUP = re.compile(r"<!--\s*snippets:\s*setup=(\S+)\s*-->")


@dataclass(frozen=True)
class Snippet:
    doc: str
    line: int  # 1-based line of the opening fence
    lang: str  # "python" or "bash"
    code: str
    mark: str | None  # gpu, multi-gpu, background, skip
    reason: str | None

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def doc_setup(path: Path) -> str | None:
    m = _SETUP.search(path.read_text())
    return m.group(1) if m else None


def extract(path: Path, root: Path) -> list[Snippet]:
    """Every runnable block of `path`, in document order."""
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if j == len(lines):
            raise ValueError(f"{path}:{start + 1}: unclosed code fence")
        mark = reason = None
        if start > 0 and (mm := _MARK.match(lines[start - 1].strip())):
            mark = mm.group(1).split("(")[0]
            reason = mm.group("reason")
        elif start > 0 and lines[start - 1].strip().startswith("<!-- snippet"):
            raise ValueError(f"{path}:{start}: unknown snippet marker {lines[start - 1].strip()!r}")
        if lang in RUNNABLE:
            out.append(Snippet(str(path.relative_to(root)), start + 1, RUNNABLE[lang],
                               "\n".join(lines[start + 1:j]) + "\n", mark, reason))
        i = j + 1
    return out


def documents(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]
