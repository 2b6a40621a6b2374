#!/usr/bin/env bash
# A merge's device check in one call, on the package as users get it: install (the README's pip install, without
# network), then the benchmarks the merge needs, then chosen test groups from a folder outside the source tree
# (torch imported first by tests_py/conftest.py), then compute-sanitizer over a few small cases; logs come back in
# $OUT/logs.tgz, JSONs beside it. Benchmarks run before the tests so a call cut short still has its timings.
#   MC_BENCH    ';'-separated commands run in the work folder (a copy of tools/*.py), each capped by MC_BENCH_S
#               (default 120 s); write JSONs to "$OUT/..."
#   MC_GROUPS   ';'-separated pytest argument lists (file names under tests_py/, -k as shell words), each capped by
#               MC_TEST_S (default 90 s)
#   MC_SAN      one pytest argument list for memcheck, racecheck and synccheck (each capped by MC_SAN_S, default 40 s;
#               MC_SAN_TOOLS picks fewer)
#   MC_INSTALL  extra build environment for the install, e.g. a lean build for a timing-only call:
#               MC_INSTALL='CMAKE_ARGS=-DLOWBIT_CUDA_ARCHS_SM80=90 LOWBIT_ATTN_ALL_INSTANCES=OFF'
source "$(dirname "${BASH_SOURCE[0]}")/gpu_script_setup.sh"
start=$(date +%s)
# shellcheck disable=SC2086  # MC_INSTALL is VAR=value words
install_package ${MC_INSTALL:-}
enter_work_dir merge
T="$REPO/tests_py"
P=(python3 -m pytest -p no:cacheprovider --rootdir "$REPO" -q -rfEs --maxfail=20)
stamp() { echo "   at $(( $(date +%s) - start )) s"; }

IFS=';' read -r -a benches <<< "${MC_BENCH:-}"
for b in "${benches[@]}"; do
  [ -n "${b// }" ] || continue
  echo "== bench: $b"
  timeout -k 5 "${MC_BENCH_S:-120}" bash -c "$b" 2>&1 | tail -60
  stamp
done

IFS=';' read -r -a groups <<< "${MC_GROUPS:-}"
g=0
for group in "${groups[@]}"; do
  eval "args=($group)"
  [ ${#args[@]} -gt 0 ] || continue
  g=$((g + 1))
  for i in "${!args[@]}"; do [[ "${args[$i]}" == *.py* ]] && args[$i]="$T/${args[$i]}"; done
  timeout -k 5 "${MC_TEST_S:-90}" "${P[@]}" "${args[@]}" > "$OUT/pytest_$g.log" 2>&1
  echo "== tests $g ($group) rc=$?: $(tail -1 "$OUT/pytest_$g.log")"
  grep -E "^(FAILED|ERROR) " "$OUT/pytest_$g.log" | cut -c1-300 | head -10
  stamp
done

if [ -n "${MC_SAN:-}" ]; then
  eval "san=($MC_SAN)"
  for i in "${!san[@]}"; do [[ "${san[$i]}" == *.py* ]] && san[$i]="$T/${san[$i]}"; done
  IFS=, read -r -a tools <<< "${MC_SAN_TOOLS:-memcheck,racecheck,synccheck}"
  for tool in "${tools[@]}"; do
    timeout -k 5 "${MC_SAN_S:-40}" compute-sanitizer --tool "$tool" --error-exitcode 9 "${P[@]}" "${san[@]}" \
      > "$OUT/${tool}.log" 2>&1
    echo "== $tool rc=$?: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$tool.log" | tail -1) / $(tail -1 "$OUT/$tool.log")"
    grep -E "^========= (Invalid|Error|Race|Barrier)" "$OUT/$tool.log" | head -4
  done
  stamp
fi
(cd "$OUT" && tar czf logs.tgz ./*.log ./*.txt 2>/dev/null && rm -f ./*.log)
echo "total $(( $(date +%s) - start )) s"
