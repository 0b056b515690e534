"""tile_sm90.h builds a wgmma k-step's descriptor two ways: whole from the step's address, or as the tile's
descriptor plus the step's offset (`kFromBase`, `desc_plus`: the backward at head dims 64 and 256 since v4.6, the
forward there without a term or with mask bits since v4.7, which lets ptxas keep descriptors in uniform registers).
The second (added to the low word, or as one 64-bit add: `kAdd64`, the backward's since v5.5) relies on the
start-address field never carrying into the field above it; wgmma_desc_check.cu compares the three forms on the host
for every 16-byte tile address below the 227 KB a CTA can have and every k-step the kernels build (128-, 64- and
32-byte rows; ~10 million comparisons, nvcc's host compiler, no GPU)."""

import subprocess
from pathlib import Path

from winattn._build import toolchain as _tc

UNIT = Path(__file__).resolve().parent / "wgmma_desc_check.cu"
KERNEL_SRC = Path(__file__).resolve().parents[2] / "kernel-src"


def test_descriptor_from_the_tile_base_equals_the_one_built_whole(tmp_path):
    cuda = _tc.find_cuda()  # (CI has nvcc: no nvcc is a failure, not a skip, as in test_kernel_headers.py)
    exe = tmp_path / "wgmma_desc_check"
    subprocess.run([cuda.nvcc, "-std=c++17", "--expt-relaxed-constexpr", f"-I{KERNEL_SRC}",
                    *[f"-I{d}" for d in cuda.include_dirs], str(UNIT), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mismatched 0" in r.stdout and int(r.stdout.split("compared ")[1].split(",")[0]) > 1_000_000, r.stdout
