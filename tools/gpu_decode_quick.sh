#!/usr/bin/env bash
# The decode attention kernel's check in one short device call, on the package as users get it: install; a same-call
# A/B of the kernel alone (HARNESS, default tools/bench_decode_attention_shipped.cu: the shipped instances, ring
# included; built from this tree and from OLD_TREE, a folder whose cpp/ holds the baseline decode_attention_sm80.cuh
# and whose tools/ holds its harness; both built while the package installs; run old, new, old, new) and
# tools/bench_gpu_kv2.py (the op vs SDPA fp16, KV2_FORMATS, default kv4,kv2), each alone on the GPU; then the decode
# tests (test_gpu_attention.py and the 2-bit decode cases of test_gpu_kv2.py), memcheck, racecheck and synccheck over
# small 2-bit and 4-bit cases (SANITIZERS; one process per GPU at a time), each capped at SIDE_S (correctness only:
# nothing is timed then; TOTAL_S, when set, shortens SIDE_S to what is left of that many seconds from the start). Logs and JSON
# in $OUT (logs in one archive: a device call brings back at most 8 files). NO_HARNESS=1 skips the kernel-alone A/B
# (the op's bench then splits its time into the decode kernel and the split merge from the same profile).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_script_setup.sh"
T0=$(date +%s)
BIN=$(mktemp -d /tmp/lowbit-dv.XXXX)
NVCC=(nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I "$REPO/include")
HARNESS=${HARNESS:-tools/bench_decode_attention_shipped.cu}
[ "${NO_HARNESS:-0}" = 1 ] || (
  [ -n "${OLD_TREE:-}" ] && "${NVCC[@]}" -I "$OLD_TREE/cpp" -I "$REPO/cpp" "$OLD_TREE/$HARNESS" \
    -o "$BIN/dv_old" > "$OUT/harness_old.log" 2>&1 &
  "${NVCC[@]}" -I "$REPO/cpp" "$REPO/$HARNESS" -o "$BIN/dv_new" > "$OUT/harness_new.log" 2>&1
  wait
) &
HARNESS_PID=$!
start=$(date +%s)
install_package
wait $HARNESS_PID
echo "harness built at $(( $(date +%s) - start )) s"
[ "${NO_HARNESS:-0}" = 1 ] || for bin in dv_old dv_new dv_old dv_new; do
  [ -x "$BIN/$bin" ] || { echo "no $bin"; tail -5 "$OUT/harness_${bin#dv_}.log"; continue; }
  echo "-- $bin"; timeout -k 5 60 "$BIN/$bin" 2>&1 | tee -a "$OUT/variants.log"
done
enter_work_dir quick
KV2_FORMATS=${KV2_FORMATS:-kv4,kv2} timeout -k 5 ${BENCH_S:-120} python3 "$REPO/tools/bench_gpu_kv2.py" "$OUT/bench_kv2.json" 2>&1 | tail -30
P=(python3 -m pytest -p no:cacheprovider --rootdir "$REPO" -q -rfEs)
T="$REPO/tests_py"
SIDE_S=${SIDE_S:-110}
if [ -n "${TOTAL_S:-}" ]; then left=$(( TOTAL_S - ($(date +%s) - T0) - 10 )); [ "$left" -lt "$SIDE_S" ] && SIDE_S=$left; fi
# One pytest process per GPU at a time: the tests and the three sanitizers run in rounds of as many as there are GPUs
# (each pinned to one), every job capped at SIDE_S.
NGPU=$(nvidia-smi -L | wc -l); [ "$NGPU" -ge 1 ] || NGPU=1
echo "== decode tests and sanitizers, $NGPU at a time (each capped at $SIDE_S s)"
decode_tests() {
  timeout -k 5 $SIDE_S "${P[@]}" "$T/test_gpu_attention.py" "$T/test_gpu_kv2.py" "$T/test_gpu_decode_splits.py" --maxfail=40 \
    -k "decode_attention" > "$OUT/pytest_decode.log" 2>&1; echo "tests rc=$?"; tail -2 "$OUT/pytest_decode.log"
  grep -E "^(FAILED|ERROR) " "$OUT/pytest_decode.log" | cut -c1-300 | head -20
}
E="lens1-0-9-3-64 or lens2-64-24-2-128 or 128-u2-u2 or 64-32-u4-u2 or (float64 and lens2-64-32-8-128 and not 2bit) or (straddling and 16-40) or (forced_splits and (lens3 or lens4))"
sanitize() {
  timeout -k 5 $SIDE_S compute-sanitizer --tool $1 --error-exitcode 9 "${P[@]}" "$T/test_gpu_kv2.py" \
    "$T/test_gpu_kv_per_channel.py" "$T/test_gpu_attention.py" "$T/test_gpu_decode_splits.py" -k "$E" > "$OUT/${1}_decode.log" 2>&1
  echo "$1 rc=$?"; tail -1 "$OUT/${1}_decode.log"
  grep -E "^(FAILED|ERROR) |^========= (Invalid|Race|Error|Barrier)" "$OUT/${1}_decode.log" | head -4
}
i=0
JOBS=(decode_tests); for t in ${SANITIZERS:-memcheck racecheck synccheck}; do JOBS+=("sanitize $t"); done
for job in "${JOBS[@]}"; do
  (export CUDA_VISIBLE_DEVICES=$(( i % NGPU )); $job) &
  i=$(( i + 1 )); [ $(( i % NGPU )) -eq 0 ] && wait
done
wait
(cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log)
