#!/usr/bin/env bash
# The sm_90 prefill kernel's u4 / u2 dequantization (fields masked in place) against the previous one (kernel option
# prefill_ref_dequant) in one short device call, on the package as users get it: install (the sm80-family kernels
# for sm_90 only, the rare head dims left out), tools/bench_gpu_prefill_qcache.py with QCACHE_REF=1 (u8 / u4 / u2 and
# both u4 / u2 dequantizations in one process, SDPA and the f16 cache beside them), the bit-identity tests, then the
# u4 / u2 slices of the three Hopper prefill test files (float64 references), one pytest process at a time, and
# memcheck over one small u4 case. Every step capped. Logs and JSON in $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_script_setup.sh"
start=$(date +%s)
install_package CMAKE_ARGS="-DLOWBIT_CUDA_ARCHS_SM80=90" LOWBIT_ATTN_ALL_INSTANCES=OFF
enter_work_dir u4
QCACHE_FRESH=${U4_FRESH:-8192} QCACHE_CHUNKED=${U4_CASES:-1:8192:64,1:8192:256,1:8192:1024,1:32768:256} \
  QCACHE_KV=u8,u4,u2 QCACHE_VARIANTS=0 QCACHE_SPLITS=0 QCACHE_REF=1 \
  timeout -k 5 ${BENCH_S:-60} python3 bench_gpu_prefill_qcache.py "$OUT/bench_prefill_u4.json" 2>&1
P=(python3 -m pytest -p no:cacheprovider --rootdir "$REPO" -q -rfEs --maxfail=20)
T="$REPO/tests_py"
step() {  # name, seconds, pytest arguments...
  local name=$1 secs=$2; shift 2
  timeout -k 5 "$secs" "${P[@]}" "$@" > "$OUT/pytest_$name.log" 2>&1
  echo "$name rc=$?: $(tail -1 "$OUT/pytest_$name.log")"; grep -E "^(FAILED|ERROR) " "$OUT/pytest_$name.log" | cut -c1-300 | head -8
}
step dequant_bits ${BITS_S:-30} "$T/test_gpu_prefill_sm90_dequant.py"
step sm90 ${SM90_S:-40} "$T/test_gpu_prefill_sm90.py" -k "u4 or u2"
step pack ${PACK_S:-30} "$T/test_gpu_prefill_sm90_pack.py" -k "u4 or u2"
step split ${SPLIT_S:-30} "$T/test_gpu_prefill_sm90_split.py" -k "u4 or u2"
timeout -k 5 ${SAN_S:-25} compute-sanitizer --tool memcheck --error-exitcode 9 "${P[@]}" "$T/test_gpu_prefill_sm90_pack.py" \
  -k "32-8-d128-bs32 and chunked and u4-u4" > "$OUT/memcheck_u4.log" 2>&1
echo "memcheck rc=$?: $(tail -1 "$OUT/memcheck_u4.log")"; grep -E "^========= (Invalid|Error)" "$OUT/memcheck_u4.log" | head -4
(cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log)
echo "total $(( $(date +%s) - start )) s"
