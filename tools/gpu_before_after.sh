#!/usr/bin/env bash
# Before/after on one GPU in one run: builds two lowbit trees (the "before" one from a tarball made with
# `git archive <commit>`, the "after" one this checkout) into two --target folders, then runs the same
# measurements of this checkout's tools against each, alternating before/after so drift hits both alike:
#   the Llama-3-8B-shaped decode step (tools/profile_gpu_step.py: graphs on, eager, kernels alone) and the
#   8B end-to-end decode/prefill (tools/bench_gpu_llama8b.py, lowbit parts only).
#   usage: bash tools/gpu_before_after.sh BEFORE.tar BEFORE_COMMIT [recipes ("" for none)] [step batches] [8B batches]
# The builds stay in /tmp/lowbit-ba (a second run on the same machine reuses them, so one recipe per run keeps
# each run short). Results: $OUT/before_after.json (both sides' figures) and a table on stdout.
# Optional environment:
#   BA_INSTALL  extra build environment for both builds, e.g. a lean build:
#               BA_INSTALL='CMAKE_ARGS=-DLOWBIT_CUDA_ARCHS_SM80=90 LOWBIT_ATTN_ALL_INSTANCES=OFF'
#   BA_BENCH    ';'-separated commands run once per side before the rest (sides alternating, the order flipped per
#               command); SIDE in a command becomes before / after (name its output "$OUT/x_SIDE.json"); run in the
#               neutral folder with this checkout's tools/*.py copied there
#   BA_TESTS    pytest arguments (tests_py/ file names, -k) run against the after build; log in $OUT/ba_tests.log
set -uo pipefail
BEFORE_TAR=$1
BEFORE_COMMIT=$2
RECIPES=${3-w4a16kv8,w8a8kv8}
STEP_BATCHES=${4:-1}
LLAMA_BATCHES=${5:-1,64}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$REPO/gpu_out}
WORK=/tmp/lowbit-ba
mkdir -p "$OUT" "$WORK/before_src"
rm -f "$WORK"/*.json  # this call's measurements only
AFTER_COMMIT=${LOWBIT_COMMIT:-$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo after)}
[ -f "$WORK/before_src/CMakeLists.txt" ] || tar -xf "$BEFORE_TAR" -C "$WORK/before_src" || exit 1

start=$(date +%s)
build() {  # side, source
  [ -f "$WORK/pkg_$1/lowbit/__init__.py" ] && { echo "build $1: kept from an earlier call"; return; }
  # shellcheck disable=SC2086  # BA_INSTALL is VAR=value words
  env CMAKE_BUILD_PARALLEL_LEVEL=8 ${BA_INSTALL:-} python3 -m pip install --no-build-isolation --no-deps \
    --target "$WORK/pkg_$1" "$2" > "$OUT/build_$1.log" 2>&1
  echo "build $1 rc=$? in $(( $(date +%s) - start )) s"
}
build before "$WORK/before_src" &
build after "$REPO" &
wait
[ -f "$WORK/pkg_before/lowbit/__init__.py" ] && [ -f "$WORK/pkg_after/lowbit/__init__.py" ] || {
  tail -20 "$OUT"/build_*.log; exit 1; }

cd "$WORK"  # neutral folder: `import lowbit` is the --target package named by PYTHONPATH
run_side() {  # side, name, command...
  local side=$1 name=$2; shift 2
  local commit=$BEFORE_COMMIT; [ "$side" = after ] && commit=$AFTER_COMMIT
  PYTHONPATH="$WORK/pkg_$side${PYTHONPATH:+:$PYTHONPATH}" LOWBIT_COMMIT=$commit timeout 240 "$@" \
    > "$OUT/ba_${side}_$name.log" 2>&1
  echo "  $side $name rc=$? ($(( $(date +%s) - start )) s)"
}
cp "$REPO"/tools/*.py "$WORK"/
IFS=';' read -r -a benches <<< "${BA_BENCH:-}"
order=(before after)
n=0
for b in "${benches[@]}"; do
  [ -n "${b// }" ] || continue
  n=$((n + 1))
  for side in "${order[@]}"; do
    run_side "$side" "bench$n" bash -c "${b//SIDE/$side}"
    tail -40 "$OUT/ba_${side}_bench$n.log"
  done
  order=("${order[1]}" "${order[0]}")
done
if [ -n "${BA_TESTS:-}" ]; then
  eval "targs=($BA_TESTS)"
  for i in "${!targs[@]}"; do [[ "${targs[$i]}" == *.py* ]] && targs[$i]="$REPO/tests_py/${targs[$i]}"; done
  PYTHONPATH="$WORK/pkg_after${PYTHONPATH:+:$PYTHONPATH}" timeout 300 python3 -m pytest -p no:cacheprovider \
    --rootdir "$REPO" -q -rfEs --maxfail=20 "${targs[@]}" > "$OUT/ba_tests.log" 2>&1
  echo "== tests rc=$?: $(tail -1 "$OUT/ba_tests.log") ($(( $(date +%s) - start )) s)"
  grep -E "^(FAILED|ERROR) " "$OUT/ba_tests.log" | cut -c1-300 | head -10
fi
IFS=, read -r -a recipes <<< "$RECIPES"
IFS=, read -r -a batches <<< "$STEP_BATCHES"
order=(before after)
for recipe in "${recipes[@]}"; do
  for b in "${batches[@]}"; do
    for side in "${order[@]}"; do
      run_side "$side" "step_${recipe}_b$b" python3 "$REPO/tools/profile_gpu_step.py" \
        "$WORK/${side}_step_${recipe}_b$b.json" --recipe "$recipe" --batch "$b" --steps 32
    done
    order=("${order[1]}" "${order[0]}")
  done
  for side in "${order[@]}"; do
    run_side "$side" "llama8b_$recipe" python3 "$REPO/tools/bench_gpu_llama8b.py" \
      "$WORK/${side}_llama8b_$recipe.json" --parts lowbit --recipes "$recipe" --batches "$LLAMA_BATCHES" --repeats 3 \
      --part-timeout 200
  done
  order=("${order[1]}" "${order[0]}")
done

python3 - "$WORK" "$OUT/before_after.json" "$BEFORE_COMMIT" "$AFTER_COMMIT" <<'EOF'
import glob, json, os, sys
work, out, before, after = sys.argv[1:]
res = {"before_commit": before, "after_commit": after, "step": {}, "llama8b": {}}
for f in sorted(glob.glob(os.path.join(work, "*_step_*.json"))):
    side, _, key = os.path.basename(f)[:-5].partition("_step_")
    d = json.load(open(f))
    res["step"].setdefault(key, {})[side] = {k: d.get(k) for k in ("step_ms_graphs", "step_ms_eager",
                                                                    "kernel_ms_per_step", "prefill_kernel_ms")}
    res["device"] = d.get("device")
for f in sorted(glob.glob(os.path.join(work, "*_llama8b_*.json"))):
    side, _, recipe = os.path.basename(f)[:-5].partition("_llama8b_")
    d = json.load(open(f))
    for part in d.get("parts", {}).values() if isinstance(d.get("parts"), dict) else d.get("parts", []):
        for c in part.get("cases", []):
            if "decode_tok_s" in c:
                res["llama8b"].setdefault(f"{recipe}_b{c['batch']}", {})[side] = {
                    k: c.get(k) for k in ("decode_tok_s", "decode_ms_per_step", "prefill_tok_s", "e2e_tok_s")}
json.dump(res, open(out, "w"), indent=1)
print(f"\nbefore {before} / after {after} on {res.get('device')}")
print(f"{'decode step (ms)':28s} {'before':>9s} {'after':>9s} {'after/before':>12s}")
for key, v in res["step"].items():
    for m in ("step_ms_graphs", "kernel_ms_per_step", "prefill_kernel_ms"):
        b, a = (v.get(s, {}).get(m) for s in ("before", "after"))
        ratio = f"{a / b:12.3f}" if a and b else f"{'-':>12s}"
        print(f"{key + ' ' + m.replace('_ms', '').replace('_per_step', ''):28.28s} {b or 0:9.3f} {a or 0:9.3f} {ratio}")
print(f"{'8B end to end (tok/s)':28s} {'before':>9s} {'after':>9s} {'after/before':>12s}")
for key, v in res["llama8b"].items():
    for m in ("decode_tok_s", "prefill_tok_s"):
        b, a = (v.get(s, {}).get(m) for s in ("before", "after"))
        ratio = f"{a / b:12.3f}" if a and b else f"{'-':>12s}"
        print(f"{key + ' ' + m:28.28s} {b or 0:9.1f} {a or 0:9.1f} {ratio}")
EOF
