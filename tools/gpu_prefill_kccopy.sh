#!/usr/bin/env bash
# Per-channel K prefill with the dequantized copy of the sealed keys, in one short device call on the package as
# users get it: install (as gpu_prefill_32k.sh), tools/bench_gpu_prefill_qcache.py on one chunk of 64 / 256 / 1024
# tokens over 8K and 32K for kc4 (u4 K per channel, u4 V) and kc2 (u2 / u2) with the copy on and off and the tail
# split's side stream on and off (SDPA with the lower-right mask and the f16 cache beside them; summed kernel time,
# per-call span, and with KCC_GRAPH=1 CUDA-graph replay), then the per-channel tests, then compute-sanitizer
# (memcheck, racecheck, synccheck) over small cases.
# Knobs: KCC_COPY (default on,off), KCC_SIDE (auto), KCC_GRAPH (0), KCC_KV (kc4,kc2), KCC_CASES; KCC_TESTS (the
# test files), KCC_TEST_K (their -k), KCC_SAN_K (the memcheck cases), KCC_SAN2_K (racecheck / synccheck cases),
# KCC_SAN_TOOLS (memcheck,racecheck,synccheck); BENCH_S / TEST_S / SAN_S (each tool) cap the steps.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_script_setup.sh"
start=$(date +%s)
install_package CMAKE_ARGS="-DLOWBIT_CUDA_ARCHS_SM80=90" LOWBIT_ATTN_ALL_INSTANCES=OFF
enter_work_dir kccopy
QCACHE_FRESH= QCACHE_CHUNKED=${KCC_CASES:-1:8192:64,1:8192:256,1:8192:1024,1:32768:64,1:32768:256,1:32768:1024} \
  QCACHE_KV=${KCC_KV:-kc4,kc2} QCACHE_VARIANTS=0 QCACHE_SPLITS=0 QCACHE_REF=0 QCACHE_SIDE=${KCC_SIDE:-auto} \
  QCACHE_GRAPH=${KCC_GRAPH:-0} QCACHE_COPY=${KCC_COPY:-on,off} \
  timeout -k 5 ${BENCH_S:-70} python3 bench_gpu_prefill_qcache.py "$OUT/bench_prefill_kccopy.json" 2>&1
echo "bench done at $(( $(date +%s) - start )) s"
P=(python3 -m pytest -p no:cacheprovider --rootdir "$REPO" -q -rfEs --maxfail=20)
T="$REPO/tests_py"
read -r -a TESTS <<< "${KCC_TESTS:-test_gpu_prefill_sm90_kccopy.py test_gpu_prefill_sm90_split.py test_gpu_prefill_sm90.py}"
timeout -k 5 ${TEST_S:-50} "${P[@]}" "${TESTS[@]/#/$T/}" -k "${KCC_TEST_K:-kc_copy or split or per_channel}" \
  > "$OUT/pytest_kccopy.log" 2>&1
echo "tests rc=$?: $(tail -1 "$OUT/pytest_kccopy.log")  at $(( $(date +%s) - start )) s"
grep -E "^(FAILED|ERROR) " "$OUT/pytest_kccopy.log" | cut -c1-300 | head -10
IFS=, read -r -a TOOLS <<< "${KCC_SAN_TOOLS:-memcheck}"
for tool in "${TOOLS[@]}"; do
  k=${KCC_SAN2_K:-${KCC_SAN_K:-float64 and kc-u4-u2-d64 and not auto}}
  [ "$tool" = memcheck ] && k=${KCC_SAN_K:-float64 and kc-u4-u2-d64 and not auto}
  timeout -k 5 ${SAN_S:-25} compute-sanitizer --tool "$tool" --error-exitcode 9 "${P[@]}" \
    "$T/${KCC_SAN_FILE:-test_gpu_prefill_sm90_kccopy.py}" -k "$k" > "$OUT/${tool}_kccopy.log" 2>&1
  echo "$tool rc=$?: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/${tool}_kccopy.log" | tail -1) /" \
    "$(tail -1 "$OUT/${tool}_kccopy.log")  at $(( $(date +%s) - start )) s"
  grep -E "^========= (Invalid|Error|Race|Barrier|Warning)" "$OUT/${tool}_kccopy.log" | head -4
done
(cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log)
echo "total $(( $(date +%s) - start )) s"
