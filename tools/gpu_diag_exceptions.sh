#!/usr/bin/env bash
# Diagnose "a C++ exception crossing the binding segfaults once torch is loaded" on a GPU machine:
# install lowbit as users do, reproduce, list which shared objects the throw path binds to
# (LD_DEBUG=bindings), take a native backtrace (cuda-gdb runs host-only programs too), then
# relink with --exclude-libs over each group of static archives to find the one whose exports clash.
#   usage: tools/gpu_diag_exceptions.sh [bisect]   (results under $OUT, default ./gpu_out)
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# A copy of the tree without the export restriction of cmake/python.cmake (the version script and
# --exclude-libs): the build as it was when the crash was found.
REPO=/tmp/lowbit-unrestricted; rm -rf $REPO; mkdir -p $REPO
tar -C "$PWD" --exclude=./build --exclude=./.git -cf - . | tar -C $REPO -xf -
sed -i '/^if(CMAKE_SYSTEM_NAME STREQUAL "Linux")/,/^endif()/d' $REPO/cmake/python.cmake
FIXED=$PWD
THROW='import torch; from lowbit import _core; _core.parse_recipe("w9a9")'

echo "== environment"
python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.__file__)"
gcc --version | head -1; python3 -m pip list 2>/dev/null | grep -iE "^(nanobind|scikit-build-core|torch|jax|jaxlib|cupy|triton) "
python3 -c "import site; print(site.getsitepackages())"
for d in $(python3 -c "import site; print(' '.join(site.getsitepackages()))"); do ls "$d"/*.pth "$d"/sitecustomize.py 2>/dev/null; done

install() {  # install [extra module linker flags]
  (cd "$REPO" && python3 -m pip install -q --no-build-isolation --no-deps . \
     --config-settings=cmake.define.CMAKE_MODULE_LINKER_FLAGS="${1:-}" > "$OUT/pip_${2:-base}.log" 2>&1) \
    || { echo "install failed"; tail -20 "$OUT/pip_${2:-base}.log"; return 1; }
}
try_throw() {  # prints the return code of the one-line reproduction (139 = SIGSEGV)
  (cd /tmp && timeout 60 python3 -c "$THROW" > /tmp/throw.log 2>&1); local rc=$?
  echo "$1: rc=$rc $(tail -1 /tmp/throw.log | cut -c1-90)"
}

echo "== install as users do (pip install --no-build-isolation --no-deps .)"
start=$(date +%s); install "" base; echo "build $(( $(date +%s) - start )) s"
SO=$(python3 -c "import importlib.util as u; print(u.find_spec('lowbit._core').origin)")
echo "extension: $SO"
echo "exported (defined) dynamic symbols: $(nm -D --defined-only "$SO" | wc -l)," \
     "of them STB_GNU_UNIQUE: $(readelf -W --dyn-syms "$SO" | grep -c ' UNIQUE ')"
echo "NEEDED: $(readelf -d "$SO" | grep NEEDED | sed -E 's/.*\[(.*)\]/\1/' | tr '\n' ' ')"
echo "-- how the C++ runtime was linked"
g++ --version | head -1
for f in libstdc++.so libstdc++.a; do p=$(g++ -print-file-name=$f); echo "$f -> $p $(ls -la "$p" 2>&1 | cut -c1-160)"; done
BUILD=$(ls -d "$REPO"/build/cp3* | head -1)
awk '/^build python_ext\/_core/{f=1} f&&/LINK_(FLAGS|LIBRARIES|PATH)/{print substr($0,1,900)} f&&/TARGET_FILE/{exit}' "$BUILD/build.ninja"
grep -E "CMAKE_(CXX|CUDA)_IMPLICIT_LINK_(LIBRARIES|DIRECTORIES)|CMAKE_CUDA_HOST_IMPLICIT" "$BUILD"/CMakeFiles/*/CMake*Compiler.cmake
echo "-- which file the linker takes for -lstdc++ (relink with --verbose)"
(cd "$BUILD" && rm -f python_ext/_core*.so && ninja -v python_ext/_core.cpython-312-x86_64-linux-gnu.so 2>&1 | grep -E "^\[.*\] .*-o python_ext/_core" | head -1 | cut -c1-1500)
nm -D --defined-only "$SO" | awk '{print $3}' | c++filt | sed -E 's/\(.*//; s/<.*//' | awk -F'::' '{print $1"::"$2}' \
  | sort | uniq -c | sort -rn | head -12
(cd /tmp && timeout 60 python3 -c 'from lowbit import _core; _core.parse_recipe("w9a9")' > /tmp/t0.log 2>&1); echo "without torch: rc=$? $(tail -1 /tmp/t0.log | cut -c1-60)"
try_throw "with torch first"
(cd /tmp && timeout 60 python3 -X faulthandler -c "$THROW" 2>&1 | head -20)

echo "== bindings of the throw path (LD_DEBUG=bindings)"
(cd /tmp && LD_DEBUG=bindings LD_DEBUG_OUTPUT=/tmp/ldb timeout 120 python3 -c "$THROW" > /dev/null 2>&1)
cat /tmp/ldb.* > "$OUT/ld_bindings.txt" 2>/dev/null
echo "-- symbols that _core binds outside itself, libc, libm, libstdc++, libgcc_s, libpython, ld.so:"
grep "binding file $SO" "$OUT/ld_bindings.txt" | grep -v " to $SO " \
  | grep -vE " to [^ ]*/(libc|libm|libstdc\+\+|libgcc_s|libpython[0-9.]*|ld-linux-x86-64)\.so" \
  | sed -E 's/.* to ([^ ]*) .*symbol `([^'"'"']*)'"'"'.*/\1 \2/' | sort | uniq -c | sort -rn | head -40
echo "-- throw-path symbols (cxa, Unwind, personality, exception_ptr) bound anywhere but libstdc++/libgcc_s:"
grep -E "symbol \`(__cxa_|_Unwind_|__gxx_personality|_ZSt17rethrow_exception|_ZSt17current_exception|_ZNSt15__exception_ptr)" \
  "$OUT/ld_bindings.txt" | grep -vE " to [^ ]*/(libstdc\+\+|libgcc_s)\.so" \
  | sed -E 's/.*binding file ([^ ]*) .* to ([^ ]*) .*symbol `([^'"'"']*)'"'"'.*/\1 -> \2 \3/' | sort | uniq -c | head -30
echo "-- who else in the process defines the throw-path symbols:"
(cd /tmp && python3 - <<'EOF'
import torch, subprocess
from lowbit import _core
libs = sorted({l.split()[-1] for l in open('/proc/self/maps') if '.so' in l})
keys = ('__cxa_throw', '_Unwind_RaiseException', '__gxx_personality_v0', '_ZSt17rethrow_exception',
        '_ZTIN6lowbit5ErrorE', '_ZTISt13runtime_error')
for lib in libs:
    out = subprocess.run(['nm', '-D', '--defined-only', lib], capture_output=True, text=True).stdout
    hits = [k for k in keys if (' ' + k + '\n') in out or (' ' + k + '@') in out]
    if hits: print(lib, hits)
EOF
)

echo "== native backtrace (cuda-gdb, host code)"
(cd /tmp && timeout 180 cuda-gdb -batch -ex run -ex bt -ex "info symbol \$pc" --args python3 -c "$THROW" 2>&1 \
  | grep -vE "^\[(New|Thread|Detaching)|^warning:" | tail -40)

echo "== the tree as it is (export restriction in place)"
(cd "$FIXED" && python3 -m pip install -q --no-build-isolation --no-deps . > "$OUT/pip_fixed.log" 2>&1) || tail -20 "$OUT/pip_fixed.log"
echo "exported: $(nm -D --defined-only "$SO" | awk '{print $3}' | tr '\n' ' ')"
try_throw "with the version script and --exclude-libs,ALL"
[ "${1:-}" = bisect ] || exit 0
echo "== which static archives clash: relink with --exclude-libs per group"
BUILD=$(ls -d "$REPO"/build/cp3* | head -1)
ARCH_LOWBIT=$(cd "$BUILD" && ls liblowbit_*.a 2>/dev/null | tr '\n' ':' | sed 's/:$//')
ARCH_NB=$(cd "$BUILD" && find . -name "libnanobind*.a" -printf "%f:" | sed 's/:$//')
echo "lowbit archives: $ARCH_LOWBIT"; echo "nanobind archive: $ARCH_NB"
for v in "ALL" "$ARCH_LOWBIT" "$ARCH_NB" "libcudart_static.a" "libgomp.a"; do
  [ -n "$v" ] || continue
  install "-Wl,--exclude-libs,$v" excl && try_throw "exclude-libs $v"
  echo "   exported: $(nm -D --defined-only "$SO" | wc -l)"
done
install "-Wl,-Bsymbolic" bsym && try_throw "-Bsymbolic"
install "" base2 && try_throw "baseline again"
