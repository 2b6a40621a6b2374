"""The installed extension exports only its Python entry point, and a C++ exception raised inside it becomes a Python
exception with torch loaded first.

Why: a GPU build once exported every symbol of the static archives linked into it, a static copy of libstdc++
included; with torch's shared libstdc++ in the same process the two C++ runtimes shared part of their state and the
first C++ exception segfaulted (docs/gpu_notes.md). cmake/python.cmake now links with a version script; this test
reads the dynamic symbol table of the extension as installed, so a toolchain or build change that exports more
fails here, on the CPU, before anyone meets the crash.
"""
import importlib.util
import shutil
import subprocess
import sys

import pytest

ENTRY_POINT = "PyInit__core"


def extension_path():
    spec = importlib.util.find_spec("lowbit._core")
    if spec is None or not spec.origin:
        pytest.skip("lowbit._core is not installed")
    return spec.origin


def exported_symbols(path):
    """Names of the symbols the shared object defines and exports (nm -D --defined-only)."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not available")
    out = subprocess.run([nm, "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    names = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        kind, name = parts[-2], parts[-1]
        if kind == "A":  # version-definition entries (e.g. the soname's version node), not code or data
            continue
        names.add(name.split("@")[0])
    return names


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF symbol tables")
def test_extension_exports_only_its_entry_point():
    names = exported_symbols(extension_path())
    assert ENTRY_POINT in names
    extra = sorted(names - {ENTRY_POINT})
    runtime = [n for n in extra if n.startswith(("__cxa_", "__gxx_", "_ZNSt", "_ZSt", "_ZTISt", "_ZTSSt", "_Unwind_"))]
    assert not extra, (f"lowbit._core exports {len(extra)} symbols besides {ENTRY_POINT} "
                       f"({len(runtime)} of them from the C++ runtime), e.g. {extra[:8]}")


def test_cpp_exception_raises_with_torch_loaded_first():
    """The one-liner that used to segfault on the GPU build, in a child process so a crash is reported by name."""
    pytest.importorskip("torch")
    code = ("import torch\nfrom lowbit import _core\n"
            "try:\n    _core.parse_recipe('w9a9')\nexcept ValueError as e:\n    print('raised:', e)\n"
            "print(_core.parse_recipe('w4a16kv8'))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    if proc.returncode < 0:
        import signal
        pytest.fail(f"child died by {signal.Signals(-proc.returncode).name}: {proc.stderr[-2000:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "raised:" in proc.stdout and "w9a9" in proc.stdout, proc.stdout
