#!/usr/bin/env bash
# The sm_90 prefill kernel over long cached prefixes in one short device call, on the package as users get it:
# install (the sm80-family kernels for sm_90 only, the rare head dims left out), tools/bench_gpu_prefill_qcache.py on
# one chunk of 64 / 256 / 1024 tokens over 8K and 32K (u8 / u4 / u2 with the dequantized copy's rule and without it,
# kc4 with the placed-field and the previous extraction; SDPA and the f16 cache beside them), then the copy's tests and
# the per-channel bit-identity tests in one pytest process, then memcheck over a small copy case. Every step capped.
# Knobs: P32K_COPY (the copy settings, default auto,off; "on" forces the copy), P32K_REF=0 (no previous-extraction
# timing), P32K_KV, P32K_CASES, P32K_FRESH; P32K_ENGINE=1 then runs tools/bench_gpu_long_context.py with
# P32K_ENGINE_ARGS (default: a u4 cache with the copy's rule and with the copy off, one 32K prompt in the engine's
# 2048-token chunks, 8 layers), capped at ENGINE_S.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_script_setup.sh"
start=$(date +%s)
install_package CMAKE_ARGS="-DLOWBIT_CUDA_ARCHS_SM80=90" LOWBIT_ATTN_ALL_INSTANCES=OFF
enter_work_dir p32k
QCACHE_FRESH=${P32K_FRESH:-} QCACHE_CHUNKED=${P32K_CASES:-1:8192:64,1:8192:256,1:8192:1024,1:32768:64,1:32768:256,1:32768:1024} \
  QCACHE_KV=${P32K_KV:-u8,u4,u2,kc4} QCACHE_VARIANTS=0 QCACHE_SPLITS=0 QCACHE_REF=${P32K_REF:-1} QCACHE_REF_KV=kc4 \
  QCACHE_COPY=${P32K_COPY:-auto,off} timeout -k 5 ${BENCH_S:-50} python3 bench_gpu_prefill_qcache.py "$OUT/bench_prefill_32k.json" 2>&1
echo "bench done at $(( $(date +%s) - start )) s"
P=(python3 -m pytest -p no:cacheprovider --rootdir "$REPO" -q -rfEs --maxfail=20)
T="$REPO/tests_py"
timeout -k 5 ${TEST_S:-45} "${P[@]}" "$T/test_gpu_prefill_sm90_copy.py" "$T/test_gpu_prefill_sm90_dequant.py" \
  -k "copy or per_channel" > "$OUT/pytest_copy_kc.log" 2>&1
echo "copy + per-channel tests rc=$?: $(tail -1 "$OUT/pytest_copy_kc.log")"
grep -E "^(FAILED|ERROR) " "$OUT/pytest_copy_kc.log" | cut -c1-300 | head -10
timeout -k 5 ${SAN_S:-25} compute-sanitizer --tool memcheck --error-exitcode 9 "${P[@]}" "$T/test_gpu_prefill_sm90_copy.py" \
  -k "${P32K_SAN_K:-bit_identical and 9-3-d64-bs24 and u4-u2 and chunked}" > "$OUT/memcheck_copy.log" 2>&1
echo "memcheck rc=$?: $(tail -1 "$OUT/memcheck_copy.log")"; grep -E "^========= (Invalid|Error)" "$OUT/memcheck_copy.log" | head -4
if [ "${P32K_ENGINE:-0}" = 1 ]; then
  read -r -a EARGS <<< "${P32K_ENGINE_ARGS:---context 32768 --new 4 --batches 1 --layers 8 --max-batch-tokens 2048 --recipes w4a16kv4,w4a16kv4+prefill_dequant_copy=off}"
  timeout -k 5 ${ENGINE_S:-120} python3 bench_gpu_long_context.py "$OUT/engine_prefill_copy.json" "${EARGS[@]}" \
    > "$OUT/engine.log" 2>&1
  echo "engine rc=$?"; grep -E '^\{|^\|' "$OUT/engine.log" | tail -8
fi
(cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log)
echo "total $(( $(date +%s) - start )) s"
