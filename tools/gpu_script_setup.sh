# Sourced by the one-call device scripts (gpu_prefill_*.sh, gpu_decode_quick.sh): the repository root, $OUT (the
# folder whose files come back), the device line, and two helpers.
#   install_package [VAR=value ...]  pip install --no-build-isolation --no-deps . (the README's install, without
#                                    network; VAR=value pairs are extra build environment), its log in $OUT/build.log,
#                                    then the build time and any register spills; exits the script when it fails
#   enter_work_dir NAME              cd into a fresh /tmp/lowbit-NAME.XXXX (tests then import the installed package,
#                                    not the source tree) holding a copy of tools/*.py
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$REPO/gpu_out}; mkdir -p "$OUT"; export OUT PYTHONUNBUFFERED=1 LOWBIT_COMMIT=${LOWBIT_COMMIT:-unknown}
unset LOWBIT_DEV_BUILD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"

install_package() {
  local start
  start=$(date +%s)
  (cd "$REPO" && env CMAKE_BUILD_PARALLEL_LEVEL=16 "$@" python3 -m pip install --no-build-isolation --no-deps -v . \
    > "$OUT/build.log" 2>&1) || { tail -30 "$OUT/build.log"; exit 1; }
  echo "build $(( $(date +%s) - start )) s"; grep -E "[1-9][0-9]* bytes spill" "$OUT/build.log" | sort | uniq -c | head
  grep -E "lowbit: (NCCL|cuBLASLt)" "$OUT/build.log" | sed 's/.*lowbit:/lowbit:/' | sort -u
}

enter_work_dir() {
  cd "$(mktemp -d "/tmp/lowbit-$1.XXXX")" && cp "$REPO"/tools/*.py .
}
