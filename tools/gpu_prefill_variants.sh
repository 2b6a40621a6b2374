#!/usr/bin/env bash
# A change to the Hopper prefill kernel measured against its own variants in one short device call: install (pass
# CMAKE_ARGS through the environment to shorten the build), bench_gpu_prefill_variants.py alone on the GPU, then side
# by side, each capped to what is left of BUDGET_S (seconds from the start): the kernel's test file in two halves on the
# default build, its head_dim-128 cases again under LOWBIT_PREFILL_SM90_VARIANT=$ALT_VARIANT (f16 K/V instances only),
# the engine regression, and the three sanitizers over small cases (memcheck once more under the variant). Logs and
# JSON in $OUT.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$REPO/gpu_out}; mkdir -p "$OUT"; export OUT PYTHONUNBUFFERED=1 LOWBIT_COMMIT=${LOWBIT_COMMIT:-unknown}
unset LOWBIT_DEV_BUILD LOWBIT_PREFILL_SM90_VARIANT
BUDGET_S=${BUDGET_S:-280}; ALT_VARIANT=${ALT_VARIANT:-1}
t0=$(date +%s); left() { echo $(( BUDGET_S - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
(cd "$REPO" && python3 -m pip install --no-build-isolation --no-deps -v . > "$OUT/build.log" 2>&1) || { tail -30 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"; grep -E "[1-9][0-9]* bytes spill" "$OUT/build.log" | sort | uniq -c | head
cd "$(mktemp -d /tmp/lowbit-variants.XXXX)"
cp "$REPO"/tools/*.py .
bench_s=$(( $(left) - ${TESTS_MIN_S:-110} )); [ $bench_s -gt 120 ] && bench_s=120
echo "== variants benchmark (cap ${bench_s} s)"
timeout -k 5 $bench_s python3 bench_gpu_prefill_variants.py "$OUT/bench_prefill_variants.json" 2>&1 | tee "$OUT/bench_variants.log"
side=$(( $(left) - 12 )); echo "== tests side by side (cap ${side} s)"
P=(python3 -m pytest -p no:cacheprovider --rootdir "$REPO" -q -rfEs)
T="$REPO/tests_py/test_gpu_prefill_sm90.py"
for half in "not matches_cpu" "matches_cpu"; do
  (timeout -k 5 $side "${P[@]}" "$T" -k "$half" > "$OUT/pytest_${half// /_}.log" 2>&1
   echo "tests ($half) rc=$?"; tail -2 "$OUT/pytest_${half// /_}.log") &
done
(LOWBIT_PREFILL_SM90_VARIANT=$ALT_VARIANT timeout -k 5 $side "${P[@]}" "$T" \
   -k "(matches_cpu and -128-) or llama_heads or climbing or (per_channel and d128)" > "$OUT/pytest_variant.log" 2>&1
 echo "tests under variant $ALT_VARIANT rc=$?"; tail -2 "$OUT/pytest_variant.log") &
(timeout -k 5 $side "${P[@]}" "$REPO/tests_py/test_gpu_engine.py" "$REPO/tests_py/test_gpu_kv2.py" --maxfail=20 \
   -k "not smollm2" > "$OUT/pytest_engine.log" 2>&1; echo "engine rc=$?"; tail -2 "$OUT/pytest_engine.log") &
E="(sm90_matches_cpu and 9-3-64-24 and chunked and (u8-u4 or f16-f16)) or (sm90_matches_cpu and 8-2-128-16 and fresh and (f16-f16 or u2-u2 or f16-u2)) or (sm90_matches_cpu and 4-4-64-16 and chunked and f16-f16) or refuses or (per_channel_k_matches and chunked and (kc-u4-f16-d128 or kc-u2-u2-d128))"
sanitize() {  # tool, log name, then env assignments
  local t=$1 name=$2; shift 2
  (env "$@" timeout -k 5 $side compute-sanitizer --tool $t --error-exitcode 9 "${P[@]}" "$T" -k "$E" > "$OUT/$name.log" 2>&1
   echo "$name rc=$?"; tail -1 "$OUT/$name.log"
   grep -E "^(FAILED|ERROR) |^========= (Invalid|Race|Error|Barrier)" "$OUT/$name.log" | head -4) &
}
sanitize memcheck memcheck; sanitize racecheck racecheck; sanitize synccheck synccheck
sanitize memcheck memcheck_variant LOWBIT_PREFILL_SM90_VARIANT=$ALT_VARIANT
wait
(cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log)
echo "total $(( $(date +%s) - t0 )) s"
