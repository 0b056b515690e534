#!/usr/bin/env bash
# The call that decides lean7 / lean10 (benchmarks/pending/*.patch), from the repo root with carry [".abv", ".whlmin"],
# ~6 minutes: .abv/{mend,lean7,lean10}.tar.xz built by scripts/build_variants.sh (mend = main). Kernel time of the
# three on the rows the backward loop and the forward producers' wait touch, then lean10's GPU suite, then lean7's
# suite and sanitizers (gpu_variants.sh's checks, last: a call cut at its limit returns what ran).
set -uo pipefail
rows="dense_d64_16k dense_d128_16k dense_d256_16k dense_causal_d128_16k flux1_joint sd3_m_joint mistral_7b_swa
 llama3_8b_docs_b1qk"
VARIANTS="mend lean7 lean10" KT_ROWS="$rows" KT_ROUNDS=2 KT_PEERS=cudnn bash scripts/gpu_variants.sh
VARIANTS="lean10" VARIANTS_CHECK="lean10" SANITIZE=0 KT_ROUNDS=0 OUT=$OUT/chk bash scripts/gpu_variants.sh
VARIANTS="lean7" VARIANTS_CHECK="lean7" KT_ROUNDS=0 OUT=$OUT/chk bash scripts/gpu_variants.sh
