"""The repository's own configuration: build.toml, flake.nix, README card, CI entry."""

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_build_toml_parses_with_kernels_own_parser():
    from kernels._rust import Backend, Build

    build = Build.open(str(ROOT))
    assert set(build.general.backends) == {Backend.CPU, Backend.CUDA}


def test_build_toml_fixed_names_and_sources_exist():
    cfg = tomllib.loads((ROOT / "build.toml").read_text())
    assert cfg["general"]["name"] == "window-attention"
    assert cfg["general"]["edition"] == 5
    assert cfg["general"]["version"] == 1
    assert cfg["general"]["hub"]["repo-id"] == "winattn/window-attention"
    assert cfg["torch"]["stable-abi"] == "2.10"
    backends = {k["backend"] for k in cfg["kernel"].values()}
    assert backends == {"cpu", "cuda"}
    for section in [cfg["torch"], *cfg["kernel"].values()]:
        for src in section["src"]:
            assert (ROOT / src).is_file(), f"build.toml lists a missing source: {src}"
    cuda = next(k for k in cfg["kernel"].values() if k["backend"] == "cuda")
    assert {"8.0", "8.6", "8.9", "9.0"} <= set(cuda["cuda-capabilities"])


def test_build_toml_typo_is_rejected_by_kernels_parser(tmp_path):
    from kernels._rust import Build

    text = (ROOT / "build.toml").read_text().replace("backends = ", "backendz = ")
    (tmp_path / "build.toml").write_text(text)
    with pytest.raises(ValueError, match="backendz"):
        Build.open(str(tmp_path))


@pytest.mark.skipif(shutil.which("nix-instantiate") is None, reason="nix-instantiate (Debian nix-bin) not installed")
def test_flake_nix_parses_and_uses_gen_kernel_flake_outputs():
    parsed = subprocess.run(
        ["nix-instantiate", "--parse", str(ROOT / "flake.nix")], capture_output=True, text=True, check=True
    ).stdout
    assert 'url = "github:huggingface/kernels"' in parsed
    assert "genKernelFlakeOutputs" in parsed
    assert "inherit self" in parsed


def test_readme_card_front_matter_and_quickstart():
    text = (ROOT / "README.md").read_text()
    front = text.split("---")[1]
    assert "library_name: kernels" in front
    assert "license: apache-2.0" in front
    assert "kernel" in front and "attention" in front
    quickstart = text.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [re.sub(r"\s*#.*$", "", line).strip() for line in quickstart.strip().splitlines()]
    assert commands == ["make demo", "make test"]


def test_ci_runs_make_test():
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_make_setup_says_what_it_installs_before_it_does(tmp_path):
    """`make setup` runs for minutes: it first says what it installs, how big and how long, then each step."""
    r = subprocess.run(["make", "-n", "setup", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    said = [line.split("echo ", 1)[1].strip("\"' ") for line in r.stdout.splitlines() if line.startswith("echo ")]
    assert said[0].startswith("make setup: creating") and "GB installed" in said[0] and "minutes" in said[0]
    steps = [line for line in said if re.match(r"\[\d/5\]", line)]
    assert len(steps) == 5 and "torch 2.13.0" in steps[0]
    first_pip = r.stdout.index("pip install")
    assert r.stdout.index("make setup: creating") < r.stdout.index("[1/5]") < first_pip
