#!/usr/bin/env bash
# The decode ring's bulk copies without the package: the ring check (registers vs the lanes' ring vs the bulk ring),
# synccheck over its small cases, and the kernel-alone A/B (tools/bench_decode_attention_shipped.cu `ab`:
# more splits than tools/gpu_decode_bulk.sh's), from binaries prebuilt for sm_90a in BIN (built here when missing).
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$REPO/gpu_out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
BIN=${BIN:-$REPO/build/decode-bin}
NVCC=(nvcc -std=c++17 -O3 -lineinfo --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I "$REPO/include" -I "$REPO/cpp")
[ -x "$BIN/ds" ] || { mkdir -p "$BIN"; "${NVCC[@]}" "$REPO/tools/bench_decode_attention_shipped.cu" -o "$BIN/ds"; }
[ -x "$BIN/cr" ] || "${NVCC[@]}" "$REPO/tools/check_decode_ring.cu" -o "$BIN/cr"
echo "== kernel alone, lanes' ring vs bulk ring, same process"
timeout -k 5 60 "$BIN/ds" ab 2>&1 | tee "$OUT/ab.log"
echo "== ring check"; timeout -k 5 40 "$BIN/cr" > "$OUT/check.log" 2>&1; echo "check rc=$?"; tail -1 "$OUT/check.log"
for tool in synccheck; do
  timeout -k 5 40 compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/cr" small > "$OUT/san_$tool.log" 2>&1
  echo "$tool rc=$?"; tail -2 "$OUT/san_$tool.log"
done
(cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log)
