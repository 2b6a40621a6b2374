#!/usr/bin/env bash
# Prefill over a quantized cache on Hopper in one short device call, on the package as users get it: install (the
# sm80-family kernels for sm_90 only, the rare head dims left out, to fit the call), tools/bench_gpu_prefill_qcache.py
# alone on the GPU (the kernel's variants side by side), then the prefill tests (the Hopper kernel's two files in two
# halves) beside the engine regression and memcheck / racecheck / synccheck over small cases, each capped at SIDE_S.
# Logs and JSON in $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_script_setup.sh"
install_package CMAKE_ARGS="-DLOWBIT_CUDA_ARCHS_SM80=90" LOWBIT_ATTN_ALL_INSTANCES=OFF
enter_work_dir qcache
[ "${QCACHE_BENCH:-1}" = 1 ] && timeout -k 5 ${BENCH_S:-170} python3 bench_gpu_prefill_qcache.py "$OUT/bench_prefill_qcache.json" 2>&1
P=(python3 -m pytest -p no:cacheprovider --rootdir "$REPO" -q -rfEs)
export OMP_NUM_THREADS=2  # eight processes share the CPUs below; torch's default threads would oversubscribe them
T="$REPO/tests_py"
for half in "not matches_cpu" "matches_cpu"; do
  (timeout -k 5 ${SIDE_S:-110} "${P[@]}" "$T/test_gpu_prefill_sm90.py" -k "$half" > "$OUT/pytest_sm90_${half// /_}.log" 2>&1
   echo "test_gpu_prefill_sm90 ($half) rc=$?"; tail -2 "$OUT/pytest_sm90_${half// /_}.log") &
done
(timeout -k 5 ${SIDE_S:-110} "${P[@]}" "$T/test_gpu_prefill_sm90_pack.py" > "$OUT/pytest_pack.log" 2>&1
 echo "test_gpu_prefill_sm90_pack rc=$?"; tail -2 "$OUT/pytest_pack.log") &
(timeout -k 5 ${SIDE_S:-110} "${P[@]}" "$T/test_gpu_engine.py" "$T/test_gpu_kv2.py" --maxfail=20 -k "not smollm2" \
  > "$OUT/pytest_engine.log" 2>&1; echo "engine rc=$?"; tail -2 "$OUT/pytest_engine.log") &
E="(14-2-d128-bs16 and fresh and u8-u8) or (32-1-d128-bs32 and chunked and u4-f16) or (6-3-d64-bs1 and chunked and u2-u2) or (9-3-d64-bs24 and fresh and f16-u8)"
for t in memcheck racecheck synccheck; do
  (timeout -k 5 ${SIDE_S:-110} compute-sanitizer --tool $t --error-exitcode 9 "${P[@]}" "$T/test_gpu_prefill_sm90_pack.py" \
    -k "$E" > "$OUT/${t}_qcache.log" 2>&1; echo "$t rc=$?"; tail -1 "$OUT/${t}_qcache.log"
   grep -E "^(FAILED|ERROR) |^========= (Invalid|Race|Error|Barrier)" "$OUT/${t}_qcache.log" | head -4) &
done
wait
grep -hE "^(FAILED|ERROR) " "$OUT"/pytest_*.log | cut -c1-300 | head -20
(cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log)
