# Quickstart: `make demo` then `make test` on a fresh clone. Each target sets itself up.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup build build-cuda test demo gpu-check gpu-profile matrix clean

setup: $(STAMP)

# A venv with pinned deps. torch==2.13.0 resolves to the local CPU wheel (requirements/constraints.txt keeps every
# later install from replacing it). nix-bin (Debian) is only used to check that flake.nix parses.
$(STAMP): requirements/base.txt requirements/integrations.txt requirements/fastvideo.txt requirements/constraints.txt pyproject.toml
	@echo "make setup: creating $(VENV)/ with pinned dependencies, once: about 1.6 GB installed, 3-4 minutes on the"
	@echo "  2-core CI machine with its local wheels (longer where pip downloads them); five steps:"
	@test -x $(PY) || python3 -m venv $(VENV)
	@echo "  [1/5] torch 2.13.0 (CPU), kernels 0.17.2, huggingface_hub 2.4.0, model-signing, kernel-abi-check, pytest(-xdist)"
	@$(PY) -m pip install -q --disable-pip-version-check -r requirements/base.txt 2>&1 | grep -v "^WARNING: Location" || true
	@echo "  [2/5] diffusers 0.42.1, timm 1.0.31, torchvision 0.28.0 (integration targets)"
	@$(PY) -m pip install -q --disable-pip-version-check -c requirements/constraints.txt -r requirements/integrations.txt 2>&1 | grep -v "^WARNING: Location" || true
	@# FastVideo 0.2.1 pins torch 2.12 and ~2.5 GB of CUDA deps: install it without deps plus what its attention API needs.
	@echo "  [3/5] FastVideo 0.2.1 without its ~2.5 GB of CUDA dependencies, plus what its attention API needs"
	@$(PY) -m pip install -q --disable-pip-version-check -c requirements/constraints.txt -r requirements/fastvideo.txt 2>&1 | grep -v "^WARNING: Location" || true
	@$(PY) -m pip install -q --disable-pip-version-check -c requirements/constraints.txt --no-deps fastvideo==0.2.1 2>&1 | grep -v "^WARNING: Location" || true
	@echo "  [4/5] winattn itself (editable) and the torchvision import hook"
	@$(PY) -m pip install -q --disable-pip-version-check --no-deps -e . 2>&1 | grep -v "^WARNING: Location" || true
	@# PyPI's torchvision is a cu130 build that cannot import beside CPU torch: a .pth hook fixes `import torchvision`
	@# (winattn/integrations/torchvision_hook.py) so that timm/diffusers snippets run as written.
	@$(PY) -m winattn.integrations.torchvision_hook install >/dev/null
	@echo "  [5/5] checking that everything imports"
	@$(PY) -c "import torch, kernels, huggingface_hub, model_signing, xdist, winattn.integrations._torchvision_shim, diffusers, timm, importlib.util as u; assert u.find_spec('fastvideo'); assert torch.__version__.startswith('2.13.0')"
	@if ! command -v nix-instantiate >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "  (and Debian's nix-bin, only to check that flake.nix parses)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nix-bin) >/dev/null 2>&1 \
	  || echo "note: nix-bin not installed; the flake.nix parse test will be skipped"; fi
	@touch $@
	@echo "make setup: done ($(VENV)/)"

build: setup
	$(PY) -m winattn build --backend cpu

# Compile-only CUDA build (no GPU needed); CUDA_ARCHS="9.0" limits the archs.
build-cuda: setup
	$(PY) -m winattn build --backend cuda $(if $(CUDA_ARCHS),--cuda-archs $(CUDA_ARCHS))

# Two pytest-xdist workers, one per core of the 2-core CI machine: in one process the suite kept one core busy at
# best (most of it waits on child processes, servers and compiles) and left the other to the nice'd CUDA compile;
# 453 s -> 325 s of pytest. Whole files go to a worker (module fixtures are built once), the longest files first
# (tests/conftest.py); the CUDA compile runs once, started by xdist's controller. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: build
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

demo: setup
	$(PY) -m winattn demo

gpu-check:
	bash scripts/gpu_check.sh

gpu-profile:
	bash scripts/gpu_profile.sh

# Every variant this machine can make (docs/build-matrix.md): CPU, cu124 (Debian+PyPI), cu130 (system), cu132 (PyPI),
# each checked (abi3, manylinux_2_28, fatbinary); toolkits are provisioned once under ~/.cache/winattn/toolchains.
# CUDA="cu130" limits the toolkits, TORCH="2.12 2.13" adds per-torch CPU variants, CLEAN=1 drops other variant dirs.
matrix: setup
	nice -n 10 $(PY) -m winattn build --matrix $(if $(CUDA),--cuda $(CUDA)) $(if $(TORCH),--torch $(TORCH)) $(if $(CLEAN),--clean)

clean:
	rm -rf build _build_obj results
