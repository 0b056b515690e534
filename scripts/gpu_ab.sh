#!/usr/bin/env bash
# One device call that answers "is this tree better than BASE_REV, and still correct": build this tree (id `new`) and
# the baseline from .base/base.tar.xz (id `base`, scripts/device_prepare.sh BASE_REV) in the background while the GPU
# suite and the sanitizers (scripts/gpu_check.sh's steps) run on the new build, then kernel time
# (benchmarks/kernel_time.py, CUPTI: not the host's pace) of both builds on AB_ROWS. The builds come back as $OUT/new.tar.xz and $OUT/base.tar.xz; unpacked here into
# .ab/new and .ab/base (`tar xJf new.tar.xz -C .ab/new`) and carried by a later call, AB_REUSE=1 skips the builds.
# At most 8 files come back from a call; this writes 8 at most.
#   AB_ROWS      bench_shapes.py rows or classes for kernel_time (default: short dense)
#   AB_FORCE     also time the new build with WINATTN_FORCE_KERNEL=each of these names (space-separated; one
#                kernel_time --force run each, cuDNN beside the first)
#   AB_ROUNDS    rounds of base-then-new kernel time (default 2: what repeats across rounds is the builds')
#   AB_STEPS     subset of "suite sanitize time" (unset: all three; empty: none)
#   AB_MODELS    bench_models.py workloads run on the new build last (models.txt; needs the full .whl)
# On the device: `bash scripts/gpu_ab.sh`, carry [".whl", ".torchinc", ".base"] (or ".ab" with AB_REUSE=1).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"  # (the repo root, the wheels, PYTHONPATH)
V=torch-stable-abi210-cu130-x86_64-linux
out=${OUT:-$results/ab}; mkdir -p "$out"; out=$(cd "$out" && pwd)  # (absolute: the baseline builds elsewhere)
steps=${AB_STEPS-"suite sanitize time"}  # (set and empty: none, e.g. a models-only call on reused builds)
t0=$(date +%s); lap() { echo "== $1 at $(( $(date +%s) - t0 )) s"; }
if [ "${AB_REUSE:-0}" = 1 ]; then
  new=.ab/new/build/$V; base=.ab/base/build/$V
else
  mkdir -p /tmp/th && tar xJf .torchinc/include.tar.xz -C /tmp/th && export WINATTN_TORCH_INCLUDE=/tmp/th/include
  python3 -m winattn build --backend cuda --cuda-archs 9.0 --unique-id new > "$out/build.log" 2>&1 \
    || { tail -40 "$out/build.log"; exit 1; }
  lap "build (new)"; new=build/$V; base=/tmp/base/build/$V
  tar cJf "$out/new.tar.xz" build/$V &
  if [ -f .base/base.tar.xz ]; then
    mkdir -p /tmp/base && tar xJf .base/base.tar.xz -C /tmp/base
    ( cd /tmp/base && nice -n 10 python3 -m winattn build --backend cuda --cuda-archs 9.0 --unique-id base \
        > "$out/base_build.log" 2>&1 && tar cJf "$out/base.tar.xz" build/$V ) &
  fi
fi
export WINATTN_VARIANT_DIR=$new
rc=0
# a smoke run first, under a time limit: a kernel that hangs (a barrier experiment) would otherwise spend the call's
# whole limit in the suite. sanitize_case.py's small cases reach every kernel path in a few seconds.
timeout "${AB_SMOKE_S:-120}" python3 tests/gpu/sanitize_case.py "$new" > "$out/smoke.log" 2>&1
s=$?; [ $s -eq 0 ] || { echo "smoke run failed (exit $s; 124: hung)"; tail -20 "$out/smoke.log"; exit 1; }
lap "smoke"; rm -f "$out/smoke.log"
# the suite and the sanitizers as gpu_check.sh runs them, into a folder of their own (gpu_check.sh would copy all of
# its files to $OUT; a call returns 8), then the two logs this call returns
check_steps=$(echo $(for s in $steps; do case $s in suite) echo tests;; sanitize) echo sanitize;; esac; done))
if [ -n "$check_steps" ]; then
  env -u OUT RESULTS_DIR=/tmp/ab_check GPU_CHECK_STEPS="$check_steps" WINATTN_VARIANT_DIR="$new" \
    bash scripts/gpu_check.sh > /tmp/ab_check.log 2>&1 || rc=1
  lap "gpu_check ($check_steps)"; grep -E "passed|failed|SUMMARY|FAILED" /tmp/ab_check.log | tail -5
  cp /tmp/ab_check/gpu_tests.log "$out/suite.log" 2>/dev/null
  tail -n 30 /tmp/ab_check/sanitize_*.log > "$out/sanitize.log" 2>/dev/null
fi
wait  # (the baseline's build and the tarballs)
if [[ " $steps " == *" time "* ]]; then
  rows=${AB_ROWS:-short dense}
  # base, new, base, new (AB_ROUNDS rounds): each build runs in a process of its own, so a difference that does not
  # repeat across rounds is the clocks' (v4.4: a 5-9% backward slowdown first taken for the clocks repeated in two)
  peers=cudnn; : > "$out/kernel_time.txt"
  for round in $(seq "${AB_ROUNDS:-2}"); do
    { if [ -d "$base" ]; then echo "#### base (round $round)"
        python3 benchmarks/kernel_time.py --variant "$base" --peers "" --only $rows; fi
      for f in ${AB_FORCE:-""}; do  # (no name: one run of the table's kernels)
        echo "#### new${f:+, forced $f} (round $round)"
        python3 benchmarks/kernel_time.py --variant "$new" --peers "$peers" ${f:+--force $f} --only $rows; peers=""
      done; } >> "$out/kernel_time.txt" 2>&1 || rc=1
  done
  lap "kernel time"; grep -v -i "warn" "$out/kernel_time.txt" | cut -c1-120
fi
if [ -n "${AB_MODELS:-}" ]; then
  python3 benchmarks/bench_models.py --variant "$new" --out /tmp/ab_models.json --only $AB_MODELS \
    > "$out/models.txt" 2>&1 || rc=1
  lap "models"; grep -v -i "warn" "$out/models.txt" | tail -n 30 | cut -c1-160
fi
exit $rc
