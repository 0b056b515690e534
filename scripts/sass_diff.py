"""Compare two builds' SASS kernel by kernel: how many instructions moved, not only how many there are.

    python scripts/sass_diff.py UNIT [--base REV]            # one unit, compiled at REV and in the working tree
    python scripts/sass_diff.py --sass BASE.sass NEW.sass     # two `cuobjdump -sass` listings (e.g. of two builds'
                                                              # libraries: a build's .so is a fatbin cuobjdump reads)
        [--only SUBSTR] [--threshold 0.05] [--name-sub PATTERN REPLACEMENT]

Why: a change meant to leave a kernel alone can still move ptxas's schedule. In v4.4 one template constant in a
run-time expression of the backward (`... && kDq != kBwdDqDirect`) left every accumulate kernel with the same HGMMA,
waits and stores and 8-16 fewer instructions (scripts/sass_check.py's counts saw nothing), yet 800-3300 of ~3000
instructions in another order, and the backward 9-13% slower on the H100 (RESULTS v4.4). This lists, per kernel both
listings have, the instructions that differ in an alignment of the two sequences (difflib; a renamed register counts,
so a few tens is the floor of an unrelated edit) and flags a kernel where more than --threshold of them moved.
Needs `nvcc` and `cuobjdump` for UNIT (without a toolkit: `pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`,
their `nvidia/cu13/bin` on PATH). Exit status 1 when a kernel is flagged.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sass_check  # noqa: E402  (the unit compile, the kernel split and the instruction parse are its)


def instructions(sass: str, name_sub: tuple[str, str] | None = None) -> dict[str, list[str]]:
    """Kernel name -> its instructions in order (the text between the address comment and the `;`). name_sub: a
    (regex, replacement) applied to the names, so that kernels renamed by a new template parameter pair up (v4.5's
    BwdPipeTraitsSm90<64, 3> -> <64, 3, 64>: `--name-sub 'ELi64EEE' 'EEE'`)."""
    rename = (lambda n: re.sub(name_sub[0], name_sub[1], n)) if name_sub else (lambda n: n)
    return {rename(name): [text for _, text in sass_check.instructions(body)]
            for name, body in sass_check.functions(sass)}


def moved(a: list[str], b: list[str]) -> int:
    """Instructions of the longer side of every non-matching stretch of the alignment of a and b."""
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in ops if tag != "equal")


def compare(base: str, new: str, only: str = "", threshold: float = 0.05,
            name_sub: tuple[str, str] | None = None) -> int:
    """Prints one line per shared kernel (and the kernels only one side has); returns the count flagged."""
    a, b = instructions(base, name_sub), instructions(new, name_sub)
    flagged = 0
    for name in sorted(set(a) | set(b)):
        if only not in name:
            continue
        if name not in a or name not in b:
            print(f"{'new' if name in b else 'gone':>13}  {name}")
            continue
        n = moved(a[name], b[name])
        flag = n > threshold * max(len(a[name]), 1)
        flagged += flag
        print(f"{n:5d} of {len(a[name]):5d}  {name}{'  MOVED' if flag else ''}")
    print(f"{flagged} kernel(s) with more than {threshold:.0%} of their instructions moved")
    return flagged


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("unit", nargs="?", help="a file name in kernel-src/cuda/instantiations without .cu")
    ap.add_argument("--base", default="HEAD", help="with UNIT: the revision to compare with (default HEAD)")
    ap.add_argument("--sass", nargs=2, type=Path, metavar=("BASE", "NEW"), help="compare two listings instead")
    ap.add_argument("--only", default="", help="kernels whose mangled name contains this")
    ap.add_argument("--threshold", type=float, default=0.05)
    ap.add_argument("--arch", default="90a")
    ap.add_argument("--name-sub", nargs=2, metavar=("PATTERN", "REPLACEMENT"),
                    help="a regex substitution applied to both sides' kernel names (a renamed template)")
    args = ap.parse_args(argv)
    if args.sass:
        base, new = (p.read_text() for p in args.sass)
    elif args.unit:
        with tempfile.TemporaryDirectory() as d:
            archive = Path(d) / "base.tar"
            subprocess.run(["git", "archive", "-o", str(archive), args.base, "kernel-src"], check=True,
                           cwd=sass_check.ROOT)
            with tarfile.open(archive) as tar:
                tar.extractall(d, filter="data")
            base = sass_check.sass_of(args.unit, args.arch, Path(d))
        new = sass_check.sass_of(args.unit, args.arch)
    else:
        ap.error("name a unit or --sass BASE NEW")
    return 1 if compare(base, new, args.only, args.threshold, tuple(args.name_sub) if args.name_sub else None) else 0


if __name__ == "__main__":
    sys.exit(main())
