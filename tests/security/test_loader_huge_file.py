"""Issue 13, item 5: a huge file must not be read whole into memory (1 GiB extra file -> +1 GB RSS on the original).

Each case runs `verify_variant` in a fresh interpreter and reports its peak RSS growth (ru_maxrss) over a warm-up
verification of the same build: an extra file the digest does not list is refused without being read at all, a listed
file is hashed in 1 MiB chunks, and anything above WINATTN_MAX_VARIANT_BYTES is refused before reading. The files are
sparse, so the test costs no disk.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from ._loader_support import REPO_ROOT, make_build, write_digest  # noqa: F401  (fixtures)

GiB = 1 << 30

MEASURE = textwrap.dedent("""
    import json, resource, sys, time
    from winattn.verify import verify_variant

    clean, target = sys.argv[1], sys.argv[2]
    verify_variant(clean, use_receipt=False)  # warm-up: imports, kernels' parser
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    report = verify_variant(target, use_receipt=False)
    seconds = time.perf_counter() - t0
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps({"ok": report.ok, "digest": report.check("digest").detail, "rss_growth_mib": grown / 1024,
                      "seconds": seconds}))
""")


def _measure(clean, target, **env) -> dict:
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(clean), str(target)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO_ROOT), **env), timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(out)
    return out


def _sparse(path, size):
    with open(path, "wb") as f:
        f.truncate(size)


def test_huge_extra_file_is_refused_without_being_read(make_build):
    clean, b = make_build(), make_build()
    _sparse(b.variant_dir / "huge.bin", GiB)
    out = _measure(clean.variant_dir, b.variant_dir)
    assert not out["ok"] and "Unknown file: huge.bin (not read)" in out["digest"]
    assert out["rss_growth_mib"] < 64, out


def test_huge_listed_file_is_hashed_in_bounded_memory(make_build):
    clean, b = make_build(), make_build()
    _sparse(b.variant_dir / "weights.bin", 512 << 20)  # read whole, this alone would add 512 MiB
    write_digest(b.variant_dir)
    out = _measure(clean.variant_dir, b.variant_dir)
    assert out["ok"], out
    assert out["rss_growth_mib"] < 64, out


def test_variant_over_the_size_limit_is_refused_before_reading(make_build):
    clean, b = make_build(), make_build()
    _sparse(b.variant_dir / "weights.bin", 4 * GiB)
    metadata = b.variant_dir / "metadata.json"
    meta = json.loads(metadata.read_text())
    meta["digest"]["files"]["weights.bin"] = "AAAA"  # never compared: refused on its size first
    metadata.write_text(json.dumps(meta))
    out = _measure(clean.variant_dir, b.variant_dir, WINATTN_MAX_VARIANT_BYTES=str(GiB))
    assert not out["ok"] and "more than the limit of 1073741824" in out["digest"], out
    assert out["seconds"] < 5 and out["rss_growth_mib"] < 64, out
