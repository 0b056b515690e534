#!/usr/bin/env bash
# The call that decides lean7 / lean10 (benchmarks/pending/*.patch), from the repo root with carry [".abv", ".whlmin"],
# ~6 minutes: .abv/{mend,lean7,lean10}.tar.xz built by scripts/build_variants.sh (mend = main). Kernel time of the
# three on the rows the backward loop and the forward producers' wait touch, then lean7's and lean10's GPU suites,
# then lean7's sanitizers (last: a call cut at its limit returns what ran).
set -uo pipefail
rows="dense_d64_16k dense_d128_16k dense_d256_16k dense_causal_d128_16k flux1_joint sd3_m_joint mistral_7b_swa
 llama3_8b_docs_b1qk"
VARIANTS="mend lean7 lean10" KT_ROWS="$rows" KT_ROUNDS=2 KT_PEERS=cudnn bash scripts/gpu_variants.sh
VARIANTS="lean7 lean10" VARIANTS_CHECK="lean7 lean10" SANITIZE=0 KT_ROUNDS=0 OUT=$OUT/chk bash scripts/gpu_variants.sh
d=$(dirname "$(ls -d /tmp/abv/lean7/build/*/metadata.json | head -1)")
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool --error-exitcode 3 --print-limit 20 python3 tests/gpu/sanitize_case.py "$d" $tool \
    > /tmp/abv/lean7.$tool.log 2>&1; echo "$tool exit $?"; tail -n 3 /tmp/abv/lean7.$tool.log
done 2>&1 | tee $OUT/chk/lean7_sanitize.log
