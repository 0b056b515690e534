#!/usr/bin/env bash
# One device call that times variants built on the development machine against each other, with no build on the
# device (a device call's minutes are the scarce ones; scripts/gpu_ab.sh builds two there, ~2-4 minutes). Each
# variant travels as .abv/<name>.tar.xz, ~2.2 MB, made by scripts/build_variants.sh (which says what a build costs).
# On the device: each unpacked, a timed smoke run of each (a hanging experiment ends the call in two minutes),
# KT_ROUNDS rounds of kernel time (benchmarks/kernel_time.py, CUPTI) over all of them, each in its own process, in
# the order given (what repeats across rounds is the variants', not the clocks'), then the GPU suite (~45 s) and the
# sanitizers on those in VARIANTS_CHECK (~2 minutes per variant in all). Kernel time comes first because it decides
# whether the checks matter at all, and what a call left under $OUT comes back when it runs past its limit.
#   VARIANTS        names of .abv/<name>.tar.xz, the baseline first (default: every tarball there, sorted)
#   VARIANTS_CHECK  names to run the GPU suite and memcheck / racecheck on (default: none)
#   SANITIZE        0: the GPU suite only on those (a first screen of several variants in one call); default 1
#   PICK_ROW        a row: after the suites, scripts/pick_variant.py picks what lands among VARIANTS_CHECK (the
#                   baseline when none qualifies) by that row's forward + backward, writes its name to
#                   /tmp/abv/pick (for a matrix call right after, on the warm machine: V=$(cat /tmp/abv/pick)) and
#                   runs the sanitizers on it alone (SANITIZE=0 for the others)
#   KT_ROWS         bench_shapes.py rows or classes (default: short dense); KT_ROUNDS (default 2)
#   KT_PEERS        peers timed beside the first variant in the first round (default: cudnn)
#   KT_FORCE        "rows:names ..." (e.g. "dit_xl2_256,dit_xl2_512:fwd_v3_fine_dims,fwd_v3_stream"): after the
#                   rounds, kernel time of those rows with the table's kernels and with WINATTN_FORCE_KERNEL=names, on
#                   the first variant, one process each (kernel_time.py --force): a forced-kernel sweep with no build;
#                   each entry gets at most 90 s, and none starts after KT_FORCE_S seconds of the call (default 400);
#                   KT_FORCE_BOTH=1 runs each entry twice, the forced run second and then first (--b-first): the
#                   first position reads differently on some rows (RESULTS v5.9)
#   NCU             "name:row:kernel-regex[:impl] ..." (e.g. "v49:dense_d128_16k:bwd_pipelined"): Nsight Compute of
#                   one launch of that kernel in the row's forward + backward (benchmarks/profile_shapes.py), last;
#                   impl: a peer's kernels on the same call instead of ours (e.g. "v57:dit_xl2_256:cudnn:cudnn"), so
#                   that the two profiles compare; NCU_SECTIONS adds sections (e.g. "MemoryWorkloadAnalysis");
#                   NCU_SASS=0 leaves out the SASS page (one file per entry instead of two: a call returns 8 files)
# On the device: `bash scripts/gpu_variants.sh`, carry [".abv", ".whlmin"]. Prints the rounds' means per row and variant
# (scripts/kt_summary.py). Writes kernel_time.txt and, per checked
# variant, <name>_suite.log and <name>_sanitize.log, forced.txt with KT_FORCE, per NCU entry <name>_<row>.txt
# (details) and .csv.xz (the SASS source page with its stall samples; <name>_<row>_<impl> for a peer's) to $OUT: a
# call returns 8 files at most, so keep the lists short.
set -uo pipefail
WHL=${WHL:-.whlmin} source "$(dirname "$0")/gpu_env.sh"  # (the repo root, the wheels, PYTHONPATH)
out=${OUT:-$results/variants}; mkdir -p "$out"
t0=$(date +%s); lap() { echo "== $1 at $(( $(date +%s) - t0 )) s"; }
names=${VARIANTS:-$(cd .abv && ls *.tar.xz | sed 's/\.tar\.xz$//' | sort)}
declare -A dir
for n in $names; do
  mkdir -p "/tmp/abv/$n" && tar xJf ".abv/$n.tar.xz" -C "/tmp/abv/$n" \
    || { echo "cannot unpack .abv/$n.tar.xz"; exit 1; }
  dir[$n]=$(dirname "$(ls -d /tmp/abv/$n/build/*/metadata.json | head -1)")
  timeout "${SMOKE_S:-120}" python3 tests/gpu/sanitize_case.py "${dir[$n]}" > "/tmp/abv/$n.smoke.log" 2>&1
  s=$?; [ $s -eq 0 ] || { echo "$n: smoke run failed (exit $s; 124: hung)"; tail -20 "/tmp/abv/$n.smoke.log"; exit 1; }
done
lap "unpacked, smoke runs"
rc=0
peers=${KT_PEERS-cudnn}
for round in $(seq "${KT_ROUNDS:-2}"); do
  for n in $names; do
    echo "#### $n (round $round)"
    python3 benchmarks/kernel_time.py --variant "${dir[$n]}" --peers "$peers" --only ${KT_ROWS:-short dense}
    peers=""
  done
done > "$out/kernel_time.txt" 2>&1 || rc=1
lap "kernel time"; python3 scripts/kt_summary.py "$out/kernel_time.txt" | cut -c1-200  # (the rows: kernel_time.txt)
first=$(printf '%s\n' $names | head -1)  # (names: the default list is one per line)
for spec in ${KT_FORCE:-}; do
  IFS=: read -r rows force <<< "$spec"
  if [ $(( $(date +%s) - t0 )) -ge "${KT_FORCE_S:-400}" ]; then
    echo "#### $force on $rows: not run (KT_FORCE_S)"; continue
  fi
  for order in "" ${KT_FORCE_BOTH:+--b-first}; do
    echo "#### $first forced $force on $rows ${order:-(forced second)}"
    timeout 90 python3 benchmarks/kernel_time.py --variant "${dir[$first]}" --peers "" --force "$force" $order \
      --only ${rows//,/ } || rc=1
  done
done > "$out/forced.txt" 2>&1
[ -n "${KT_FORCE:-}" ] && { lap "forced"; grep -v -i "warn\|dirty" "$out/forced.txt" | cut -c1-120; }
sanitize() {  # memcheck and racecheck of one variant on tests/gpu/sanitize_case.py
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 3 --print-limit 20 \
      python3 tests/gpu/sanitize_case.py "${dir[$1]}" $tool > "/tmp/abv/$1.$tool.log" 2>&1 || rc=1
    tail -n 3 "/tmp/abv/$1.$tool.log"
  done > "$out/${1}_sanitize.log"
  grep -h "SUMMARY" "$out/${1}_sanitize.log"
  lap "$1 checked"
}
for n in ${VARIANTS_CHECK:-}; do
  WINATTN_VARIANT_DIR="${dir[$n]}" python3 -m pytest -q tests/gpu tests/test_attention.py tests/test_random_calls.py \
    -p no:cacheprovider > "$out/${n}_suite.log" 2>&1 || rc=1
  echo "$n: $(tail -1 "$out/${n}_suite.log")"
  if [ "${SANITIZE:-1}" = 0 ] || [ -n "${PICK_ROW:-}" ]; then lap "$n suite"; else sanitize "$n"; fi
done
if [ -n "${PICK_ROW:-}" ]; then
  python3 scripts/pick_variant.py "$out" "$PICK_ROW" $(printf '%s\n' ${VARIANTS_CHECK:-} | grep -vx "$first") \
    > /tmp/abv/pick || rc=1
  pick=$(cat /tmp/abv/pick); [ -n "$pick" ] && sanitize "$pick"
fi
export PATH=$PATH:/usr/local/cuda/bin
for spec in ${NCU:-}; do
  IFS=: read -r n row kre impl <<< "$spec"
  impl=${impl:-ours}; tag=${n}_$row; [ "$impl" = ours ] || tag+=_$impl
  extra=(); for sec in ${NCU_SECTIONS:-}; do extra+=(--section "$sec"); done
  ncu --target-processes all --profile-from-start off -k "regex:$kre" -c 1 --section SpeedOfLight \
    --section WarpStateStats --section SourceCounters --section LaunchStats --section Occupancy "${extra[@]}" \
    --import-source no -f -o "/tmp/abv/ncu_$tag" \
    python3 benchmarks/profile_shapes.py --variant "${dir[$n]}" --only "$row" --impl "$impl" \
    > "/tmp/abv/ncu_$tag.log" 2>&1 || { rc=1; tail -5 "/tmp/abv/ncu_$tag.log"; continue; }
  ncu -i "/tmp/abv/ncu_$tag.ncu-rep" --page details > "$out/$tag.txt" 2>&1
  [ "${NCU_SASS:-1}" = 0 ] || ncu -i "/tmp/abv/ncu_$tag.ncu-rep" --page source --csv --print-source sass \
    2>/dev/null | xz -T0 > "$out/$tag.csv.xz"
  grep -E "Duration|SM Frequency|Registers Per|No Eligible|Executed Ipc A" "$out/$tag.txt" | head -6
  lap "ncu $tag"
done
exit $rc
