"""Which variant of a scripts/gpu_variants.sh call should land, decided on the device, so that the next call (the
shape matrix on that build, benchmarks/pending/matrix_fa4.sh) can follow within the ~30 s a warm machine waits.

    python scripts/pick_variant.py OUTDIR KEY_ROW CANDIDATE... > /tmp/pick

A candidate qualifies when its GPU suite log ends in "passed" with no failure, its sanitizer log (when the call ran
them) reports 0 errors and 0 hazards, and no row's mean kernel time (forward or forward + backward) is more than
1% and one printed quantum (0.001 ms) above the baseline's (the first variant of kernel_time.txt): one build's
spread between rounds on the H100, and a 0.010 ms row's last digit.
Among those, the first named wins unless a later one's KEY_ROW forward + backward is at least 0.5% faster (the
simpler change first). None qualifying: the baseline. Prints the name, and the reason on stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kt_summary import parse

_NOISE = 0.01  # a row this much slower than the baseline counts as slower,
_QUANTUM = 0.001  # and by more than kernel_time.py's last printed digit (ms)
_BETTER = 0.005  # a later candidate must beat the current pick by this much on the key row


def _failed_check(out: Path, name: str) -> str:
    """Empty when the variant's suite (and sanitizers, if run) passed, else why not."""
    suite = out / f"{name}_suite.log"
    if not suite.exists():
        return "no suite log"
    last = (suite.read_text(encoding="utf-8", errors="replace").strip().splitlines() or [""])[-1]
    if "passed" not in last or "failed" in last or "error" in last:
        return f"suite: {last}"
    sanitize = out / f"{name}_sanitize.log"
    if sanitize.exists():
        text = sanitize.read_text(encoding="utf-8", errors="replace")
        if "0 errors" not in text or "0 hazards" not in text:
            return "sanitizers reported"
    return ""


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def pick(out: Path, key_row: str, candidates: list[str]) -> tuple[str, str]:
    variants, times = parse((out / "kernel_time.txt").read_text(encoding="utf-8", errors="replace"))
    if not variants:
        return "", "no kernel-time rounds"
    base = variants[0]
    choice, why = base, "no candidate qualified"
    for name in candidates:
        failed = _failed_check(out, name)
        if failed:
            print(f"{name}: {failed}", file=sys.stderr)
            continue
        slower = [
            f"{row} {pass_} {100 * (_mean(got) / _mean(times[(row, pass_, base)]) - 1):+.1f}%"
            for (row, pass_, v), got in times.items()
            if v == name and times.get((row, pass_, base))
            and _mean(got) > (1 + _NOISE) * _mean(times[(row, pass_, base)]) + _QUANTUM
        ]
        if slower:
            print(f"{name}: slower on {', '.join(slower)}", file=sys.stderr)
            continue
        mine = times.get((key_row, "f+b", name))
        if not mine:
            print(f"{name}: no {key_row} f+b time", file=sys.stderr)
            continue
        current = times.get((key_row, "f+b", choice))
        if choice == base or _mean(mine) < (1 - _BETTER) * _mean(current):
            choice, why = name, f"{key_row} f+b {_mean(mine):.3f} ms"
    return choice, why


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3:
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    choice, why = pick(Path(args[0]), args[1], args[2:])
    if not choice:
        print(why, file=sys.stderr)
        return 1
    print(choice)
    print(f"picked {choice}: {why}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
