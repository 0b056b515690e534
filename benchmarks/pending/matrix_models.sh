#!/usr/bin/env bash
# The shape matrix with FA4 (as matrix_fa4.sh), then the model steps, on one build from .abv (V=name), in one
# call: the second of two back to back (`bash .fa4/1/stage.sh` with carry [".fa4/1"] first), carry
# [".fa4/2", ".abv", ".whl"] (~62 MiB). The full wheel set first, so that both halves find diffusers and timm.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
V=${V:-dyn2} bash benchmarks/pending/matrix_fa4.sh
n=${V:-dyn2}; dir=$(dirname "$(ls -d /tmp/abv/$n/build/*/metadata.json | head -1)")
RESULTS_DIR=$OUT GPU_CHECK_STEPS=models WINATTN_VARIANT_DIR=$dir MODELS_ARGS="${MODELS:-}" bash scripts/gpu_check.sh \
  2>&1 | grep -v -i warn | tail -30
