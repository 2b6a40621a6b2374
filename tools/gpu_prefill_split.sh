#!/usr/bin/env bash
# The Hopper prefill kernel's key split in one short device call, on the package as users get it: install (the
# default build), tools/bench_gpu_prefill_qcache.py on single chunks over long prefixes (split plan vs forced no
# split, SDPA and the f16 cache in the same process), then the split's tests, the engine's split test (chunked
# prefill and prefix-cache hits with the plan and with 4 splits forced, against the unsplit kernel: the step before
# the plan became the default), the decode-graph timing test, the packed-heads tests and a regression slice of the Hopper prefill tests, one pytest process at a time
# (parallel ones on one GPU crawl), then memcheck over one small split case. Every step capped. Logs and JSON in $OUT.
source "$(dirname "${BASH_SOURCE[0]}")/gpu_script_setup.sh"
install_package
enter_work_dir split
QCACHE_FRESH= QCACHE_CHUNKED=${SPLIT_CASES:-1:8192:64,1:8192:256,1:8192:1024,1:32768:64,1:32768:256,1:32768:1024} \
  QCACHE_KV=${SPLIT_KV:-u8,u4,u2} QCACHE_VARIANTS=0 QCACHE_SPLITS=0,1 \
  timeout -k 5 ${BENCH_S:-50} python3 bench_gpu_prefill_qcache.py "$OUT/bench_prefill_split.json" 2>&1
P=(python3 -m pytest -p no:cacheprovider --rootdir "$REPO" -q -rfEs --maxfail=30)
T="$REPO/tests_py"
timeout -k 5 ${TEST_S:-70} "${P[@]}" "$T/test_gpu_prefill_sm90_split.py" > "$OUT/pytest_split.log" 2>&1
echo "split tests rc=$?: $(tail -1 "$OUT/pytest_split.log")"; grep -E "^(FAILED|ERROR) " "$OUT/pytest_split.log" | cut -c1-300 | head -12
timeout -k 5 ${ENGINE_S:-120} "${P[@]}" "$T/test_gpu_engine.py" -k "prefill_key_split or decode_graph_timing" \
  > "$OUT/pytest_engine_split.log" 2>&1
echo "engine split tests rc=$?: $(tail -1 "$OUT/pytest_engine_split.log")"
grep -E "^(FAILED|ERROR) " "$OUT/pytest_engine_split.log" | cut -c1-300 | head -8
timeout -k 5 ${REG_S:-30} "${P[@]}" "$T/test_gpu_prefill_sm90.py" -k "chunked and (per_channel or u8-u8 or f16-f16)" \
  > "$OUT/pytest_regression.log" 2>&1
echo "regression rc=$?: $(tail -1 "$OUT/pytest_regression.log")"; grep -E "^(FAILED|ERROR) " "$OUT/pytest_regression.log" | cut -c1-300 | head -8
timeout -k 5 ${SAN_S:-25} compute-sanitizer --tool memcheck --error-exitcode 9 "${P[@]}" "$T/test_gpu_prefill_sm90_split.py" \
  -k "s3 and u8-u8 and 6-6-d64" > "$OUT/memcheck_split.log" 2>&1
echo "memcheck rc=$?: $(tail -1 "$OUT/memcheck_split.log")"; grep -E "^========= (Invalid|Error)" "$OUT/memcheck_split.log" | head -4
timeout -k 5 ${PACK_S:-60} "${P[@]}" "$T/test_gpu_prefill_sm90_pack.py" > "$OUT/pytest_pack.log" 2>&1
echo "pack tests rc=$?: $(tail -1 "$OUT/pytest_pack.log")"; grep -E "^(FAILED|ERROR) " "$OUT/pytest_pack.log" | cut -c1-300 | head -8
# Batch-1 decode of the 8B shape with the decode graphs' device time beside the wall time (the host gap per step).
if [ "${B8_S:-150}" -gt 0 ]; then
  timeout -k 5 ${B8_S:-150} python3 bench_gpu_llama8b.py "$OUT/llama8b_b1_host_gap.json" \
    --parts "lowbit:${B8_RECIPES:-w4a8kv8}" --batches 1 --repeats 3 --part-timeout $(( ${B8_S:-150} - 10 )) 2>&1 | tail -6
fi
