#!/usr/bin/env bash
# The shape matrix with FA4 on one build from .abv (V=name, default mend; ROWS="..." for some rows only), from the
# repo root. FA4's wheels (../shared/device/fa4_wheels.sh makes .fa4/1 and .fa4/2) travel over two calls back to
# back: `bash .fa4/1/stage.sh` with carry [".fa4/1"], then this with carry [".fa4/2", ".abv", ".whlmin"].
set -uo pipefail
WHL=.whlmin source scripts/gpu_env.sh
bash .fa4/2/stage.sh || exit 3
n=${V:-mend}; mkdir -p /tmp/abv/$n && tar xJf .abv/$n.tar.xz -C /tmp/abv/$n
dir=$(dirname "$(ls -d /tmp/abv/$n/build/*/metadata.json | head -1)")
python3 benchmarks/bench_shapes.py --variant "$dir" --peers cudnn,fa2,efficient,fa4 --kernel-time \
  --out "$OUT/bench_shapes.json" ${ROWS:+--only $ROWS} > "$OUT/matrix.txt" 2>&1
echo "exit $?"; grep -v -i "warn" "$OUT/matrix.txt" | tail -90 | cut -c1-160
grep "rows below" "$OUT/matrix.txt"  # the summary whole (the cut above shortens it)
