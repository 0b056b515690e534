#!/usr/bin/env bash
# The call that decides lean7, lean10 and desc64 together (benchmarks/pending/*.patch), from the repo root with carry
# [".abv", ".whlmin"], ~7 minutes: .abv/{mend,lean7,lean10,stack}.tar.xz built by scripts/build_variants.sh (mend =
# main, stack = lean10 + desc64). Kernel time of the four on the rows the backward loop, the descriptors and the
# forward producers' wait touch (head dims 64 / 72 on 96 / 128 / 256, banded and not), then stack's GPU suite and
# sanitizers (gpu_variants.sh's checks, last: a call cut at its limit returns what ran).
set -uo pipefail
rows="dense_d64_16k dense_d128_16k dense_d256_16k dense_causal_d128_16k flux1_joint sd3_m_joint mistral_7b_swa
 llama3_8b_docs_b1qk pixart_a_self_1024"
VARIANTS="mend lean7 lean10 stack" KT_ROWS="$rows" KT_ROUNDS=2 KT_PEERS=cudnn bash scripts/gpu_variants.sh
VARIANTS="stack" VARIANTS_CHECK="stack" KT_ROUNDS=0 OUT=$OUT/chk bash scripts/gpu_variants.sh
