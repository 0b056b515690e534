#!/usr/bin/env bash
# Nsight Compute profile of our kernels on chosen benchmark workloads (`make gpu-profile`): every kernel launched by
# one forward + backward of ours (and of the same call without the Hopper kernels, `ours_v1`, and for key padding
# without the mask) inside bench_cuda.py --profile's profiler range. Reports go to results/ncu_<workload>.txt (and to
# $OUT when set). Environment:
#   WINATTN_VARIANT_DIR  prebuilt variant (default build/torch-stable-abi210-cu130-x86_64-linux)
#   PROFILE_WORKLOADS    bench_cuda.py workloads (default: keypad swin_w12 swin_w16 nobias_d256; "" for none)
#   PROFILE_FWD_WORKLOADS  bench_fwd.py workloads for the forward v3 kernel alone
#   PROFILE_BWD_WORKLOADS  bench_cuda.py workloads for the backward v3 kernel alone
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
rc=0
# --clock-control none: the GPU's own clocks, as in the timed benchmark; sections: throughput, occupancy, stalls
# (plus the per-reason stall cycles per issued instruction).
for w in ${PROFILE_WORKLOADS-keypad swin_w12 swin_w16 nobias_d256}; do
  echo "== ncu: $w"
  ncu --profile-from-start off --clock-control none \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 benchmarks/bench_cuda.py --variant "$variant" --profile --only "$w" --out "$results/profile_$w.json" \
    > "$results/ncu_$w.txt" 2>&1 || rc=1
  grep -E "^  [a-zA-Z_].*\(|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Block Limit" \
    "$results/ncu_$w.txt" | head -80
done
# The forward v3 kernel on the bench_fwd.py workloads (PROFILE_FWD_WORKLOADS; default: the targets it misses).
for w in ${PROFILE_FWD_WORKLOADS-nobias_d64_16k nobias_d256_16k flux_1024px dense_bias_d64}; do
  echo "== ncu (forward v3): $w"
  ncu --profile-from-start off --clock-control none -k regex:fwd_pipelined \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
    --section SchedulerStats --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 benchmarks/bench_fwd.py --variant "$variant" --profile --only "$w" --out "$results/profile_fwd_$w.json" \
    > "$results/ncu_fwd_$w.txt" 2>&1 || rc=1
  grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy|Issue Slots Busy|No Eligible" \
    "$results/ncu_fwd_$w.txt" | head -20
done
# The backward v3 kernel alone on bench_cuda.py workloads (PROFILE_BWD_WORKLOADS; default: the targets it misses).
for w in ${PROFILE_BWD_WORKLOADS-nobias nobias_d64 nobias_d256 dense flux}; do
  echo "== ncu (backward v3): $w"
  ncu --profile-from-start off --clock-control none -k regex:bwd_pipelined --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
    --section SchedulerStats --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 benchmarks/bench_cuda.py --variant "$variant" --profile --only "$w" --out "$results/profile_bwd_$w.json" \
    > "$results/ncu_bwd_$w.txt" 2>&1 || rc=1
  grep -E "Duration|Memory Throughput|DRAM Throughput|L2 Cache Throughput|Compute \(SM\)|No Eligible|Registers Per" \
    "$results/ncu_bwd_$w.txt" | head -12
  # the four largest stall reasons (cycles per issued instruction)
  grep -E "average_warps_issue_stalled_.*_per_issue_active" "$results/ncu_bwd_$w.txt" | awk '{print $NF, $1}' |
    sort -gr | head -4
done
if [ -n "${OUT:-}" ]; then cp -r "$results"/. "$OUT"/ 2>/dev/null; fi
exit $rc
