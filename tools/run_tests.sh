#!/usr/bin/env bash
# The whole test suite: googletest (tests_cpp/, built here with ctest) and pytest (tests_py/, against the installed
# lowbit). Installs the test-only dependencies it needs (pytest; HF transformers as the correctness peer, with
# sentencepiece + protobuf for the tokenizer references; the pinned CPU torch used by the reference implementations;
# lowbit serve's extra with the openai and httpx clients; compressed-tensors for the checkpoint-format cross-checks).
# Usage: bash tools/run_tests.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
jobs=$(nproc 2>/dev/null || echo 2)

python -m pip install -q "torch==2.13.0" "pytest>=7" "transformers>=4.46" "accelerate>=0.30" sentencepiece protobuf \
  fastapi uvicorn prometheus-client openai httpx `# lowbit serve and its test clients` \
  "compressed-tensors>=0.20"  # cross-checks the HF quantized-checkpoint reader and the compressed-tensors export

echo "=== googletest"
# The C++ tests need no CUDA kernels (GPU code is compiled by the package build); LOWBIT_TEST_CUDA=ON adds them.
mkdir -p build
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B build/tests "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DLOWBIT_CUDA="${LOWBIT_TEST_CUDA:-OFF}" \
      -DLOWBIT_BUILD_TESTS=ON -DLOWBIT_BUILD_EXAMPLES=ON >build/tests.configure.log 2>&1 \
  || { cat build/tests.configure.log; exit 1; }
cmake --build build/tests -j "$jobs"
ctest --test-dir build/tests --output-on-failure -j "$jobs"

echo "=== embedding: an outside CMake project links the installed library via find_package(lowbit)"
cmake --install build/tests --prefix build/install >/dev/null
cmake -S examples/find_package -B build/consumer "${gen[@]}" -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/consumer
build/consumer/embed_example

echo "=== pytest"
python -c "import lowbit._core" 2>/dev/null || { echo "lowbit is not installed: run 'pip install .' first"; exit 1; }
# Run from a neutral folder so that `import lowbit` is the installed package, not the source tree.
repo=$(pwd)
cd build && python -m pytest "$repo/tests_py" -q -p no:cacheprovider "$@"
