"""`winattn build`: layout, metadata, digest, incremental builds, build.toml errors, ABI checks, side-by-side loads.

The repository's CPU variant is built once per module (into a temporary build dir; the objects are shared with
tests/conftest.py's build through _build_obj/, so this is a no-op compile when the session already built it).
Builder behaviour that does not need the real kernel runs on a throwaway kernel tree (tiny naive backend) so it
compiles in seconds. Never load two builds with the *same* id in one process (torch would see one op namespace
registered twice): in-process loads use ids of their own, the default-id build is loaded in a subprocess.
"""

import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from winattn.build import build, build_variant
from winattn.errors import BuildError

REPO_ROOT = Path(__file__).resolve().parents[2]
MACHINE = {"AMD64": "x86_64", "arm64": "aarch64"}.get(platform.machine(), platform.machine())
CPU_VARIANT = f"torch-stable-abi210-cpu-{MACHINE}-linux"
HAS_NVCC = shutil.which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").is_file()


def _git(*args):
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def _package_files(root: Path) -> set:
    pkg = root / "torch-ext" / "window_attention"
    return {
        p.relative_to(pkg).as_posix()
        for p in pkg.rglob("*")
        if p.is_file() and p.suffix in (".py", ".pyi") and "__pycache__" not in p.parts and p.name != "_ops.py"
    }


def _variant_files(variant_dir: Path) -> set:
    return {p.relative_to(variant_dir).as_posix() for p in variant_dir.rglob("*") if p.is_file()}


# ---------------------------------------------------------------------------------------------------------------
# Throwaway kernel tree: the repo's build.toml, binding and Python package with a tiny naive backend


NAIVE_CPU = r"""
// Throwaway fp32 backend for the builder's tests: forward only (causal supported), bwd is a no-op.
#include <cmath>
#include <limits>
#include <vector>
#include "winattn_backend.h"
#include "extra.h"
namespace winattn {
int64_t fwd_workspace_bytes(const FwdParams&) { return 0; }
int64_t bwd_workspace_bytes(const BwdParams&) { return 0; }
DbiasLayout bwd_dbias_layout(const BwdParams&) { return {}; }
void fwd(const FwdParams& p, void*, void*) {
  const float* q = static_cast<const float*>(p.q);
  const float* k = static_cast<const float*>(p.k);
  const float* v = static_cast<const float*>(p.v);
  float* o = static_cast<float*>(p.out);
  std::vector<float> s(p.seqlen_k);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads; ++h) {
      const int64_t hk = h / (p.heads / p.heads_kv);
      for (int64_t i = 0; i < p.seqlen_q; ++i) {
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < p.seqlen_k; ++j) {
          if (p.causal && j - i - (p.seqlen_k - p.seqlen_q) > 0) { s[j] = -INFINITY; continue; }
          float acc = 0;
          for (int64_t x = 0; x < p.head_dim; ++x)
            acc += q[b * p.q_stride_b + i * p.q_stride_s + h * p.q_stride_h + x] *
                   k[b * p.k_stride_b + j * p.k_stride_s + hk * p.k_stride_h + x];
          s[j] = acc * p.scale;
          m = std::max(m, s[j]);
        }
        float l = 0;
        for (int64_t j = 0; j < p.seqlen_k; ++j) { s[j] = std::isinf(s[j]) ? 0.f : std::exp(s[j] - m); l += s[j]; }
        for (int64_t x = 0; x < p.head_dim; ++x) {
          float acc = 0;
          for (int64_t j = 0; j < p.seqlen_k; ++j)
            acc += s[j] * v[b * p.v_stride_b + j * p.v_stride_s + hk * p.v_stride_h + x];
          o[b * p.o_stride_b + i * p.o_stride_s + h * p.o_stride_h + x] = acc / l;
        }
        p.lse[(b * p.heads + h) * p.seqlen_q + i] = m + std::log(l) + WINATTN_TEST_EXTRA;
      }
    }
}
void bwd(const BwdParams&, void*, void*) {}
}  // namespace winattn
"""

TINY_CUDA = r"""
// Throwaway CUDA backend for the builder's tests: out = 0, lse = -inf.
#include <cuda_runtime.h>
#include <cmath>
#include "winattn_backend.h"
namespace winattn {
namespace {
__global__ void fill_lse(float* lse, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) lse[i] = -INFINITY;
}
}  // namespace
int64_t fwd_workspace_bytes(const FwdParams&) { return 0; }
int64_t bwd_workspace_bytes(const BwdParams&) { return 0; }
DbiasLayout bwd_dbias_layout(const BwdParams&) { return {}; }
void fwd(const FwdParams& p, void*, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t esize = p.dtype == DType::kFloat32 ? 4 : 2;
  cudaMemsetAsync(p.out, 0, p.batch * p.seqlen_q * p.heads * p.head_dim * esize, s);
  const int64_t n = p.batch * p.heads * p.seqlen_q;
  fill_lse<<<(n + 255) / 256, 256, 0, s>>>(p.lse, n);
}
void bwd(const BwdParams&, void*, void*) {}
}  // namespace winattn
"""


TREE_BUILD_TOML = """\
# The repository's build.toml with one source per backend (the throwaway backends below).
[general]
name = "window-attention"
version = 1
edition = 5
license = "Apache-2.0"
backends = ["cpu", "cuda"]

[general.hub]
repo-id = "winattn/window-attention"

[torch]
src = ["torch-ext/torch_binding.cpp", "torch-ext/torch_binding.h"]
include = ["kernel-src"]
stable-abi = "2.10"

[kernel.window_attention_cpu]
backend = "cpu"
depends = ["torch"]
include = ["kernel-src"]
src = ["kernel-src/winattn_params.h", "kernel-src/winattn_backend.h", "kernel-src/cpu/winattn_cpu.cpp"]

[kernel.window_attention_cuda]
backend = "cuda"
depends = ["torch"]
include = ["kernel-src"]
cuda-capabilities = ["8.0", "8.6", "8.9", "9.0"]
src = ["kernel-src/winattn_params.h", "kernel-src/winattn_backend.h", "kernel-src/cuda/winattn_cuda.cu"]
"""


def make_tree(dest: Path) -> Path:
    """A kernel repository in `dest`: the repo's binding, Python package and kernel-src interface headers, with
    naive backends and a fixed build.toml (independent of the real kernels' source lists)."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "build.toml").write_text(TREE_BUILD_TOML)
    shutil.copytree(REPO_ROOT / "torch-ext", dest / "torch-ext", ignore=shutil.ignore_patterns("__pycache__", "_ops.py"))
    (dest / "kernel-src" / "cpu").mkdir(parents=True)
    (dest / "kernel-src" / "cuda").mkdir(parents=True)
    for h in ("winattn_params.h", "winattn_backend.h"):
        shutil.copy(REPO_ROOT / "kernel-src" / h, dest / "kernel-src" / h)
    (dest / "kernel-src" / "extra.h").write_text("#pragma once\n#define WINATTN_TEST_EXTRA 0.0f\n")
    (dest / "kernel-src" / "cpu" / "winattn_cpu.cpp").write_text(NAIVE_CPU)
    (dest / "kernel-src" / "cuda" / "winattn_cuda.cu").write_text(TINY_CUDA)
    return dest


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return make_tree(tmp_path_factory.mktemp("ktree") / "window-attention")


def _edit_toml(root: Path, old: str, new: str) -> None:
    p = root / "build.toml"
    text = p.read_text()
    assert old in text, old
    p.write_text(text.replace(old, new, 1))


# ---------------------------------------------------------------------------------------------------------------
# The repository's CPU variant


@pytest.fixture(scope="module")
def repo_build(tmp_path_factory):
    lines = []
    result = build(REPO_ROOT, "cpu", tmp_path_factory.mktemp("build"), log=lines.append)
    return result, lines


def test_layout_is_kernel_builders_flat_layout(repo_build):
    r, _ = repo_build
    assert r.variant == CPU_VARIANT
    assert r.variant_dir.name == CPU_VARIANT
    expected = _package_files(REPO_ROOT) | {"_ops.py", f"{r.ops_name}.abi3.so", "metadata.json"}
    assert _variant_files(r.variant_dir) == expected
    assert not list(r.variant_dir.rglob("__pycache__"))
    ops = (r.variant_dir / "_ops.py").read_text()
    assert f"from . import {r.ops_name}\n" in ops
    assert f"ops = torch.ops.{r.ops_name}\n" in ops
    assert f'return f"{r.ops_name}::{{op_name}}"' in ops


def test_ops_name_is_git_tree_hash_with_dirty_suffix(repo_build):
    r, _ = repo_build
    tree = _git("rev-parse", "HEAD^{tree}")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    assert r.ops_name == f"_window_attention_cpu_{tree[:7]}" + ("_dirty" if dirty else "")


def test_metadata_parses_and_digest_validates(repo_build, tmp_path):
    from kernels._rust import Digest, DigestAlgorithm, DigestValidationError, Metadata

    r, _ = repo_build
    m = Metadata.read_from_file(str(r.variant_dir / "metadata.json"))
    assert m.id == r.ops_name
    assert str(m.name) == "window-attention"
    assert m.version == 1
    assert m.license == "Apache-2.0"
    assert m.python_depends == []
    assert str(m.backend.backend_type) == "cpu"
    assert m.provenance.kernel.commit == _git("rev-parse", "HEAD")
    assert isinstance(m.provenance.kernel.dirty, bool)
    m.digest.validate(Digest.hash_variant(DigestAlgorithm.SHA256, str(r.variant_dir)))
    raw = json.loads((r.variant_dir / "metadata.json").read_text())
    assert raw["digest"]["algorithm"] == "sha256"
    assert set(raw["digest"]["files"]) == _variant_files(r.variant_dir) - {"metadata.json"}

    tampered = tmp_path / CPU_VARIANT
    shutil.copytree(r.variant_dir, tampered)
    (tampered / "interface.py").write_text("# changed\n")
    with pytest.raises(DigestValidationError):
        m.digest.validate(Digest.hash_variant(DigestAlgorithm.SHA256, str(tampered)))


def test_abi_checks_are_wired(repo_build):
    from kernel_abi_check import ObjectFile

    r, lines = repo_build
    assert ObjectFile(str(r.so_path)).check_python_abi("3.9") == []
    assert r.abi.abi3 == []
    assert isinstance(r.abi.manylinux, list)
    # -fvisibility=hidden + version script: the module init function is the only export.
    assert r.abi.exported == [f"PyInit_{r.ops_name}"]
    assert r.abi.unresolved == []
    assert any("abi3 (Python 3.9): pass" in line for line in lines)
    assert any("manylinux_2_28: " in line for line in lines)


def test_second_build_does_not_recompile(repo_build):
    r, _ = repo_build
    so_mtime = r.so_path.stat().st_mtime_ns
    obj_mtime = (r.obj_dir / f"{r.ops_name}.abi3.so").stat().st_mtime_ns
    lines = []
    again = build(REPO_ROOT, "cpu", r.variant_dir.parent, log=lines.append)
    assert again.compiled == [] and not again.linked
    assert any("up to date (nothing to compile)" in line for line in lines)
    assert again.so_path.stat().st_mtime_ns == so_mtime
    assert (again.obj_dir / f"{r.ops_name}.abi3.so").stat().st_mtime_ns == obj_mtime


def test_get_local_kernel_loads_the_build_dir(repo_build):
    """In a subprocess: the default-id build may also be loaded in this process by tests/conftest.py's fixture."""
    r, _ = repo_build
    script = textwrap.dedent(
        """
        import sys
        sys.dont_write_bytecode = True
        from pathlib import Path
        import torch
        from kernels import get_local_kernel
        k = get_local_kernel(Path(sys.argv[1]))
        assert k.__name__ == sys.argv[2], k.__name__
        g = torch.Generator().manual_seed(0)
        q, kk, v = (torch.randn(2, 12, 4, 32, generator=g) for _ in range(3))
        bias = torch.randn(4, 12, 12, generator=g)
        out = k.attention(q, kk, v, bias=bias, causal=True)
        ref = k.reference.attention(q, kk, v, bias=bias, causal=True)
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
        try:  # an error raised in the .so reaches Python as RuntimeError (the process must not abort)
            k._ops.ops.fwd(q[..., :24].contiguous(), kk, v, None, None, None, None, None, 1.0, False, -1, -1, False)
        except RuntimeError as e:
            assert "head dims differ" in str(e), e
        else:
            raise AssertionError("no error")
        print("OK")
        """
    )
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    p = subprocess.run([sys.executable, "-c", script, str(r.variant_dir.parent), r.ops_name], capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("OK"), p.stdout + p.stderr
    assert not list(r.variant_dir.rglob("__pycache__"))


def test_two_ids_load_side_by_side(tmp_path, monkeypatch):
    from kernels import get_local_kernel

    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    a = build_variant(REPO_ROOT, "cpu", tmp_path / "a", unique_id="sidebyside_a", log=lambda _: None)
    b = build_variant(REPO_ROOT, "cpu", tmp_path / "b", unique_id="sidebyside_b", log=lambda _: None)
    assert a.name == b.name == CPU_VARIANT
    ka, kb = get_local_kernel(a), get_local_kernel(b)
    assert ka.__name__ == "_window_attention_cpu_sidebyside_a"
    assert kb.__name__ == "_window_attention_cpu_sidebyside_b"
    assert ka is not kb
    assert hasattr(torch.ops._window_attention_cpu_sidebyside_a, "fwd")
    assert hasattr(torch.ops._window_attention_cpu_sidebyside_b, "fwd")
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 9, 2, 16, generator=g) for _ in range(3))
    ref = ka.reference.attention(q, k, v)
    torch.testing.assert_close(ka.attention(q, k, v), ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(kb.attention(q, k, v), ref, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# Builder behaviour on the throwaway tree


def test_incremental_rebuilds_only_what_changed(tmp_path):
    tree = make_tree(tmp_path / "incr")
    out = tmp_path / "build"
    first = build(tree, "cpu", out, unique_id="incr", log=lambda _: None)
    assert sorted(first.compiled) == ["kernel-src/cpu/winattn_cpu.cpp", "torch-ext/torch_binding.cpp"]
    assert first.linked
    second = build(tree, "cpu", out, unique_id="incr", log=lambda _: None)
    assert second.compiled == [] and not second.linked
    # A header included by the kernel source only (tracked through the compiler's depfile).
    (tree / "kernel-src" / "extra.h").write_text("#pragma once\n#define WINATTN_TEST_EXTRA (0.0f)\n")
    third = build(tree, "cpu", out, unique_id="incr", log=lambda _: None)
    assert third.compiled == ["kernel-src/cpu/winattn_cpu.cpp"] and third.linked
    # A new id recompiles the binding only (kernel sources do not see TORCH_EXTENSION_NAME).
    fourth = build(tree, "cpu", out, unique_id="incr2", log=lambda _: None)
    assert fourth.compiled == ["torch-ext/torch_binding.cpp"]


def test_stale_files_are_removed(tree, tmp_path):
    from kernels._rust import Digest, DigestAlgorithm, Metadata

    out = tmp_path / "build"
    old = build_variant(tree, "cpu", out, unique_id="stale_old", log=lambda _: None)
    (old / "__pycache__").mkdir()
    (old / "__pycache__" / "interface.cpython-311.pyc").write_bytes(b"x")
    (old / "leftover.py").write_text("x = 1\n")
    (old / "metadata.json.sigstore").write_text("{}")
    new = build_variant(tree, "cpu", out, unique_id="stale_new", log=lambda _: None)
    assert new == old
    files = _variant_files(new)
    assert "_window_attention_cpu_stale_new.abi3.so" in files
    assert not {"_window_attention_cpu_stale_old.abi3.so", "leftover.py", "metadata.json.sigstore"} & files
    assert not (new / "__pycache__").exists()
    m = Metadata.read_from_file(str(new / "metadata.json"))
    assert m.id == "_window_attention_cpu_stale_new"
    assert m.provenance is not None and m.provenance.kernel is None  # not a git tree: no kernel commit
    m.digest.validate(Digest.hash_variant(DigestAlgorithm.SHA256, str(new)))


def test_registration_header_and_flags(tree, tmp_path):
    r = build(tree, "cpu", tmp_path / "build", unique_id="flags", log=lambda _: None)
    reg = (r.obj_dir / "registration.h").read_text()
    for macro in (
        "#define TORCH_LIBRARY_EXPAND(NAME, MODULE) TORCH_LIBRARY(NAME, MODULE)",
        "#define TORCH_LIBRARY_IMPL_EXPAND(NAME, DEVICE, MODULE) TORCH_LIBRARY_IMPL(NAME, DEVICE, MODULE)",
        "#define STABLE_TORCH_LIBRARY_EXPAND(NAME, MODULE) STABLE_TORCH_LIBRARY(NAME, MODULE)",
        "#define STABLE_TORCH_LIBRARY_IMPL_EXPAND(NAME, DEVICE, MODULE) STABLE_TORCH_LIBRARY_IMPL(NAME, DEVICE, MODULE)",
        "#define REGISTER_EXTENSION(NAME)",
        "#define Py_LIMITED_API 0x03090000",
    ):
        assert macro in reg
    assert "ATen" not in reg.replace("no ATen", "")
    ninja = (r.obj_dir / "build.ninja").read_text()
    for flag in ("-O3", "-std=c++17", "-fPIC", "-fno-gnu-unique", "-fvisibility=hidden", "-DCPU_KERNEL",
                 "-DTORCH_TARGET_VERSION=0x020a000000000000", "-DPy_LIMITED_API=0x03090000",
                 "-DTORCH_EXTENSION_NAME=_window_attention_cpu_flags", "-ltorch", "-ltorch_cpu", "-lc10"):
        assert flag in ninja, flag
    assert "-fopenmp" not in ninja and "rpath" not in ninja


def test_torch_target_version_matches_torch_headers():
    from winattn._build.toolchain import torch_target_version

    header = Path(torch.__file__).parent / "include" / "torch" / "csrc" / "stable" / "version.h"
    assert "#define TORCH_VERSION_2_10_0 (((0ULL + 2) << 56) | ((0ULL + 10) << 48))" in header.read_text()
    assert torch_target_version("2.10") == "0x020a000000000000" == f"0x{(2 << 56) | (10 << 48):016x}"


def test_compiler_error_is_a_build_error(tree, tmp_path):
    bad = make_tree(tmp_path / "bad")
    (bad / "kernel-src" / "cpu" / "winattn_cpu.cpp").write_text(NAIVE_CPU.replace("return 0; }", "return 0 }", 1))
    with pytest.raises(BuildError, match=r"compilation failed(.|\n)*winattn_cpu\.cpp"):
        build_variant(bad, "cpu", tmp_path / "build", unique_id="bad", log=lambda _: None)


def test_missing_backend_symbol_is_a_build_error(tmp_path):
    bad = make_tree(tmp_path / "nobwd")
    (bad / "kernel-src" / "cpu" / "winattn_cpu.cpp").write_text(
        NAIVE_CPU.replace("void bwd(const BwdParams&, void*, void*) {}", "")
    )
    with pytest.raises(BuildError, match=r"undefined symbols.*winattn::bwd"):
        build_variant(bad, "cpu", tmp_path / "build", unique_id="nobwd", log=lambda _: None)


# build.toml errors: each names the key or file (no compiler runs)


@pytest.fixture
def toml_tree(tmp_path) -> Path:
    return make_tree(tmp_path / "cfg")


@pytest.mark.parametrize(
    "old, new, pattern",
    [
        ("backends = ", "backendz = ", r"build\.toml.*backendz"),
        ("edition = 5", "edition = 6", r"build\.toml.*edition 6"),
        ('stable-abi = "2.10"', "", r"stable-abi"),
        ('"kernel-src/cpu/winattn_cpu.cpp"', '"kernel-src/cpu/missing.cpp"',
         r"\[kernel\.window_attention_cpu\] src: kernel-src/cpu/missing\.cpp does not exist"),
        ('include = ["kernel-src"]\n', 'include = ["no-such-dir"]\n', r"\[torch\] include: no-such-dir does not exist"),
        ('depends = ["torch"]', 'depends = ["torch", "cutlass_4_0"]', r"depends: 'cutlass_4_0'"),
        ('backends = ["cpu", "cuda"]', 'backends = ["cuda"]', r"backends.*does not list 'cpu'"),
    ],
)
def test_bad_build_toml(toml_tree, tmp_path, old, new, pattern):
    _edit_toml(toml_tree, old, new)
    with pytest.raises(BuildError, match=pattern):
        build_variant(toml_tree, "cpu", tmp_path / "build", log=lambda _: None)


def test_missing_torch_source_and_build_toml(toml_tree, tmp_path):
    (toml_tree / "torch-ext" / "torch_binding.h").unlink()
    with pytest.raises(BuildError, match=r"\[torch\] src: torch-ext/torch_binding\.h does not exist"):
        build_variant(toml_tree, "cpu", tmp_path / "build", log=lambda _: None)
    with pytest.raises(BuildError, match=r"build\.toml: not found"):
        build_variant(tmp_path / "empty", "cpu", tmp_path / "build", log=lambda _: None)


def test_cli(tree, tmp_path, capsys):
    from winattn.cli import main

    rc = main(["build", "--backend", "cpu", "--repo-root", str(tree), "--build-dir", str(tmp_path / "b"),
               "--unique-id", "cli"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "[build] cpu: done in" in out and CPU_VARIANT in out
    assert (tmp_path / "b" / CPU_VARIANT / "_window_attention_cpu_cli.abi3.so").is_file()
    rc = main(["build", "--backend", "cpu", "--repo-root", str(tmp_path), "--build-dir", str(tmp_path / "b")])
    assert rc == 1
    assert "winattn build: error:" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# CUDA: compile only (nvcc runs without a GPU)


def test_cuda_arch_selection():
    from winattn._build.toolchain import CudaToolkit, gencode_flags, select_cuda_archs

    tk = CudaToolkit(nvcc="nvcc", version=(13, 0), home=Path("/usr/local/cuda"), gpu_archs=["75", "80", "86", "90", "100"])
    assert select_cuda_archs(["7.0", "8.0", "9.0a", "12.0+PTX"], tk, "k") == ["8.0", "9.0a"]
    with pytest.raises(BuildError, match="none is supported"):
        select_cuda_archs(["5.0", "6.1"], tk, "--cuda-archs")
    with pytest.raises(BuildError, match="not a CUDA capability"):
        select_cuda_archs(["sm_90"], tk, "--cuda-archs")
    assert gencode_flags(["9.0a", "10.0+PTX"]) == [
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_100,code=sm_100",
        "-gencode=arch=compute_100,code=compute_100",
    ]


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not installed")
def test_cuda_variant_compiles(tree, tmp_path):
    from kernels._rust import Metadata

    from winattn._build.toolchain import find_cuda

    cuda = find_cuda()
    r = build(tree, "cuda", tmp_path / "build", cuda_archs=["8.0"], unique_id="cudatest", log=lambda _: None)
    assert r.variant == f"torch-stable-abi210-{cuda.tag}-{MACHINE}-linux"
    assert r.ops_name == "_window_attention_cuda_cudatest"
    assert r.archs == ["8.0"]
    m = Metadata.read_from_file(str(r.variant_dir / "metadata.json"))
    assert str(m.backend.backend_type) == "cuda" and m.backend.archs == ["8.0"]
    assert r.abi.abi3 == [] and r.abi.exported == ["PyInit__window_attention_cuda_cudatest"]
    ninja = (r.obj_dir / "build.ninja").read_text()
    for flag in ("-gencode=arch=compute_80,code=sm_80", "--threads=1", "--expt-relaxed-constexpr", "-DCUDA_KERNEL"):
        assert flag in ninja
    assert "compute_90" not in ninja  # --cuda-archs replaced build.toml's list
    assert _variant_files(r.variant_dir) == _package_files(tree) | {"_ops.py", f"{r.ops_name}.abi3.so", "metadata.json"}
    with pytest.raises(BuildError, match=r"--cuda-archs.*none is supported"):
        build(tree, "cuda", tmp_path / "build", cuda_archs=["3.0"], unique_id="cudatest", log=lambda _: None)
