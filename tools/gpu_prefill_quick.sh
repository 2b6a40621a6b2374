#!/usr/bin/env bash
# The Hopper prefill kernel's check in one short device call, on the package as users get it: install, its test
# file, the prefill benchmark (PREFILL_LENS, default 2K / 8K / 32K) vs SDPA, then the engine regression and the
# three sanitizers over small cases side by side (correctness only: nothing is timed then). Logs and JSON in $OUT.
# The timed KV formats are bench_gpu_attention.py's PREFILL_KV (per-token f16/u8/u4/u2 and per-channel kc4v4/kc2v2).
# PREFILL_QUICK_PARALLEL=1 (a short device call): the benchmark right after the install, alone on the GPU, then the
# test file (in two halves, one per kernel) beside the engine regression and the sanitizers, all capped at SIDE_S.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_script_setup.sh"
install_package
enter_work_dir quick
P=(python3 -m pytest -p no:cacheprovider --rootdir "$REPO" -q -rfEs)
PAR=${PREFILL_QUICK_PARALLEL:-0}
[ "$PAR" = 1 ] || timeout -k 5 120 "${P[@]}" "$REPO/tests_py/test_gpu_prefill_sm90.py" 2>&1 | tee "$OUT/pytest_prefill_sm90.log" | tail -4
sed -i "s/^PREFILL_LENS = .*/PREFILL_LENS = [${PREFILL_LENS:-2048, 8192, 32768}]/" bench_gpu_attention.py
timeout -k 5 150 python3 bench_gpu_attention.py "$OUT/bench_prefill.json" --prefill 2>&1 | tail -8
if [ "$PAR" = 1 ]; then
  for half in "not matches_cpu" "matches_cpu"; do  # the file in two halves of similar length
    (timeout -k 5 ${SIDE_S:-110} "${P[@]}" "$REPO/tests_py/test_gpu_prefill_sm90.py" -k "$half" \
      > "$OUT/pytest_prefill_sm90_${half// /_}.log" 2>&1; echo "tests ($half) rc=$?"; tail -3 "$OUT/pytest_prefill_sm90_${half// /_}.log") &
  done
fi
E="(sm90_matches_cpu and 9-3-64-24 and chunked and (u8-u4 or f16-f16)) or (sm90_matches_cpu and 8-2-128-16 and fresh and (u2-u2 or u4-f16 or f16-u2)) or refuses or (climbing and near-slack and f16-f16) or (per_channel_k_matches and chunked and (kc-u4-u8-d64 or kc-u4-u2-d64 or kc-u2-u2-d128))"
echo "== engine regression and sanitizers side by side"
(timeout -k 5 ${SIDE_S:-110} "${P[@]}" "$REPO/tests_py/test_gpu_engine.py" "$REPO/tests_py/test_gpu_kv2.py" --maxfail=20 \
  -k "not smollm2" > "$OUT/pytest_prefill_engine.log" 2>&1; echo "engine rc=$?"; tail -2 "$OUT/pytest_prefill_engine.log") &
for t in memcheck racecheck synccheck; do
  (timeout -k 5 ${SIDE_S:-110} compute-sanitizer --tool $t --error-exitcode 9 "${P[@]}" "$REPO/tests_py/test_gpu_prefill_sm90.py" \
    -k "$E" > "$OUT/${t}_prefill_sm90.log" 2>&1; echo "$t rc=$?"; tail -1 "$OUT/${t}_prefill_sm90.log"
   grep -E "^(FAILED|ERROR) |^========= (Invalid|Race|Error|Barrier)" "$OUT/${t}_prefill_sm90.log" | head -4) &
done
wait
# Logs in one archive (a device call brings back at most 8 files).
(cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log)
