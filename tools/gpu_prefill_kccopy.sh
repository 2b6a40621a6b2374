#!/usr/bin/env bash
# Per-channel K prefill with the dequantized copy of the sealed keys, in one short device call on the package as
# users get it: install (as gpu_prefill_32k.sh), tools/bench_gpu_prefill_qcache.py on one chunk of 64 / 256 / 1024
# tokens over 8K and 32K for kc4 (u4 K per channel, u4 V) and kc2 (u2 / u2) with the copy on and off (SDPA with the
# lower-right mask and the f16 cache beside them), then the per-channel tests (the copy's, the kernel's own
# per-channel ones and the key split's: the kernel's split code changed), then memcheck over a small copy case.
# Knobs: KCC_COPY (default on,off), KCC_KV (kc4,kc2), KCC_CASES; BENCH_S / TEST_S / SAN_S cap the steps.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_script_setup.sh"
start=$(date +%s)
install_package CMAKE_ARGS="-DLOWBIT_CUDA_ARCHS_SM80=90" LOWBIT_ATTN_ALL_INSTANCES=OFF
enter_work_dir kccopy
QCACHE_FRESH= QCACHE_CHUNKED=${KCC_CASES:-1:8192:64,1:8192:256,1:8192:1024,1:32768:64,1:32768:256,1:32768:1024} \
  QCACHE_KV=${KCC_KV:-kc4,kc2} QCACHE_VARIANTS=0 QCACHE_SPLITS=0 QCACHE_REF=0 \
  QCACHE_COPY=${KCC_COPY:-on,off} timeout -k 5 ${BENCH_S:-70} python3 bench_gpu_prefill_qcache.py "$OUT/bench_prefill_kccopy.json" 2>&1
echo "bench done at $(( $(date +%s) - start )) s"
P=(python3 -m pytest -p no:cacheprovider --rootdir "$REPO" -q -rfEs --maxfail=20)
T="$REPO/tests_py"
timeout -k 5 ${TEST_S:-50} "${P[@]}" "$T/test_gpu_prefill_sm90_kccopy.py" "$T/test_gpu_prefill_sm90_split.py" \
  "$T/test_gpu_prefill_sm90.py" -k "kc_copy or split or per_channel" > "$OUT/pytest_kccopy.log" 2>&1
echo "tests rc=$?: $(tail -1 "$OUT/pytest_kccopy.log")"
grep -E "^(FAILED|ERROR) " "$OUT/pytest_kccopy.log" | cut -c1-300 | head -10
timeout -k 5 ${SAN_S:-25} compute-sanitizer --tool memcheck --error-exitcode 9 "${P[@]}" "$T/test_gpu_prefill_sm90_kccopy.py" \
  -k "${KCC_SAN_K:-float64 and kc-u4-u2-d64 and not auto}" > "$OUT/memcheck_kccopy.log" 2>&1
echo "memcheck rc=$?: $(tail -1 "$OUT/memcheck_kccopy.log")"; grep -E "^========= (Invalid|Error)" "$OUT/memcheck_kccopy.log" | head -4
(cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log)
echo "total $(( $(date +%s) - start )) s"
