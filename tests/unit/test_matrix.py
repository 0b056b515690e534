"""`winattn build --matrix` (winattn/_build/matrix.py): plan, capabilities per toolkit, manylinux compat unit,
per-torch variants, fatbinary check, toolchain provisioning, and the whole matrix published in one commit.

Everything here runs on the throwaway kernel tree of test_build.py (naive backends, seconds to compile) and needs no
network: toolchains are faked or the system nvcc is used. Tests that use a provisioned toolchain cache
(~/.cache/winattn/toolchains, made by `make matrix`) skip when it is absent, as on a fresh CI machine. One unit of
each family of the real kernel sources is compiled for one arch by `test_real_cuda_sources_compile_for_one_arch`.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from winattn._build import matrix as _matrix
from winattn._build import toolchain as _tc
from winattn._build.config import load_config
from winattn.build import _check_fatbin, build, compile_sources, kernel_cuda_caps
from winattn.errors import BuildError

from .ci_cuda_units import CI_CUDA_UNITS, compile_units, early_compile
from .test_build import MACHINE, REPO_ROOT, make_tree

HAS_NVCC = _tc.find_cuda(required=False) is not None
ARCH = f"{MACHINE}-linux"
CPU_STABLE = f"torch-stable-abi210-cpu-{ARCH}"


def quiet(_line):
    pass


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return make_tree(tmp_path_factory.mktemp("mtree") / "window-attention")


# ---------------------------------------------------------------------------------------------------------------
# Plan and names


def test_plan_orders_cpu_cuda_then_per_torch():
    entries = _matrix.plan(["cpu", "cuda"], ["cu124", "cu130"], ["2.12", "2.13"])
    assert [(e.backend, e.toolchain, e.torch_version) for e in entries] == [
        ("cpu", "", None), ("cuda", "cu124", None), ("cuda", "cu130", None), ("cpu", "", "2.12"), ("cpu", "", "2.13"),
    ]
    assert [e.label for e in entries] == ["cpu", "cu124", "cu130", "cpu, torch 2.12", "cpu, torch 2.13"]
    assert _matrix.plan(["cpu"], ["cu124"], []) == [_matrix.MatrixEntry("cpu")]
    with pytest.raises(BuildError, match="--cuda cu999: unknown toolkit"):
        _matrix.plan(["cuda"], ["cu999"], [])
    with pytest.raises(BuildError, match="--torch 2: expected a major.minor"):
        _matrix.plan(["cpu"], [], ["2"])


def test_variant_names(tree):
    cfg = load_config(tree)
    tk = _tc.CudaToolkit(nvcc="nvcc", version=(12, 4), home=Path("/x"), gpu_archs=["80", "90"])
    assert _matrix.variant_for(cfg, _matrix.MatrixEntry("cpu"), None) == CPU_STABLE
    assert _matrix.variant_for(cfg, _matrix.MatrixEntry("cuda", "cu124"), tk) == f"torch-stable-abi210-cu124-{ARCH}"
    assert _matrix.variant_for(cfg, _matrix.MatrixEntry("cpu", torch_version="2.13"), None) == f"torch213-cxx11-cpu-{ARCH}"
    assert _tc.torch_variant_name("2.12", "cu126") == f"torch212-cxx11-cu126-{ARCH}"


def test_cli_matrix_options_need_matrix(tree, tmp_path, capsys):
    from winattn.cli import main

    assert main(["build", "--repo-root", str(tree), "--build-dir", str(tmp_path), "--torch", "2.13"]) == 1
    assert "--torch, --cuda, --clean and --no-stable go with --matrix" in capsys.readouterr().err
    assert main(["build", "--matrix", "--no-stable", "--repo-root", str(tree), "--build-dir", str(tmp_path)]) == 1
    assert "--matrix: nothing to build" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_toolchain_specs_are_pinned_and_consistent():
    for name, spec in _matrix.TOOLCHAINS.items():
        assert spec.name == name == f"cu{spec.version[0]}{spec.version[1]}"
        assert all("==" in req for req in spec.pip), spec.pip  # exact pins: reproducible toolkits
        assert any(req.startswith("nvidia-cuda-cuobjdump==") for req in spec.pip)  # the fatbinary check needs it
        assert all("=" in deb for deb in spec.debs)
    cu124 = _matrix.TOOLCHAINS["cu124"]
    assert cu124.source == "debian+pypi" and "trixie non-free" in cu124.apt_source
    assert {r.split("==")[1].rsplit(".", 1)[0].startswith("12.4") for r in cu124.pip if "cu12" in r} == {True}
    assert set(_matrix.DEFAULT_CUDA) <= set(_matrix.TOOLCHAINS)


# ---------------------------------------------------------------------------------------------------------------
# Capabilities per toolkit: build.toml's cuda-capabilities loosely intersected with kernel-builder's defaults


def _toolkit(version, archs):
    return _tc.CudaToolkit(nvcc="nvcc", version=version, home=Path("/x"), gpu_archs=archs)


ALL_ARCHS = ["50", "60", "70", "72", "75", "80", "86", "87", "89", "90", "100", "101", "103", "110", "120", "121"]


@pytest.mark.parametrize(
    "version, requested, expected",
    [
        ((12, 4), ["8.0", "8.6", "8.9", "9.0"], ["8.0", "8.6", "8.9", "9.0"]),  # build.toml as it is
        ((13, 0), ["8.0", "8.6", "8.9", "9.0"], ["8.0", "8.6", "8.9", "9.0"]),
        ((12, 4), ["8.0", "9.0a", "10.0", "12.0"], ["8.0", "9.0a"]),  # < 12.8: up to 9.0
        ((12, 8), ["8.0", "9.0a", "10.0", "12.0"], ["8.0", "9.0a", "10.0", "12.0"]),  # 12.8 adds 10.0, 12.0
        ((13, 2), ["7.0", "10.1", "11.0", "12.1+PTX"], ["11.0", "12.1+PTX"]),  # 13.0 drops 7.0, 10.1 -> 11.0
        ((12, 6), ["9.0+PTX"], ["9.0+PTX"]),
    ],
)
def test_capabilities_per_toolkit(version, requested, expected):
    spec = load_config(REPO_ROOT).kernels_for("cuda")[0]
    spec = type(spec)(**{**spec.__dict__, "cuda_capabilities": requested})
    assert kernel_cuda_caps(spec, _toolkit(version, ALL_ARCHS)) == expected


def test_capabilities_defaults_override_and_errors():
    spec = load_config(REPO_ROOT).kernels_for("cuda")[0]
    none = type(spec)(**{**spec.__dict__, "cuda_capabilities": None})
    assert kernel_cuda_caps(none, _toolkit((12, 4), ALL_ARCHS))[-1] == "9.0+PTX"  # kernel-builder's < 12.8 list
    assert kernel_cuda_caps(none, _toolkit((13, 0), ALL_ARCHS))[0] == "7.5"
    assert kernel_cuda_caps(spec, _toolkit((12, 4), ALL_ARCHS), ["10.0"]) == ["10.0"]  # --cuda-archs as given
    sm90 = type(spec)(**{**spec.__dict__, "cuda_capabilities": ["9.0a"]})
    assert kernel_cuda_caps(sm90, _toolkit((13, 0), ALL_ARCHS), ["8.0", "9.0"]) == ["9.0a"]  # keeps its 9.0a
    assert kernel_cuda_caps(sm90, _toolkit((13, 0), ALL_ARCHS), ["8.0"]) == ["8.0"]  # no 9.x asked: stubs
    only_new = type(spec)(**{**spec.__dict__, "cuda_capabilities": ["12.0"]})
    with pytest.raises(BuildError, match=r"cuda-capabilities = \['12.0'\]: none is among nvcc 12.4"):
        kernel_cuda_caps(only_new, _toolkit((12, 4), ALL_ARCHS))
    assert _tc.loose_intersection(["9.0a", "10.0f", "8.0"], ["8.0", "9.0", "10.0+PTX"]) == ["9.0a", "10.0f", "8.0"]


# ---------------------------------------------------------------------------------------------------------------
# Fatbinary check (cuobjdump)


def _fake_cuobjdump(tmp_path: Path, elf: list[str], ptx: list[str]) -> str:
    lines_elf = "\n".join(f"ELF file    {i}: x.abi3.{i}.sm_{a}.cubin" for i, a in enumerate(elf, 1))
    lines_ptx = "\n".join(f"PTX file    {i}: x.abi3.{i}.sm_{a}.ptx" for i, a in enumerate(ptx, 1))
    script = tmp_path / "cuobjdump"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  --list-elf) cat <<'EOF'\n{lines_elf}\nEOF\n  ;;\n"
        + (f"  --list-ptx) cat <<'EOF'\n{lines_ptx}\nEOF\n  ;;\n" if ptx else
           "  --list-ptx) echo \"cuobjdump info    : No PTX file found to extract from '$2'.\" >&2 ;;\n")
        + "esac\n"
    )
    script.chmod(0o755)
    return str(script)


def test_fatbin_parse_and_expected(tmp_path):
    c = _fake_cuobjdump(tmp_path, ["80", "90a", "86"], ["90a"])
    assert _tc.fatbin_archs(tmp_path / "x.so", c) == (["80", "86", "90a"], ["90a"])
    assert _tc.expected_fatbin(["8.0", "8.6", "9.0a+PTX"]) == (["80", "86", "90a"], ["90a"])
    assert _tc.expected_fatbin(["10.0", "9.0"]) == (["90", "100"], [])


def test_fatbin_mismatch_is_a_build_error(tmp_path):
    tk = _toolkit((13, 0), ALL_ARCHS)
    tk.cuobjdump = _fake_cuobjdump(tmp_path, ["80", "90"], [])
    assert _check_fatbin(tmp_path / "x.so", tk, ["8.0", "9.0"], True, quiet) == (["80", "90"], [])
    with pytest.raises(BuildError, match=r"holds SASS \['80', '90'\] and PTX none, but backend.archs \['8.0', '8.6', '9.0'\]"):
        _check_fatbin(tmp_path / "x.so", tk, ["8.0", "8.6", "9.0"], True, quiet)
    tk.cuobjdump = None
    assert _check_fatbin(tmp_path / "x.so", tk, ["8.0"], False, quiet) is None
    with pytest.raises(BuildError, match="cuobjdump not found"):
        _check_fatbin(tmp_path / "x.so", tk, ["8.0"], True, quiet)


# ---------------------------------------------------------------------------------------------------------------
# manylinux_2_28 and per-torch variants on the throwaway tree


def test_manylinux_compat_unit_makes_the_host_build_clean(tree, tmp_path, monkeypatch):
    r = build(tree, "cpu", tmp_path / "b", unique_id="mlcompat", obj_dir=tmp_path / "o1", log=quiet, strict=True)
    assert r.abi.manylinux == [] and r.abi.abi3 == []
    assert r.abi.exported == ["PyInit__window_attention_cpu_mlcompat"]  # the compat symbols stay local
    assert "COMPAT" in (tmp_path / "o1" / "build.ninja").read_text()
    assert r.compiled and all("manylinux_compat" not in c for c in r.compiled)
    monkeypatch.setenv("WINATTN_MANYLINUX_COMPAT", "0")
    plain = build(tree, "cpu", tmp_path / "b2", unique_id="mlplain", obj_dir=tmp_path / "o2", log=quiet)
    if not plain.abi.manylinux:
        pytest.skip("this host toolchain is manylinux_2_28-clean without the compat unit")
    assert any("GLIBCXX_3.4.26" in s or "GLIBC_2.3" in s for s in plain.abi.manylinux), plain.abi.manylinux
    with pytest.raises(BuildError, match=r"not manylinux_2_28-clean \(\d+ symbols\)"):
        build(tree, "cpu", tmp_path / "b2", unique_id="mlplain", obj_dir=tmp_path / "o2", log=quiet, strict=True)


def test_per_torch_variant_uses_that_torchs_headers_without_target_version(tree, tmp_path, monkeypatch):
    import torch
    from kernels import get_local_kernel

    here = _tc.torch_paths()
    assert here.version == torch.__version__
    version = ".".join(torch.__version__.split(".")[:2])
    assert _matrix.torch_for(version, tmp_path / "cache", quiet) is here  # same version: no throwaway venv
    r = build(tree, "cpu", tmp_path / "b", unique_id="pertorch", obj_dir=tmp_path / "o", log=quiet,
              torch=here, torch_version=version, strict=True)
    assert r.variant == _tc.torch_variant_name(version, "cpu")
    ninja = (tmp_path / "o" / "build.ninja").read_text()
    assert "TORCH_TARGET_VERSION" not in ninja and f"-I{here.include_dirs[0]}" in ninja
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    k = get_local_kernel(tmp_path / "b")  # the loader accepts torch<M><m>-cxx11-cpu on this torch
    assert k.__name__ == "_window_attention_cpu_pertorch"
    q = torch.randn(1, 5, 2, 8)
    torch.testing.assert_close(k.attention(q, q, q), k.reference.attention(q, q, q), atol=1e-4, rtol=1e-4)


def test_torch_paths_at_reads_version_without_importing(tmp_path):
    here = _tc.torch_paths()
    fake = tmp_path / "torch"
    shutil.copytree(here.include_dirs[0] / "torch" / "csrc" / "stable", fake / "include" / "torch" / "csrc" / "stable")
    (fake / "lib").mkdir()
    (fake / "lib" / "libtorch_cpu.so").write_bytes(b"")
    (fake / "version.py").write_text("__version__ = '2.12.1+cu126'\ngit_version = 'x'\n")
    p = _tc.torch_paths_at(fake)
    assert p.version == "2.12.1+cu126" and p.lib_dir == fake / "lib"
    (fake / "lib" / "libtorch_cpu.so").unlink()
    with pytest.raises(BuildError, match="libtorch_cpu.so not found"):
        _tc.torch_paths_at(fake)


# ---------------------------------------------------------------------------------------------------------------
# Toolchain provisioning (no network: faked .deb / wheels, or the system nvcc)


def _fake_debian_toolkit(tmp_path: Path) -> tuple[Path, Path]:
    """A .deb laid out like Debian's nvidia-cuda-toolkit and a site-packages like the PyPI cu12 wheels."""
    pkg = tmp_path / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text(
        "Package: nvidia-cuda-toolkit\nVersion: 12.4.131~12.4.1-2\nArchitecture: amd64\n"
        "Maintainer: test <t@example.org>\nDescription: fake\n")
    tk = pkg / "usr" / "lib" / "nvidia-cuda-toolkit"
    for rel in ("usr/lib/nvidia-cuda-toolkit/bin/nvcc", "usr/lib/nvidia-cuda-toolkit/bin/cicc", "usr/bin/ptxas",
                "usr/bin/fatbinary", "usr/bin/cudafe++", "usr/bin/nvlink", "usr/bin/nvcc"):
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(f"#!/bin/sh\necho {rel}\n")
        (pkg / rel).chmod(0o755)
    (tk / "bin" / "crt").mkdir()
    (tk / "bin" / "crt" / "link.stub").write_text("stub\n")
    (tk / "libdevice").mkdir()
    (tk / "libdevice" / "libdevice.10.bc").write_bytes(b"BC")
    deb = tmp_path / "nvidia-cuda-toolkit_12.4.131_amd64.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(pkg), str(deb)], check=True, capture_output=True)
    site = tmp_path / "site"
    for rel in ("cuda_runtime/include/cuda_runtime.h", "cuda_runtime/include/__init__.py",
                "cuda_nvcc/include/crt/host_config.h", "cuda_cccl/include/cub/cub.cuh",
                "cuda_nvcc/nvvm/lib64/libnvvm.so", "cuda_runtime/lib/libcudart.so.12"):
        (site / "nvidia" / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / "nvidia" / rel).write_text("x\n")
    return deb, site


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb not installed")
def test_assemble_debian_toolkit_makes_a_standard_cuda_home(tmp_path):
    deb, site = _fake_debian_toolkit(tmp_path)
    home = tmp_path / "cuda"
    _matrix.assemble_debian_toolkit(_matrix.TOOLCHAINS["cu124"], [deb], site, home)
    assert (home / "bin" / "nvcc").read_text().endswith("usr/lib/nvidia-cuda-toolkit/bin/nvcc\n")  # not the wrapper
    assert not (home / "bin" / "nvcc").is_symlink() and os.access(home / "bin" / "nvcc", os.X_OK)
    assert "$(TOP)/nvvm/libdevice" in (home / "bin" / "nvcc.profile").read_text()
    for rel in ("bin/ptxas", "bin/fatbinary", "bin/crt/link.stub", "nvvm/bin/cicc", "nvvm/libdevice/libdevice.10.bc",
                "nvvm/lib64/libnvvm.so", "include/cuda_runtime.h", "include/crt/host_config.h", "include/cub/cub.cuh",
                "lib64/libcudart.so.12"):
        assert (home / rel).is_file(), rel
    assert os.readlink(home / "lib64" / "libcudart.so") == "libcudart.so.12"
    assert not (home / "include" / "__init__.py").exists()
    tk = _tc.CudaToolkit(nvcc=str(home / "bin" / "nvcc"), version=(12, 4), home=home, gpu_archs=["80"])
    assert tk.lib_dir == home / "lib64" and tk.include_dirs == [home / "include"]


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not installed")
def test_system_toolchain_is_provisioned_once_and_cached(tmp_path):
    system = _tc.find_cuda()
    spec = _matrix.ToolchainSpec(name=system.tag, version=system.version, source="system", note="test")
    lines = []
    tk = _matrix.ensure_toolchain(spec, tmp_path, lines.append)
    assert tk.version == system.version and tk.source == "system"
    assert any("provisioning" in line for line in lines) and any("ready in" in line for line in lines)
    info = json.loads((tmp_path / system.tag / "toolchain.json").read_text())
    assert info["spec"] == spec.digest() and info["nvcc"] == system.nvcc
    lines.clear()
    again = _matrix.ensure_toolchain(spec, tmp_path, lines.append)
    assert lines == [] and again.nvcc == tk.nvcc  # cached: nothing downloaded or compiled
    wrong = _matrix.ToolchainSpec(name="cu999", version=(9, 9), source="system")
    with pytest.raises(_matrix.ToolchainUnavailable, match="not 9.9"):
        _matrix.ensure_toolchain(wrong, tmp_path, quiet)


def test_unavailable_toolchain_is_skipped_and_failures_reported(tree, tmp_path, monkeypatch):
    def unavailable(spec, root=None, log=print):
        raise _matrix.ToolchainUnavailable(f"{spec.name}: not on this machine")

    monkeypatch.setattr(_matrix, "ensure_toolchain", unavailable)
    entries = _matrix.plan(["cpu", "cuda"], ["cu124"], [])
    lines = []
    rows = _matrix.run_matrix(tree, tmp_path / "b", entries, unique_id="skipped", obj_root=tmp_path / "o",
                              log=lines.append)
    assert [(r.variant, r.status) for r in rows] == [(CPU_STABLE, "ok"), ("", "skipped")]
    assert rows[0].abi3 == rows[0].manylinux == "pass" and rows[0].size > 0
    assert (tmp_path / "o" / CPU_STABLE / "build.ninja").is_file()  # its own object dir
    assert any(line.startswith("[matrix] (1/2) cpu: start") for line in lines)
    assert any(line.startswith(f"[matrix] (1/2) cpu: {CPU_STABLE}: ok in ") for line in lines)
    table = _matrix.summary_table(rows)
    assert f"| {CPU_STABLE} | g++" in table and "| (cu124) | - | skipped |" in table
    assert "cu124: skipped: cu124: not on this machine" in table


def test_failed_variant_is_reported_and_its_old_build_removed(tmp_path):
    from .test_build import NAIVE_CPU

    bad = make_tree(tmp_path / "bad")
    (bad / "kernel-src" / "cpu" / "winattn_cpu.cpp").write_text(NAIVE_CPU.replace("return 0; }", "return 0 }", 1))
    old = tmp_path / "b" / CPU_STABLE
    old.mkdir(parents=True)
    (old / "metadata.json").write_text("{}")
    rows = _matrix.run_matrix(bad, tmp_path / "b", _matrix.plan(["cpu"], [], []), unique_id="bad",
                              obj_root=tmp_path / "o", log=quiet)
    assert [(r.variant, r.status) for r in rows] == [(CPU_STABLE, "FAILED")]
    assert "compilation failed" in rows[0].reason and "winattn_cpu.cpp" in rows[0].reason
    assert not old.exists() and "removed the previous" in rows[0].reason


# ---------------------------------------------------------------------------------------------------------------
# The CLI and the provisioned toolchains (skip when `make matrix` has not provisioned them on this machine)


def _cached(name: str) -> bool:
    return (_matrix.cache_root() / name / "toolchain.json").is_file()


@pytest.mark.skipif(not all(_cached(n) for n in _matrix.DEFAULT_CUDA),
                    reason="toolchains not provisioned (run `make matrix` once)")
def test_matrix_cli_on_the_throwaway_tree(tree, tmp_path, capsys):
    from winattn.cli import main

    out_dir = tmp_path / "build"
    (out_dir / "torch-stable-abi210-cu999-x86_64-linux").mkdir(parents=True)  # a stale variant: --clean removes it
    rc = main(["build", "--matrix", "--repo-root", str(tree), "--build-dir", str(out_dir), "--unique-id", "mxcli",
               "--cuda-archs", "8.0", "9.0", "--torch", "2.13", "--clean"])
    out = capsys.readouterr().out
    assert rc == 0, out
    names = sorted(d.name for d in out_dir.iterdir())
    assert names == sorted([CPU_STABLE, f"torch213-cxx11-cpu-{ARCH}"]
                           + [f"torch-stable-abi210-{t}-{ARCH}" for t in _matrix.DEFAULT_CUDA])
    for t in _matrix.DEFAULT_CUDA:
        meta = json.loads((out_dir / f"torch-stable-abi210-{t}-{ARCH}" / "metadata.json").read_text())
        assert meta["backend"] == {"type": "cuda", "archs": ["8.0", "9.0"]}
        assert f"| 8.0, 9.0 = sm_80 sm_90 |" in out
    assert "--clean: removed torch-stable-abi210-cu999-x86_64-linux" in out
    assert "| variant | toolchain | status | seconds | size | abi3 (3.9) | manylinux_2_28 |" in out
    assert out.count("| ok |") == len(_matrix.DEFAULT_CUDA) + 2
    rows = json.loads((tree / "_build_obj" / "matrix" / "matrix.json").read_text())
    assert (tree / "_build_obj" / "matrix" / CPU_STABLE / "build.ninja").is_file()
    assert {r["status"] for r in rows} == {"ok"}


# ---------------------------------------------------------------------------------------------------------------
# CI: the real CUDA sources compile (one arch; the units and why: ci_cuda_units.py)


def test_compile_sources_compiles_only_what_it_is_given(tree, tmp_path):
    """compile_sources (CI's CUDA check below) compiles the named units with the build's flags and nothing else;
    a source build.toml does not compile is an error, not a silent no-op."""
    obj = tmp_path / "obj"
    assert compile_sources(tree, "cpu", ["kernel-src/cpu/winattn_cpu.cpp"], obj_dir=obj, log=quiet) == [
        "kernel-src/cpu/winattn_cpu.cpp"]
    assert (obj / "obj" / "kernel-src" / "cpu" / "winattn_cpu.cpp.o").is_file()
    assert not list(obj.glob("*.so")) and not list(obj.glob("obj/torch-ext/*.o"))  # no link, no binding
    with pytest.raises(BuildError, match=r"not a compiled source of the cpu variant in build.toml: kernel-src/x\.h"):
        compile_sources(tree, "cpu", ["kernel-src/x.h"], obj_dir=obj, log=quiet)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not installed")
def test_real_cuda_sources_compile_for_one_arch(request, tmp_path):
    """CI's CUDA check: one unit of each kernel family (CI_CUDA_UNITS) compiled for sm_90 by the system nvcc with
    the flags of a real build, into a fresh object dir (docs/build-matrix.md "CI"). The compile was started in the
    background when this test was collected (tests/conftest.py, ci_cuda_units.py); run alone, it compiles here. The
    link, ABI and fatbinary checks of a whole variant are the throwaway-tree tests here, and every GPU session's
    full build."""
    cfg = load_config(REPO_ROOT)
    listed = set(cfg.torch_src) | {s for k in cfg.kernels_for("cuda") for s in k.src}
    assert set(CI_CUDA_UNITS) <= listed, "a CI unit was renamed or dropped from build.toml: pick its successor"
    families = {re.sub(r"_hdim\d+", "", Path(s).stem) for k in cfg.kernels_for("cuda") for s in k.src
                if s.endswith(".cu")}
    covered = {re.sub(r"_hdim\d+", "", Path(s).stem) for s in CI_CUDA_UNITS}
    assert families <= covered, f"kernel families CI does not compile: {sorted(families - covered)}"

    early = early_compile(request.config)  # (obj dir, process) started by tests/conftest.py
    if early is not None:
        obj_root, proc = early
        rc = proc.wait()
        log = (obj_root / "compile.log").read_text(errors="replace")
        assert rc == 0, f"CI's CUDA units did not compile (exit {rc}):\n{log[-6000:]}"
        assert sorted(json.loads((obj_root / "compiled.json").read_text())) == sorted(CI_CUDA_UNITS)
    else:
        obj_root = tmp_path / "obj"
        assert sorted(compile_units(obj_root, log=quiet)) == sorted(CI_CUDA_UNITS)
    cuda = _tc.find_cuda()
    if cuda.cuobjdump:  # the sm90 kernels keep their arch-specific 9.0a, the others are plain sm_90
        obj = obj_root / "obj" / "kernel-src" / "cuda" / "instantiations"
        assert _tc.fatbin_archs(obj / "fwd_v3_sm90_hdim64.cu.o", cuda.cuobjdump) == (["90a"], [])
        assert _tc.fatbin_archs(obj / "fwd_hdim64.cu.o", cuda.cuobjdump) == (["90"], [])


# ---------------------------------------------------------------------------------------------------------------
# The matrix publishes in one commit, and kernels resolves it per system


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An embedded HubServer (org `winattn` trusted) with huggingface_hub and kernels pointed at it, as in
    tests/publish/conftest.py."""
    from publish.conftest import TOKEN, point_clients_at

    from winattn.hub import HubServer

    with HubServer(tmp_path / "hub-store", tokens=[TOKEN], trusted_orgs=["winattn"]) as server:
        point_clients_at(server.url, tmp_path / "hf-home", monkeypatch)
        server.token = TOKEN
        yield server


def _as_cuda_variant(cpu_variant: Path, dest: Path, archs: list[str]) -> Path:
    """A copy of a built variant whose metadata says cuda/archs (digest recomputed): publish's checks and the loader's
    resolution look at names, metadata and digests, not at what the .so was compiled for."""
    from kernels._rust import Digest, DigestAlgorithm

    shutil.copytree(cpu_variant, dest)
    meta = json.loads((dest / "metadata.json").read_text())
    meta["backend"] = {"type": "cuda", "archs": archs}
    meta["digest"] = {"algorithm": "sha256",
                      "files": dict(sorted(Digest.hash_variant(DigestAlgorithm.SHA256, str(dest)).files.items()))}
    (dest / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n")
    return dest


def test_matrix_publishes_in_one_commit_and_resolves_per_system(tree, tmp_path, hub, monkeypatch):
    import torch
    from huggingface_hub import HfApi
    from kernels import VariantAccepted, VariantRejected, get_kernel, get_kernel_variants
    from kernels.backends import CUDA
    from kernels.variants import _resolve_variant_for_system, get_variants
    from packaging.version import Version

    from winattn.publish import publish

    build_dir = tmp_path / "build"
    version = ".".join(torch.__version__.split(".")[:2])
    rows = _matrix.run_matrix(tree, build_dir, _matrix.plan(["cpu"], [], [version]), unique_id="pubmx",
                              obj_root=tmp_path / "obj", log=quiet)
    assert [r.status for r in rows] == ["ok", "ok"]
    cuda_names = [f"torch-stable-abi210-{t}-{ARCH}" for t in ("cu124", "cu130", "cu132")]
    for name in cuda_names:
        _as_cuda_variant(build_dir / CPU_STABLE, build_dir / name, ["8.0", "8.6", "8.9", "9.0"])
    variants = sorted(d.name for d in build_dir.iterdir())
    assert len(variants) == 5

    src = tmp_path / "src"
    (src / "benchmarks").mkdir(parents=True)
    shutil.copy(tree / "build.toml", src / "build.toml")
    shutil.copy(REPO_ROOT / "CARD.md", src / "CARD.md")
    repo = "winattn/window-attention"
    sha = publish(repo, build_dir=build_dir, endpoint=hub.url, token=hub.token, repo_root=src)

    api = HfApi(endpoint=hub.url, token=hub.token)
    commits = api.list_repo_commits(repo, repo_type="kernel", revision="v1")
    assert commits[0].commit_id == sha
    assert all(v in commits[0].title for v in variants)
    files = api.list_repo_files(repo, repo_type="kernel", revision=sha)
    before = api.list_repo_files(repo, repo_type="kernel", revision=commits[1].commit_id)
    for v in variants:  # every variant arrived with that one commit
        assert f"build/{v}/metadata.json" in files and f"build/{v}/__init__.py" in files
        assert not any(f.startswith(f"build/{v}/") for f in before)

    # The Hub listing, resolved by kernels for the H200 (torch 2.11, CUDA 13.0): cu130, the others rejected.
    listed = get_variants(api, repo_id=repo, revision="v1")
    assert sorted(v.variant_str for v in listed) == variants
    accepted, trace = _resolve_variant_for_system(listed, CUDA(version=Version("13.0")), "x86_64", "linux",
                                                  Version("2.11"), True, None)
    assert [v.variant_str for v in accepted] == [f"torch-stable-abi210-cu130-{ARCH}"]
    assert len([d for d in trace if isinstance(d, VariantRejected)]) == 4

    # This machine (CPU torch): the stable CPU variant first, the per-torch one second; get_kernel loads the first.
    decisions = get_kernel_variants(repo, version=1)
    assert [d.variant.variant_str for d in decisions if isinstance(d, VariantAccepted)] == [
        CPU_STABLE, f"torch{version.replace('.', '')}-cxx11-cpu-{ARCH}"]
    reasons = {d.variant.variant_str: d.reason for d in decisions if isinstance(d, VariantRejected)}
    assert reasons == {n: f"backend ({n.split('-')[3]}) does not match selected backend (cpu)" for n in cuda_names}
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    k = get_kernel(repo, version=1)
    assert k.__name__ == "_window_attention_cpu_pubmx" and Path(k.__file__).parent.name == CPU_STABLE
    q = torch.randn(1, 6, 2, 8)
    torch.testing.assert_close(k.attention(q, q, q), k.reference.attention(q, q, q), atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------------------------
# flake.lock (docs/build-matrix.md "Nix"): none can be made here; once one is committed, it must pin the builder


def test_flake_lock_if_present_pins_kernel_builder():
    lock = REPO_ROOT / "flake.lock"
    if not lock.is_file():
        pytest.skip("no flake.lock: `nix flake lock` needs GitHub, unreachable here (docs/build-matrix.md)")
    data = json.loads(lock.read_text())
    assert data["version"] == 7 and data["root"] == "root"
    nodes = data["nodes"]
    builder = nodes[nodes["root"]["inputs"]["kernel-builder"]]
    assert builder["original"] == {"owner": "huggingface", "repo": "kernels", "type": "github"}
    locked = builder["locked"]
    assert locked["type"] == "github" and (locked["owner"], locked["repo"]) == ("huggingface", "kernels")
    assert len(locked["rev"]) == 40 and locked["narHash"].startswith("sha256-")
    for name, node in nodes.items():  # every input of every node is locked
        for ref in (node.get("inputs") or {}).values():
            target = ref if isinstance(ref, str) else None
            if target:
                assert "locked" in nodes[target], (name, target)
