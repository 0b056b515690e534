"""Every header under kernel-src/cuda compiles on its own (issue 31): a header that only compiles after another one
(bwd_split_d_sm90.h did, in the middle of bwd_pipelined_sm90.h; fwd_windows_sm90.h needed <cuda.h> from whatever
came first) breaks whoever includes it next. nvcc's front end (`-cuda`: parse and instantiate, no code generation)
on a one-line translation unit per header, about 2 s each, two at a time."""

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from winattn._build import toolchain as _tc

REPO_ROOT = Path(__file__).resolve().parents[2]
KERNEL_SRC = REPO_ROOT / "kernel-src"
HEADERS = sorted(str(p.relative_to(KERNEL_SRC)) for p in (KERNEL_SRC / "cuda").rglob("*.h"))


def test_the_header_list_is_the_tree():
    assert "cuda/sm90/bwd_split_d_sm90.h" in HEADERS and "cuda/kernel_choice.h" in HEADERS and len(HEADERS) > 20


def test_every_kernel_header_compiles_on_its_own(tmp_path):
    cuda = _tc.find_cuda()  # (CI has nvcc, as for test_matrix's CUDA build: no nvcc is a failure, not a skip)
    flags = ["-std=c++17", "--expt-relaxed-constexpr", "-DCUDA_KERNEL", "-DUSE_CUDA", f"-I{KERNEL_SRC}",
             "-gencode=arch=compute_90a,code=sm_90a"] + [f"-I{d}" for d in cuda.include_dirs]

    def front_end(i_header):
        i, header = i_header
        unit = tmp_path / f"h{i}.cu"
        unit.write_text(f'#include "{header}"\n')
        r = subprocess.run([cuda.nvcc, *flags, "-cuda", str(unit), "-o", str(tmp_path / f"h{i}.ii")],
                           capture_output=True, text=True)
        return header, r.returncode, r.stdout + r.stderr

    with ThreadPoolExecutor(max_workers=2) as pool:
        failed = [(h, out) for h, rc, out in pool.map(front_end, enumerate(HEADERS)) if rc != 0]
    assert not failed, "\n\n".join(f"{h}:\n{out[-2000:]}" for h, out in failed)
