#!/usr/bin/env bash
# FlashInfer as a second attention peer, in one device call: install lowbit (the README's install), unpack the
# peer's files (PEERS_TAR: the archive tools/pack_flashinfer_peer.sh builds, carried under build/: the flashinfer
# package and the four it imports that the device lacks; FlashInfer JIT-compiles its kernels with the device's nvcc
# into $FLASHINFER_WORKSPACE_BASE) into a folder put on PYTHONPATH for the benchmark only, then
# tools/bench_gpu_flashinfer.py (FLASHINFER_* knobs pass through) capped at BENCH_S. JSON and logs in $OUT.
# REUSE_INSTALL=1 skips the install when a lowbit package already imports from outside the tree (a warm machine
# right after a call that installed this same tree).
source "$(dirname "${BASH_SOURCE[0]}")/gpu_script_setup.sh"
PEERS=$(mktemp -d /tmp/peers.XXXX)
(tar -xJf "${PEERS_TAR:?a tar.xz of the peer packages}" -C "$PEERS" && echo "peers unpacked") &
if [ "${REUSE_INSTALL:-0}" = 1 ] && (cd /tmp && python3 -c "import torch, lowbit" 2>/dev/null); then
  echo "reusing the installed package"
else
  install_package
fi
wait
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-jit}
export MAX_JOBS=${MAX_JOBS:-16}
enter_work_dir flashinfer
PYTHONPATH="$PEERS" timeout -k 5 "${BENCH_S:-400}" python3 bench_gpu_flashinfer.py "$OUT/bench_flashinfer.json" \
  2>&1 | tee "$OUT/bench_flashinfer.log" | grep -v "^\s*$" | tail -40
