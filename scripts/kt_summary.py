"""The rounds of a scripts/gpu_variants.sh call, summed up: per row, each variant's forward and forward + backward
kernel ms (benchmarks/kernel_time.py's "kernels ms" column, ours only) as the mean over its rounds, and the change of
that mean against the first variant (the baseline, as VARIANTS names it).

    python scripts/kt_summary.py results/variants/kernel_time.txt

Why: every A/B of the last sessions was read by hand from the rounds (RESULTS v5.5, v5.6), and on the H100 a 2-3%
change is within one build's spread between rounds, so the means and every round's value are printed together.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict

_SECTION = re.compile(r"^#### (\S+) \(round (\d+)\)")
_ROW = re.compile(r"^(\S+)\s+ours\s+(fwd|f\+b)\s+([0-9.]+)\s")


def parse(text: str) -> tuple[list[str], dict[tuple[str, str, str], list[float]]]:
    """The variants in order of first appearance, and {(row, pass, variant): [kernel ms per round]}."""
    variants: list[str] = []
    times: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    current = None
    for line in text.splitlines():
        section = _SECTION.match(line)
        if section:
            current = section.group(1)
            if current not in variants:
                variants.append(current)
            continue
        row = _ROW.match(line)
        if row and current is not None:
            times[(row.group(1), row.group(2), current)].append(float(row.group(3)))
    return variants, times


def summary(text: str) -> str:
    variants, times = parse(text)
    if not variants:
        return "no rounds found"
    rows = list(dict.fromkeys(r for r, _, _ in times))
    base = variants[0]
    lines = [f"kernel ms, mean over rounds (the rounds), change against {base}"]
    for pass_ in ("fwd", "f+b"):
        lines.append(f"{pass_}:")
        for row in rows:
            ref = times.get((row, pass_, base))
            cells = []
            for v in variants:
                got = times.get((row, pass_, v))
                if not got:
                    cells.append(f"{v} -")
                    continue
                mean = sum(got) / len(got)
                rounds = ", ".join(f"{x:.3f}" for x in got)
                change = f" {100 * (mean / (sum(ref) / len(ref)) - 1):+.1f}%" if ref and v != base else ""
                cells.append(f"{v} {mean:.3f} ({rounds}){change}")
            if any(not c.endswith(" -") for c in cells):
                lines.append(f"  {row:26s} " + " | ".join(cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as f:
        print(summary(f.read()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
