"""The scheduling control of a kernel's SASS: which scoreboards an instruction waits on, and which instructions set them.

    cuobjdump -sass build.so > dump.sass
    python scripts/sass_ctrl.py dump.sass KERNEL_SUBSTRING --from 0x2b00 --to 0x2c40   # a range, with its control
    python scripts/sass_ctrl.py dump.sass KERNEL_SUBSTRING --sets 0                    # who sets scoreboard 0

Why: ncu's source page says that an instruction stalled on the long or short scoreboard, not on whose result (or on
whose pending read of a register). On Volta to Hopper every instruction's second 64-bit word carries its control:
stall cycles (bits 41-44), yield (45), the scoreboard it releases when its result is written (46-48) or when its
source registers have been read (49-51; 7 = none), and the mask of scoreboards it waits on before issuing (52-57).
Twenty-eighth session (RESULTS v5.0): the backward's 11-12% loop-head stall waited on scoreboard 0, set (read) by
the eight `red.global.add.v4` dQ adds whose address registers ptxas reused at the loop's head.
Needs only a `cuobjdump -sass` listing (scripts/sass_check.py says where to get cuobjdump without a toolkit).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sass_check  # noqa: E402  (the listing's split into functions is its)

_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,6})\*/\s+(.*?)\s*;?\s*/\* (0x[0-9a-f]{16}) \*/\s*$")
_SECOND = re.compile(r"^\s*/\* (0x[0-9a-f]{16}) \*/\s*$")
NONE = 7  # (a 3-bit scoreboard field with no scoreboard)


@dataclass
class Instr:
    addr: int
    text: str
    stall: int
    yield_: bool
    write_sb: int
    read_sb: int
    wait_mask: int

    @property
    def waits_on(self) -> list[int]:
        return [b for b in range(6) if self.wait_mask >> b & 1]

    def sets(self, sb: int) -> bool:
        return sb in (self.write_sb, self.read_sb)

    def line(self) -> str:
        wait = "wait:" + "".join(map(str, self.waits_on)) if self.wait_mask else ""
        wsb = f"W{self.write_sb}" if self.write_sb != NONE else ""
        rsb = f"R{self.read_sb}" if self.read_sb != NONE else ""
        return f"{self.addr:05x}  {wait:9s} {wsb:3s} {rsb:3s} s{self.stall:<2d} {self.text}"


def decode(addr: int, text: str, second: int) -> Instr:
    return Instr(addr, text.rstrip(" ;"), (second >> 41) & 15, bool((second >> 45) & 1), (second >> 46) & 7,
                 (second >> 49) & 7, (second >> 52) & 63)


def kernel(listing: str, name_part: str) -> tuple[str, list[Instr]]:
    """The first function whose name contains name_part, decoded."""
    for name, body in sass_check.functions(listing):
        if name_part in name:
            lines = body.splitlines()
            out = []
            for j, line in enumerate(lines[:-1]):
                m = _INSTR.match(line)
                second = _SECOND.match(lines[j + 1]) if m else None
                if m and second:
                    out.append(decode(int(m.group(1), 16), m.group(2), int(second.group(1), 16)))
            return name, out
    raise SystemExit(f"no function whose name contains {name_part!r}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("listing", type=Path, help="a `cuobjdump -sass` output")
    ap.add_argument("kernel", help="a part of the kernel's (mangled) name; the first match is shown")
    ap.add_argument("--from", dest="lo", default="0", help="first address (hex)")
    ap.add_argument("--to", dest="hi", default="0xffffff", help="last address (hex)")
    ap.add_argument("--sets", type=int, default=None, metavar="SB", help="only instructions that set scoreboard SB")
    args = ap.parse_args(argv)
    name, instrs = kernel(args.listing.read_text(errors="replace"), args.kernel)
    lo, hi = int(args.lo, 16), int(args.hi, 16)
    print(name)
    for ins in instrs:
        if lo <= ins.addr <= hi and (args.sets is None or ins.sets(args.sets)):
            print(ins.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
