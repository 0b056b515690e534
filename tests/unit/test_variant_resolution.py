"""Which variant of the build matrix `kernels` 0.17.2 picks on a given system, through its own resolver.

`kernels.variants._resolve_variant_for_system(variants, selected_backend, cpu, os, torch_version, torch_cxx11_abi,
tvm_ffi_version, macos_version)` is what `get_kernel` / `get_kernel_variants` run after detecting the system
(`resolve_variants`); here it gets synthetic systems, so the H200 (torch 2.11, CUDA 13.0) and a CUDA 12.8 torch are
checked on a CPU-only machine. The variant names are the matrix's (docs/build-matrix.md) plus kernel-builder's cu126,
which the CUDA 12 compiler available here cannot make but whose rule is the same as cu124's.
"""

import pytest
from packaging.version import Version

from kernels.archs import _supports_cuda_capability
from kernels.backends import CPU, CUDA
from kernels.variants import (
    VariantAccepted,
    VariantRejected,
    _resolve_variant_for_system,
    parse_variant,
)

from winattn._build import matrix as _matrix
from winattn._build.toolchain import torch_variant_name, variant_name

ARCH = "x86_64-linux"
CPU_STABLE = f"torch-stable-abi210-cpu-{ARCH}"
CU124 = f"torch-stable-abi210-cu124-{ARCH}"
CU126 = f"torch-stable-abi210-cu126-{ARCH}"  # kernel-builder's name (not buildable here, see the module docstring)
CU130 = f"torch-stable-abi210-cu130-{ARCH}"
CU132 = f"torch-stable-abi210-cu132-{ARCH}"
TORCH213_CPU = f"torch213-cxx11-cpu-{ARCH}"
MATRIX = [CPU_STABLE, CU124, CU130, CU132, TORCH213_CPU]


def resolve(names, *, backend, torch, cpu="x86_64", os="linux", cxx11=True):
    accepted, trace = _resolve_variant_for_system(
        variants=[parse_variant(n) for n in names],
        selected_backend=backend,
        cpu=cpu,
        os=os,
        torch_version=Version(torch) if torch else None,
        torch_cxx11_abi=cxx11 if torch else None,
        tvm_ffi_version=None,
        macos_version=None,
    )
    rejected = {d.variant.variant_str: d.reason for d in trace if isinstance(d, VariantRejected)}
    return [v.variant_str for v in accepted], rejected, trace


def cuda(version: str):
    return CUDA(version=Version(version))


def test_matrix_names_are_what_the_builder_makes():
    for name in MATRIX:
        assert parse_variant(name).variant_str == name
    assert variant_name("2.10", "cu124").endswith("-linux") and variant_name("2.10", "cu124").startswith(
        "torch-stable-abi210-cu124-")
    assert torch_variant_name("2.13", "cpu").startswith("torch213-cxx11-cpu-")
    assert {f"torch-stable-abi210-{t}-{ARCH}" for t in _matrix.DEFAULT_CUDA} == {CU124, CU130, CU132}


def test_h200_torch211_cuda130_picks_cu130_and_rejects_the_rest():
    accepted, rejected, trace = resolve(MATRIX + [CU126], backend=cuda("13.0"), torch="2.11")
    assert accepted == [CU130]
    assert isinstance(trace[0], VariantAccepted) and trace[0].variant.variant_str == CU130
    assert rejected == {
        CU124: "CUDA version (12.4) is not compatible with system CUDA version (13.0)",
        CU126: "CUDA version (12.6) is not compatible with system CUDA version (13.0)",
        CU132: "CUDA version (13.2) is not compatible with system CUDA version (13.0)",
        CPU_STABLE: "backend (cpu) does not match selected backend (cu130)",
        TORCH213_CPU: "Torch version (2.13) does not match environment Torch version (2.11)",
    }


def test_h200_capability_is_in_the_built_archs():
    """metadata.json backend.archs of every CUDA variant (build.toml's 8.0/8.6/8.9/9.0): kernels' arch check passes
    on the H200 (9.0) and fails on a B200 (10.0), whose loads need check_arch=False."""
    archs = ["8.0", "8.6", "8.9", "9.0"]
    assert _supports_cuda_capability(archs, (9, 0))
    assert _supports_cuda_capability(archs, (8, 7))  # same major, newer minor than 8.6
    assert not _supports_cuda_capability(archs, (10, 0))
    assert not _supports_cuda_capability(archs, (7, 5))


@pytest.mark.parametrize("cuda_version", ["12.6", "12.8", "12.9"])
def test_cuda12_torch_loads_the_cuda12_variant_by_the_minor_rule(cuda_version):
    """torch 2.13 + CUDA 12.x: cu124 (built here) and cu126 (kernel-builder's) both qualify, the highest minor first;
    no CUDA 13 variant does."""
    accepted, rejected, _ = resolve(MATRIX + [CU126], backend=cuda(cuda_version), torch="2.13")
    assert accepted == [CU126, CU124]
    assert rejected[CU130] == f"CUDA version (13.0) is not compatible with system CUDA version ({cuda_version})"
    assert rejected[CU132] == f"CUDA version (13.2) is not compatible with system CUDA version ({cuda_version})"
    assert rejected[CPU_STABLE] == f"backend (cpu) does not match selected backend (cu{cuda_version.replace('.', '')})"
    # torch213-cxx11-cpu has the right torch but the wrong backend
    assert rejected[TORCH213_CPU].startswith("backend (cpu) does not match selected backend")


def test_cuda128_torch_with_the_matrix_as_built_takes_cu124():
    accepted, _, _ = resolve(MATRIX, backend=cuda("12.8"), torch="2.13")
    assert accepted == [CU124]


def test_cuda12_older_than_the_variant_is_rejected():
    accepted, rejected, _ = resolve([CU126], backend=cuda("12.4"), torch="2.13")
    assert accepted == []
    assert rejected[CU126] == "CUDA version (12.6) is not compatible with system CUDA version (12.4)"


def test_cuda132_torch_prefers_cu132_then_cu130():
    accepted, rejected, _ = resolve(MATRIX, backend=cuda("13.2"), torch="2.13")
    assert accepted == [CU132, CU130]
    assert rejected[CU124] == "CUDA version (12.4) is not compatible with system CUDA version (13.2)"


def test_cpu_only_torch213_takes_stable_then_per_torch_cpu():
    accepted, rejected, _ = resolve(MATRIX, backend=CPU(), torch="2.13")
    assert accepted == [CPU_STABLE, TORCH213_CPU]  # stable ABI sorts before per-torch variants
    for name in (CU124, CU130, CU132):
        tag = name.split("-")[3]
        assert rejected[name] == f"backend ({tag}) does not match selected backend (cpu)"


def test_cpu_only_other_torch_versions():
    accepted, rejected, _ = resolve(MATRIX, backend=CPU(), torch="2.12")
    assert accepted == [CPU_STABLE]
    assert rejected[TORCH213_CPU] == "Torch version (2.13) does not match environment Torch version (2.12)"
    accepted, rejected, _ = resolve(MATRIX, backend=CPU(), torch="2.9")
    assert accepted == []
    assert rejected[CPU_STABLE] == "Torch stable ABI version (2.10) is too new for environment Torch version (2.9)"


def test_other_platforms_reject_everything():
    _, rejected, _ = resolve(MATRIX, backend=cuda("13.0"), torch="2.11", cpu="aarch64")
    assert rejected[CU130] == "CPU (x86_64) does not match system CPU (aarch64)"
    _, rejected, _ = resolve(MATRIX, backend=CPU(), torch="2.13", os="darwin")
    assert rejected[CPU_STABLE] == "OS (linux) does not match system OS (darwin)"
