"""Per kernel of a CUDA unit, from its SASS: the wgmma count, the waits on them and the local-memory spills.

    python scripts/sass_check.py fwd_v3_sm90_hdim64 [bwd_v3_sm90_hdim64 ...] [--arch 90a] [--all-dtypes]
    python scripts/sass_check.py --sass dump.sass      # an existing `cuobjdump -sass` output

Why: ptxas serializes a kernel's wgmma when it cannot keep their operands in registers, waiting after every one
instead of once per chain, and it does not always say so (no C7514 warning for the two-CTA forward tile of v4.2,
whose 16 HGMMA each had a WARPGROUP.DEPBAR: the overlap the kernel was written for was gone). Such a kernel's
SASS has about one wait per wgmma; a healthy one a few per key block. A kernel is flagged "serialized" when its
waits are at least 3/4 of its wgmma (and it has more than 4 of them); spills are the STL instructions.

The step loop (the innermost loop with a wgmma) gets a line of its own: its spill stores and reloads run every
step, the others once per tile. It also counts the loop's uniform-datapath instructions (U*: descriptors, stage
addresses, loop counters kept in the warp's uniform registers), which ptxas gives up inside a loop over tiles: the
dynamic backward's walk (RESULTS, fortieth session) had 50 per step against the one-tile kernel's 260 at head dim
128, and its step loop spilled where the one-tile kernel's did not.

Needs `nvcc` and `cuobjdump` (CUDA 13; without a toolkit: `pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`,
since `-sass` runs nvdisasm, then their `nvidia/cu13/bin` on PATH). Compiled with the flags of a local unit check
(-O3, sm_`--arch`), not the build's. Exit status 1 when a kernel is serialized.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UNITS = ROOT / "kernel-src" / "cuda" / "instantiations"
_FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$", re.M)


@dataclass
class StepLoop:
    """The innermost loop (a backward branch's range) that holds a wgmma: what runs once per step."""
    length: int  # instructions
    spill_stores: int  # STL
    spill_loads: int  # LDL
    uniform: int  # uniform-datapath instructions (U*)


@dataclass
class KernelSass:
    name: str
    wgmma: int  # HGMMA instructions
    waits: int  # WARPGROUP.DEPBAR (waits on wgmma groups)
    spill_stores: int  # STL
    step_loop: StepLoop | None = None

    @property
    def serialized(self) -> bool:
        return self.wgmma > 4 and 4 * self.waits >= 3 * self.wgmma


_INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", re.M)
_BRANCH = re.compile(r"\bBRA\b(?!\.U\.ANY).*?0x([0-9a-f]+)")  # (BRA.U.ANY: a one-lane-at-a-time loop, not a step)
_UNIFORM = re.compile(r"^(@!?U?P\w+\s+)?U[A-Z0-9]")  # an instruction of the uniform datapath (UIADD3, UMOV, ...)


def instructions(body: str) -> list[tuple[int, str]]:
    """(address, text) of a function body's instructions, in order (the text between the address comment and the
    `;`; scripts/sass_diff.py aligns them)."""
    return [(int(a, 16), text) for a, text in _INSTRUCTION.findall(body)]


def step_loop(body: str) -> StepLoop | None:
    """The innermost backward-branch range of a function body that holds an HGMMA (None: no such loop)."""
    ins = instructions(body)
    index = {addr: i for i, (addr, _) in enumerate(ins)}
    loops = []
    for i, (_, text) in enumerate(ins):
        m = _BRANCH.search(text)
        start = index.get(int(m.group(1), 16)) if m else None
        if start is not None and start < i and any("HGMMA." in t for _, t in ins[start:i]):
            loops.append((i - start, start, i))
    if not loops:
        return None
    _, start, end = min(loops)
    texts = [t for _, t in ins[start:end + 1]]
    return StepLoop(len(texts), sum(bool(re.search(r"\bSTL\b", t)) for t in texts),
                    sum(bool(re.search(r"\bLDL\b", t)) for t in texts), sum(bool(_UNIFORM.match(t)) for t in texts))


def functions(sass: str) -> list[tuple[str, str]]:
    """(name, body) of each function of a `cuobjdump -sass` listing, in order (scripts/sass_diff.py and
    scripts/sass_ctrl.py split listings with it too)."""
    starts = list(_FUNCTION.finditer(sass))
    return [(m.group(1), sass[m.end():starts[i + 1].start() if i + 1 < len(starts) else len(sass)])
            for i, m in enumerate(starts)]


def kernels(sass: str) -> list[KernelSass]:
    """The kernels of a `cuobjdump -sass` listing, in order."""
    return [KernelSass(name, len(re.findall(r"\bHGMMA\.", body)), len(re.findall(r"\bWARPGROUP\.DEPBAR\b", body)),
                       len(re.findall(r"\bSTL\b", body)), step_loop(body)) for name, body in functions(sass)]


def sass_of(unit: str, arch: str, root: Path = ROOT) -> str:
    """`cuobjdump -sass` of one unit compiled from the source tree at `root` (another revision's: scripts/sass_diff.py)."""
    src = root / UNITS.relative_to(ROOT) / f"{unit}.cu"
    with tempfile.TemporaryDirectory() as d:
        obj = Path(d) / f"{unit}.o"
        subprocess.run(["nvcc", "-std=c++17", "-O3", "--expt-relaxed-constexpr", "-I", str(root / "kernel-src"),
                        "-I", str(root / "kernel-src" / "cuda"), f"-gencode=arch=compute_{arch},code=sm_{arch}",
                        "-c", str(src), "-o", str(obj)], check=True, cwd=src.parent)
        return subprocess.run(["cuobjdump", "-sass", str(obj)], check=True, capture_output=True, text=True).stdout


def report(found: list[KernelSass], all_dtypes: bool) -> int:
    """Prints one line per kernel (bf16 instances only unless all_dtypes: fp16's are their twins); returns the count
    of serialized kernels."""
    bad = 0
    for k in found:
        if not all_dtypes and "half" in k.name and "bfloat16" not in k.name:
            continue
        bad += k.serialized
        flag = "  SERIALIZED" if k.serialized else ""
        print(f"wgmma {k.wgmma:3d}  waits {k.waits:3d}  STL {k.spill_stores:3d}  {k.name}{flag}")
        if k.step_loop:
            sl = k.step_loop
            print(f"    step loop: {sl.length} instructions, STL {sl.spill_stores}, LDL {sl.spill_loads}, "
                  f"uniform {sl.uniform}")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("units", nargs="*", help=f"file names in {UNITS.relative_to(ROOT)} without .cu")
    ap.add_argument("--sass", type=Path, help="read this cuobjdump -sass output instead of compiling")
    ap.add_argument("--arch", default="90a")
    ap.add_argument("--all-dtypes", action="store_true", help="also list the fp16 instances")
    args = ap.parse_args(argv)
    if not args.units and not args.sass:
        ap.error("name a unit or --sass")
    listings = [args.sass.read_text()] if args.sass else [sass_of(u, args.arch) for u in args.units]
    bad = sum(report(kernels(text), args.all_dtypes) for text in listings)
    print(f"{bad} serialized kernel(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
