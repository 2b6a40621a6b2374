#!/usr/bin/env bash
# Quick GPU check of the engine path without the default model: build, the forward-pass op tests and
# the random-model engine tests (CUDA-graph decode included), then memcheck over the graph tests.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
LOWBIT_BUILD_IN_PLACE=1 bash tools/gpu_run.sh none || exit 1
BUILD=$PWD/build/gpu-device
export LOWBIT_DEV_BUILD=$BUILD/python_ext PYTHONPATH=$BUILD/lazy_import:$PWD/python:$PWD/tools${PYTHONPATH:+:$PYTHONPATH}
python3 -m pytest tests_py/test_gpu_engine.py tests_py/test_gpu_ops.py -q -rfEs -p no:cacheprovider -k "not smollm2" \
  2>&1 | tee "$OUT/pytest_quick.log" | tail -30
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
  tests_py/test_gpu_engine.py -k "(graphs_agree and w4a16kv8) or mixed_greedy" > "$OUT/memcheck_graphs.log" 2>&1
echo "memcheck graphs rc=$?"; tail -3 "$OUT/memcheck_graphs.log"
