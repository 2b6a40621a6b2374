#!/usr/bin/env bash
# The per-token decode kernel under ncu, without installing the package: tools/bench_decode_attention_shipped.cu built
# from this tree (and from OLD_TREE, a folder with the baseline's cpp/ and tools/, when set), one launch of u4/u4 at
# 64 x 8K (split 4096) and 1 x 128K (split 2000) with `ncu --set full`, the SDPA f16 kernels at the same shapes (speed
# of light and memory sections), then the harness's sweep (ring depth, L2 prefetch hint, split size) and both trees'
# shipped timings (twice, alternating). Reports and text pages in $OUT/ncu.tgz; the key lines printed. NO_NCU=1: only
# the sweep and the timings.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$REPO/gpu_out}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
W=$(mktemp -d /tmp/lowbit-ncu.XXXX)
NVCC=(nvcc -std=c++17 -O3 -lineinfo --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I "$REPO/include")
"${NVCC[@]}" -I "$REPO/cpp" "$REPO/tools/bench_decode_attention_shipped.cu" -o "$W/ds_new" > "$W/build_new.log" 2>&1 &
[ -n "${OLD_TREE:-}" ] && "${NVCC[@]}" -I "$OLD_TREE/cpp" -I "$REPO/cpp" "$OLD_TREE/tools/bench_decode_attention_shipped.cu" \
  -o "$W/ds_old" > "$W/build_old.log" 2>&1 &
wait
[ -x "$W/ds_new" ] || { tail -20 "$W/build_new.log"; exit 1; }
KEYS="Duration|DRAM Throughput|Memory Throughput|L2 Hit Rate|L1/TEX Hit|Achieved Occupancy|Theoretical Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|Issued Warp Per|No Eligible|Active Warps Per|Eligible Warps|Mem Busy|Max Bandwidth|Executed Ipc A|Block Limit"
[ "${NO_NCU:-0}" = 1 ] || for shape in "64 8192 4096" "1 131072 2000"; do
  tag=$(echo "$shape" | tr ' ' '_')
  timeout -k 5 150 ncu --set full --import-source yes --clock-control none -k regex:decode_attention --launch-count 1 \
    -o "$W/kv4_$tag" "$W/ds_new" once $shape > "$W/ncu_kv4_$tag.log" 2>&1 || tail -5 "$W/ncu_kv4_$tag.log"
  ncu -i "$W/kv4_$tag.ncu-rep" --page details > "$W/kv4_${tag}_details.txt" 2>&1
  ncu -i "$W/kv4_$tag.ncu-rep" --page raw > "$W/kv4_${tag}_raw.txt" 2>&1
  ncu -i "$W/kv4_$tag.ncu-rep" --page source --csv --print-source sass > "$W/kv4_${tag}_sass.csv" 2>/dev/null || true
  echo "== kv4 u4/u4 $shape"; grep -E "$KEYS" "$W/kv4_${tag}_details.txt" | sed 's/  */ /g'
  grep -E "dram__bytes_read.sum |smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active.ratio" "$W/kv4_${tag}_raw.txt" \
    | awk '{print $1, $(NF-1), $NF}' | sort -k3 -g -r | head -14
done
cat > "$W/sdpa.py" <<'EOF'
import sys, torch, torch.nn.functional as F
b, length = int(sys.argv[1]), int(sys.argv[2])
q = torch.randn(b, 32, 1, 128, device="cuda").half()
k = torch.randn(b, 8, length, 128, device="cuda").half()
v = torch.randn(b, 8, length, 128, device="cuda").half()
for _ in range(4):
    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
torch.cuda.synchronize()
EOF
[ "${NO_NCU:-0}" = 1 ] || for shape in "64 8192" "1 131072"; do
  tag=$(echo "$shape" | tr ' ' '_')
  timeout -k 5 90 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --clock-control none \
    -k regex:"flash|fmha|attention" --launch-skip 2 --launch-count 2 -o "$W/sdpa_$tag" python3 "$W/sdpa.py" $shape \
    > "$W/ncu_sdpa_$tag.log" 2>&1 || tail -5 "$W/ncu_sdpa_$tag.log"
  ncu -i "$W/sdpa_$tag.ncu-rep" --page details > "$W/sdpa_${tag}_details.txt" 2>&1
  echo "== SDPA f16 $shape"; grep -E "^  [a-z_:]|$KEYS" "$W/sdpa_${tag}_details.txt" | grep -vE "Registers|Block Limit" | sed 's/  */ /g'
done
echo "== sweep (this tree)"; timeout -k 5 120 "$W/ds_new" sweep 2>&1 | tee "$W/sweep.log"
for bin in ds_old ds_new ds_old ds_new; do
  [ -x "$W/$bin" ] && { echo "== $bin shipped"; timeout -k 5 60 "$W/$bin" 2>&1 | tee -a "$W/shipped.log"; }
done
cp "$W"/*.log "$W"/*.txt "$W"/*.csv "$OUT"/ 2>/dev/null
(cd "$W" && tar czf "$OUT/ncu.tgz" *.ncu-rep *.txt *.csv *.log 2>/dev/null)
(cd "$OUT" && tar czf text.tgz *.log *.txt *.csv 2>/dev/null && rm -f *.log *_details.txt *_raw.txt *.csv)
ls -la "$OUT"
