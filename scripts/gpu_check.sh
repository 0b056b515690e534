#!/usr/bin/env bash
# GPU check (`make gpu-check`): build the CUDA variant if needed, run the GPU tests, a compute-sanitizer memcheck +
# racecheck pass on small cases, and the benchmarks. Results go to results/ (and to $OUT when set, e.g. on the
# device machine). Environment:
#   WINATTN_VARIANT_DIR  prebuilt variant (default build/torch-stable-abi210-cu130-x86_64-linux, built if missing)
#   GPU_CHECK_STEPS      subset of "tests sanitize bench shapes models" (default: tests sanitize bench; "shapes"
#                        runs the shape matrix benchmarks/bench_shapes.py, "models" benchmarks/bench_models.py,
#                        which needs the extra wheels named in its docstring)
#   SHAPES_BASELINE      shapes: a variant to measure beside this one in the same process (--variant; this build is
#                        then --variant-b); SHAPES_ARGS: extra bench_shapes.py arguments
#   MODELS_ARGS          extra bench_models.py arguments (e.g. "--only beit_b16_train sdxl_step")
#   PYTEST_ARGS          extra pytest arguments (e.g. "-k swin")
#   BENCH_ARGS           extra bench_cuda.py arguments (e.g. "--reps 10 --only swin_w7")
#   CUDA_ARCHS           the build's capabilities (e.g. "9.0": about a minute on the H200's 16 cores)
#   TORCH_HEADERS        a .tar.xz of a newer torch's include/ to build against (WINATTN_TORCH_INCLUDE, docs/knobs.md:
#                        the H200 image's torch 2.11 lacks macros the binding uses); made here with
#                        `tar cJf .torchinc/include.tar.xz -C .venv/lib/python3.11/site-packages/torch include`
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
steps=${GPU_CHECK_STEPS:-"tests sanitize bench"}
if [ ! -f "$variant/metadata.json" ]; then
  echo "== building the CUDA variant"
  if [ -n "${TORCH_HEADERS:-}" ]; then
    mkdir -p /tmp/torch_headers && tar xJf "$TORCH_HEADERS" -C /tmp/torch_headers || exit 1
    export WINATTN_TORCH_INCLUDE=/tmp/torch_headers/include
  fi
  python3 -m winattn build --backend cuda ${CUDA_ARCHS:+--cuda-archs $CUDA_ARCHS} || exit 1
fi
export WINATTN_VARIANT_DIR=$variant
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$results/gpu.txt"
rc=0

if [[ " $steps " == *" tests "* ]]; then
  echo "== GPU tests"
  python3 -m pytest -q tests/gpu tests/test_attention.py tests/test_random_calls.py -p no:cacheprovider \
    --junitxml="$results/gpu_tests.xml" ${PYTEST_ARGS:-} 2>&1 | tee "$results/gpu_tests.log" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi

if [[ " $steps " == *" sanitize "* ]]; then
  if command -v compute-sanitizer >/dev/null; then
    for tool in memcheck racecheck; do
      echo "== compute-sanitizer --tool $tool"
      compute-sanitizer --tool $tool --error-exitcode 3 --print-limit 20 \
        python3 tests/gpu/sanitize_case.py "$variant" $tool > "$results/sanitize_$tool.log" 2>&1
      s=$?
      tail -5 "$results/sanitize_$tool.log"
      [ $s -eq 0 ] || { echo "compute-sanitizer $tool: FAILED ($s)"; rc=1; }
    done
  else
    echo "compute-sanitizer not found: skipped" | tee "$results/sanitize_skipped.log"
  fi
fi

if [[ " $steps " == *" bench "* ]]; then
  echo "== benchmarks"
  python3 benchmarks/bench_cuda.py --variant "$variant" --out "$results/bench_cuda.json" ${BENCH_ARGS:-} \
    2>"$results/bench_cuda.err" | tee "$results/bench_cuda.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  python3 benchmarks/bench_fwd.py --variant "$variant" --out "$results/bench_fwd.json" \
    2>"$results/bench_fwd.err" | tee "$results/bench_fwd.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi

if [[ " $steps " == *" shapes "* ]]; then
  echo "== shape matrix"
  if [ -n "${SHAPES_BASELINE:-}" ]; then shape_variants=(--variant "$SHAPES_BASELINE" --variant-b "$variant")
  else shape_variants=(--variant "$variant"); fi
  python3 benchmarks/bench_shapes.py "${shape_variants[@]}" --out "$results/bench_shapes.json" ${SHAPES_ARGS:-} \
    2>"$results/bench_shapes.err" | tee "$results/bench_shapes.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi

if [[ " $steps " == *" models "* ]]; then
  echo "== model benchmarks"
  python3 benchmarks/bench_models.py --variant "$variant" --out "$results/bench_models.json" ${MODELS_ARGS:-} \
    2>"$results/bench_models.err" | tee "$results/bench_models.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi

if [ -n "${OUT:-}" ]; then cp -r "$results"/. "$OUT"/ 2>/dev/null; fi
exit $rc
