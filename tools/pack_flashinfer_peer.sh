#!/usr/bin/env bash
# Builds the archive tools/gpu_flashinfer.sh unpacks on the device (which has no network): FlashInfer's Python
# package and the four packages it imports that the device lacks (apache-tvm-ffi, built for the device's Python;
# nvidia-ml-py, einops, tabulate), unpacked from their wheels, with the CUDA sources of kernel families the benchmark
# never compiles (MoE, Blackwell / sm_100+ / sm_120 kernels, the vendored TensorRT-LLM sources) left out so the
# archive stays well under a device call's 64 MiB carry. FlashInfer JIT-compiles the kernels it uses from the sources
# that remain. usage: tools/pack_flashinfer_peer.sh OUT.tar.xz [PYTHON_VERSION (default 3.12)]
set -euo pipefail
OUT=$(realpath -m "${1:?usage: pack_flashinfer_peer.sh OUT.tar.xz [python version]}")
PY=${2:-3.12}
FLASHINFER=${FLASHINFER_VERSION:-0.7.2.post1}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
python3 -m pip download -q --no-deps -d "$WORK/wheels" "flashinfer-python==$FLASHINFER"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --platform manylinux_2_28_x86_64 \
  -d "$WORK/wheels" "apache-tvm-ffi>=0.1.11,<0.2" nvidia-ml-py einops tabulate
mkdir "$WORK/site"
for w in "$WORK"/wheels/*.whl; do python3 -m zipfile -e "$w" "$WORK/site"; done
cd "$WORK/site"
rm -rf ./*.dist-info
find . -name __pycache__ -prune -exec rm -rf {} +
(cd flashinfer/data/csrc && rm -rf cake_* kda gdn experimental blackwell_* alphamoe* ./*sm100* ./*sm103* ./*sm120* nv_internal)
tar -cJf "$OUT" .
echo "$OUT: $(du -h "$OUT" | cut -f1)"
