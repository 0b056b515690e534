"""Compare the PTX of one CUDA unit at a base revision and in the working tree, kernel entry by kernel entry.

    python scripts/ptx_compare.py fwd_v3_sm90_hdim64 [--base HEAD] [--arch 90a]

Why: a change meant to leave the default kernels alone (a new instance chosen only when forced, a shared helper
with a new parameter) can be checked without a GPU. The script prints the entries that are new, gone, identical and
different. "Identical" means equal after two normalizations:
  * numbers in labels that only count (branch targets `$L__BB<fn>_`, inline-asm `%=` labels like `WAIT_12`,
    `__local_depot<n>`) are removed, since they shift when an entry is added before another;
  * a trailing defaulted `bool` template argument that is false (`Lb0E` after FwdPipeTraitsSm90's three ints) is
    dropped from mangled names, so an instance keeps its name when the traits grow a defaulted parameter.
The PTX is compiled with the flags of a local unit check (-O3, sm_`--arch`), not the build's. The base revision's
tree comes from `git archive`, so uncommitted changes count as the working tree's only. Exit status 1 when an entry
differs or is gone.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UNITS = Path("kernel-src/cuda/instantiations")

_COUNTERS = [
    (re.compile(r"\$L__BB\d+_"), "$L__BB_"),
    (re.compile(r"__local_depot\d+"), "__local_depot"),
    (re.compile(r"\b([A-Z][A-Z_]*)_\d+\b"), r"\1_N"),
    (re.compile(r"(FwdPipeTraitsSm90ILi\d+ELi\d+ELi\d+E)Lb0E"), r"\1"),
]
_ENTRY = re.compile(r"\.visible \.entry (\S+)\(")


def entries(ptx: str) -> dict[str, str]:
    """Kernel entry name -> its normalized text (from `.visible .entry` to its closing brace)."""
    for pattern, repl in _COUNTERS:
        ptx = pattern.sub(repl, ptx)
    starts = list(_ENTRY.finditer(ptx))
    out = {}
    for i, m in enumerate(starts):
        body = ptx[m.start():starts[i + 1].start() if i + 1 < len(starts) else len(ptx)]
        out[m.group(1)] = body[:body.rfind("\n}\n") + 3]
    return out


def compare(base: dict[str, str], new: dict[str, str]) -> dict[str, list[str]]:
    return {"new": sorted(set(new) - set(base)), "gone": sorted(set(base) - set(new)),
            "identical": sorted(k for k in base if k in new and base[k] == new[k]),
            "different": sorted(k for k in base if k in new and base[k] != new[k])}


def ptx_of(tree: Path, unit: str, arch: str) -> str:
    src = tree / UNITS / f"{unit}.cu"
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / f"{unit}.ptx"
        subprocess.run(["nvcc", "-std=c++17", "-O3", "--expt-relaxed-constexpr", "-I", str(tree / "kernel-src"),
                        "-I", str(tree / "kernel-src" / "cuda"), f"-gencode=arch=compute_{arch},code=compute_{arch}",
                        "-ptx", str(src), "-o", str(out)], check=True, cwd=src.parent)
        return out.read_text()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("unit", help=f"a file name in {UNITS} without .cu, e.g. fwd_v3_sm90_hdim64")
    ap.add_argument("--base", default="HEAD", help="the revision to compare with (default HEAD)")
    ap.add_argument("--arch", default="90a")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        archive = Path(d) / "base.tar"
        subprocess.run(["git", "archive", "-o", str(archive), args.base, "kernel-src"], check=True, cwd=ROOT)
        with tarfile.open(archive) as tar:
            tar.extractall(d, filter="data")
        base = entries(ptx_of(Path(d), args.unit, args.arch))
    result = compare(base, entries(ptx_of(ROOT, args.unit, args.arch)))
    for kind in ("new", "gone", "different"):
        for name in result[kind]:
            print(f"{kind:9s} {name}")
    print(f"{args.unit}: {len(result['identical'])} identical, {len(result['different'])} different, "
          f"{len(result['new'])} new, {len(result['gone'])} gone (against {args.base})")
    return 1 if result["different"] or result["gone"] else 0


if __name__ == "__main__":
    sys.exit(main())
