"""docs/knobs.md lists every WINATTN_* environment variable the code reads: a variable read anywhere in the kernel
sources, the bindings, the Python packages or the scripts and missing from the table fails here (a knob nobody can
find is how shapes fall through the cracks). C preprocessor macros of the same prefix are not knobs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["kernel-src", "torch-ext", "winattn", "scripts", "benchmarks", "Makefile", ".ci"]
TOKEN = re.compile(r"\bWINATTN_[A-Z0-9_]*[A-Z0-9]\b")
MACRO = re.compile(r"#\s*(?:define|ifdef|ifndef|undef)\s+(WINATTN_[A-Z0-9_]+)")


def code_files():
    for name in SOURCES:
        path = ROOT / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            if f.suffix in {".py", ".h", ".cu", ".cpp", ".sh", ""} and "__pycache__" not in f.parts:
                yield f


def knobs_read():
    tokens, macros = {}, set()
    for f in code_files():
        text = f.read_text(errors="replace")
        macros.update(MACRO.findall(text))
        for t in TOKEN.findall(text):
            tokens.setdefault(t, f.relative_to(ROOT))
    return {t: where for t, where in tokens.items() if t not in macros and not t.startswith("WINATTN_INSTANTIATE_")}


def documented():
    return set(re.findall(r"`(WINATTN_[A-Z0-9_]+)`", (ROOT / "docs" / "knobs.md").read_text()))


def test_every_knob_the_code_reads_is_documented():
    missing = {t: str(w) for t, w in knobs_read().items() if t not in documented()}
    assert not missing, f"add these to docs/knobs.md (name, default, purpose): {missing}"


def test_the_table_names_no_knob_the_code_does_not_read():
    stale = documented() - set(knobs_read())
    assert not stale, f"docs/knobs.md documents variables nothing reads: {sorted(stale)}"


def test_the_scan_sees_knobs_of_each_kind():
    """Guards the scan itself: a C++ planner knob, a Python loader knob and a build knob are found."""
    found = knobs_read()
    assert {"WINATTN_FORCE_KERNEL", "WINATTN_CACHE", "WINATTN_NVCC_JOBS"} <= set(found)
    assert "WINATTN_HAVE_AVX2" not in found  # a #define, not a knob
