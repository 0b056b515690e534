#!/usr/bin/env bash
# Kernel time of each forced-only kernel on the rows it was built for, against the table's kernel in the same process
# (benchmarks/kernel_time.py --force: `ours` = the table, `ours_b` = forced; cuDNN beside), into $OUT/forced.txt.
#   bash scripts/gpu_forced.sh VARIANT_DIR        (after scripts/gpu_ab.sh built it, or .ab/new/build/<variant>)
# FORCED_ROWS overrides the list: "name:row row ...;name:row ..." (the names docs/knobs.md lists).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
variant=${1:?variant dir}
plan=${FORCED_ROWS:-"bwd_v3_dq_direct:sd15_cross sdxl_cross pixart_a_cross;bwd_v3_dq_resident:vit_b16 deit_s16 eva02_b14;\
fwd_v3_wide:dense_d256_16k;fwd_v3_ragged:vit_b16 deit_s16_fp16 eva02_b14 vit_b16_384 clip_l14_336_infer beit_b16_bf16 \
beit_b16_fp32 beit_b16_fp16;fwd_v3_two_ctas:beit_b16_bf16 beit_b16_fp32 beit_b16_fp16 beit_l16_infer t5_base_enc"}
out=${OUT:-$results}/forced.txt
IFS=';' read -ra entries <<< "$plan"
for e in "${entries[@]}"; do
  echo "#### forced ${e%%:*}"
  # shellcheck disable=SC2086  # (the rows are words)
  python3 benchmarks/kernel_time.py --variant "$variant" --peers cudnn --force "${e%%:*}" --only ${e#*:}
done > "$out" 2>&1
grep -v -i warn "$out" | cut -c1-150
