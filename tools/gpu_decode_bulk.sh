#!/usr/bin/env bash
# The decode ring's bulk copies checked and measured in one short device call. While the package installs (the
# README's install): the ring check (tools/check_decode_ring.cu: registers vs the ring with the lanes' copies vs the
# bulk ring, float tolerance 1e-5), compute-sanitizer memcheck / racecheck / synccheck over its small cases (both rings,
# partial tiles, pages straddling tiles, misaligned parameters), and ncu (DRAM throughput, instructions, stalls) of the
# u4/u4 kernel alone with each ring at 64 x 8K and 1 x 128K, then the same-process A/B of the kernel alone
# (tools/bench_decode_attention_shipped.cu `ab`). Then, each alone on the GPU: the op vs SDPA fp16 (tools/bench_gpu_kv2.py,
# kv4 and kv2) and the decode attention tests from the installed package that reach 4- and 2-bit instances (TESTS_K). BIN: a folder with ds and cr prebuilt for sm_90a
# (built here when missing); DEADLINE_S caps the whole script (the tests get what is left).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_script_setup.sh"
T0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-200}
left() { echo $(( DEADLINE_S - ($(date +%s) - T0) )); }
BIN=${BIN:-$REPO/build/decode-bin}
NVCC=(nvcc -std=c++17 -O3 -lineinfo --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I "$REPO/include" -I "$REPO/cpp")
[ -x "$BIN/ds" ] || { mkdir -p "$BIN"; "${NVCC[@]}" "$REPO/tools/bench_decode_attention_shipped.cu" -o "$BIN/ds"; }
[ -x "$BIN/cr" ] || "${NVCC[@]}" "$REPO/tools/check_decode_ring.cu" -o "$BIN/cr"
(install_package CMAKE_BUILD_PARALLEL_LEVEL=14) > "$OUT/install.txt" 2>&1 &
INSTALL_PID=$!
echo "== ring check (registers vs lanes' ring vs bulk ring)"
timeout -k 5 60 "$BIN/cr" > "$OUT/check.log" 2>&1; echo "check rc=$?"; tail -1 "$OUT/check.log"
for tool in memcheck racecheck synccheck; do
  timeout -k 5 60 compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/cr" small > "$OUT/san_$tool.log" 2>&1
  echo "$tool rc=$?"; tail -2 "$OUT/san_$tool.log"
done
M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,smsp__inst_executed.sum
M=$M,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
M=$M,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio
M=$M,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio
M=$M,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio
M=$M,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
for shape in "64 8192 8192" "1 131072 4000"; do
  for v in lanes bulk; do
    echo "== ncu u4/u4 $shape $v"
    timeout -k 5 60 ncu --clock-control none --metrics "$M" -k regex:decode_attention --launch-count 1 \
      "$BIN/ds" once $shape $v > "$OUT/ncu_${shape// /_}_$v.log" 2>&1 || tail -3 "$OUT/ncu_${shape// /_}_$v.log"
    grep -E "^\s+(gpu__|dram__|smsp__|l1tex__)" "$OUT/ncu_${shape// /_}_$v.log" | sed 's/  */ /g'
  done
done
# Alone on the GPU while the package still builds: the timing queues its launches ahead (a busy host cannot stall it).
echo "== kernel alone, lanes' ring vs bulk ring, same process (left $(left) s)"
timeout -k 5 90 "$BIN/ds" ab 2>&1 | tee "$OUT/ab.log"
wait $INSTALL_PID; cat "$OUT/install.txt"
enter_work_dir bulk
echo "== op vs SDPA (left $(left) s)"
KV2_FORMATS=kv4,kv2 timeout -k 5 120 python3 "$REPO/tools/bench_gpu_kv2.py" "$OUT/bench_kv2.json" 2>&1 | tee "$OUT/bench_kv2.log"
T="$REPO/tests_py"; cap=$(left); [ "$cap" -gt 20 ] || cap=20
echo "== decode tests (cap $cap s)"
timeout -k 5 $cap python3 -m pytest -p no:cacheprovider --rootdir "$REPO" -q -rfEs "$T/test_gpu_attention.py" \
  "$T/test_gpu_kv2.py" "$T/test_gpu_decode_splits.py" --maxfail=40 -k "${TESTS_K:-decode_attention and (u4 or u2)}" > "$OUT/pytest_decode.log" 2>&1
echo "tests rc=$?"; tail -2 "$OUT/pytest_decode.log"; grep -E "^(FAILED|ERROR) " "$OUT/pytest_decode.log" | cut -c1-300 | head -20
(cd "$OUT" && tar czf logs.tgz *.log *.txt && rm -f *.log install.txt)
