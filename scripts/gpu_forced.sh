#!/usr/bin/env bash
# Kernel time of forced kernels on the rows they concern, against the table's kernel in the same process
# (benchmarks/kernel_time.py --force: `ours` = the table, `ours_b` = forced; cuDNN beside), into $OUT/forced.txt. The
# default list: the kernels the table replaced (A/B of its rules) and the forced-only ones still waiting.
#   bash scripts/gpu_forced.sh VARIANT_DIR        (after scripts/gpu_ab.sh built it, or .ab/new/build/<variant>)
# FORCED_ROWS overrides the list: "name:row row ...;name:row ..." (the names docs/knobs.md lists).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
variant=${1:?variant dir}
plan=${FORCED_ROWS:-"bwd_v3_dq_accumulate:sd15_cross sdxl_cross pixart_a_cross vit_b16 deit_s16 eva02_b14;\
fwd_v3_two_ctas:vit_b16 eva02_b14 beit_b16_bf16;fwd_decode_tma:llama3_8b_decode llama3_8b_decode_b32"}
out=${OUT:-$results}/forced.txt
IFS=';' read -ra entries <<< "$plan"
for e in "${entries[@]}"; do
  echo "#### forced ${e%%:*}"
  # shellcheck disable=SC2086  # (the rows are words)
  python3 benchmarks/kernel_time.py --variant "$variant" --peers cudnn --force "${e%%:*}" --only ${e#*:}
done > "$out" 2>&1
grep -v -i warn "$out" | cut -c1-150
