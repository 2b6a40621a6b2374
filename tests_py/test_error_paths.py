"""Crash-proofing: every error path of the Python API and of each binding module raises a Python exception whose
message names the problem, and the process stays usable afterwards.

Each area of error_cases.py runs in a child process that imports torch first and then lowbit, as users do (a C++
exception crossing the binding once killed such a process with SIGSEGV). For each case the child runs the bad call,
records the exception's type and message, then runs a correct call in the same process and records whether it
worked. A child that dies by a signal or hangs fails the case it was running (naming the signal, with the child's
stderr), and the cases after it run in a fresh child. The same file runs on the CPU in CI and on a GPU machine,
where the "gpu" cases (unknown GPU recipes, CUDA out of memory, CPU/GPU placements) run too.
"""
import importlib.util
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from error_cases import AREAS, Area, case

if importlib.util.find_spec("torch") is None:  # the children import it first, as users do
    pytest.skip("torch is not installed", allow_module_level=True)

TESTS_DIR = Path(__file__).resolve().parent
CASE_TIMEOUT_S = 60     # one case (bad call + correct call) longer than this is a hang
CHILD_TIMEOUT_S = 300   # backstop for a whole child

CHILD = r'''
import faulthandler, json, signal, sys
faulthandler.enable()  # a fatal signal prints the Python stack to stderr, then still ends the child by it
import torch  # first, as users do
import numpy as np
import lowbit
from lowbit import _core as C

spec = json.load(sys.stdin)
sys.path.insert(0, spec["tests_dir"])
GPU = bool(lowbit.cuda_available() and torch.cuda.is_available())
applies = {"always": True, "gpu": GPU, "no_gpu": not GPU, "cpu_build": not C.has_cuda_build()}


def emit(**record):
    print(json.dumps(record), flush=True)


def cuda_labelled(t):
    """t's host memory as a lowbit tensor whose DLPack device says CUDA (never handed to a real GPU)."""
    import ctypes
    assert not GPU
    cap = t.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    managed = get(cap, b"dltensor")
    ctypes.c_int32.from_address(managed + ctypes.sizeof(ctypes.c_void_p)).value = 2  # DLTensor.device = kDLCUDA
    return C.from_dlpack(cap)


cases = spec["cases"]
for c in cases:
    if not applies[c["when"]]:
        emit(id=c["id"], skip=f"only where {c['when']!r} holds")
ns = {"torch": torch, "np": np, "lowbit": lowbit, "C": C, "GPU": GPU, "WORKDIR": spec["workdir"],
      "cuda_labelled": cuda_labelled}
if any(applies[c["when"]] for c in cases):
    try:
        exec(spec["prelude"], ns)
    except BaseException as e:  # pytest.importorskip in a prelude: an optional module is missing here
        if type(e).__name__ != "Skipped":
            raise
        for c in cases:
            if applies[c["when"]]:
                emit(id=c["id"], skip=f"the area's prelude skipped: {e}")
        sys.exit(0)
for c in cases:
    if not applies[c["when"]]:
        continue
    emit(start=c["id"])
    # No handler: SIGALRM ends a hung child, after faulthandler printed where it hung.
    faulthandler.dump_traceback_later(max(spec["case_timeout"] - 0.5, 0.1))
    signal.alarm(spec["case_timeout"])
    env = dict(ns)
    record = {"id": c["id"], "raised": None, "message": "", "good": None}
    try:
        exec(c["bad"], env)
    except Exception as e:
        record.update(raised=type(e).__name__, message=str(e))
    try:
        exec(c["good"], env)
    except Exception as e:
        record["good"] = f"{type(e).__name__}: {e}"
    signal.alarm(0)
    faulthandler.cancel_dump_traceback_later()
    emit(**record)
'''


def _text(out):
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


def _death(rc, case_timeout):
    if rc is None:
        return f"hung (the child ran past {CHILD_TIMEOUT_S} s)"
    if rc == -signal.SIGALRM:
        return f"hung (no result within {case_timeout} s)"
    if rc < 0:
        return f"was killed by signal {signal.Signals(-rc).name}"
    return f"exited with status {rc}"


def release_gpu_memory():
    """The children's GPU cases measure free memory: hand back what this process's caches hold (earlier GPU tests
    in the same pytest run leave freed blocks cached in torch's and lowbit's allocators)."""
    import gc
    import torch
    import lowbit
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if lowbit.cuda_available():
        lowbit.empty_cache("cuda")


def run_area(area, workdir, case_timeout=CASE_TIMEOUT_S):
    """{case id: record} for every case of the area. A child that dies takes the blame for the case it was running
    (record["died"], record["stderr"]); the cases after it run in a fresh child."""
    release_gpu_memory()
    results, pending = {}, list(area.cases)
    while pending:
        spec = {"prelude": area.prelude, "workdir": str(workdir), "tests_dir": str(TESTS_DIR),
                "case_timeout": case_timeout,
                "cases": [{"id": c.id, "bad": c.bad, "good": c.good, "when": c.when} for c in pending]}
        try:
            proc = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(spec), capture_output=True,
                                  text=True, timeout=CHILD_TIMEOUT_S, cwd=workdir)
            stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as e:
            stdout, stderr, rc = _text(e.stdout), _text(e.stderr), None
        running = None
        for line in stdout.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # anything else the child printed
            if not isinstance(record, dict):
                continue
            if "start" in record:
                running = record["start"]
            elif "id" in record:
                results[record["id"]] = record
                running = None
        if rc == 0:
            break
        death = {"died": _death(rc, case_timeout), "stderr": stderr[-4000:]}
        if running is None:  # died outside a case (imports, prelude): every case left is blamed
            for c in pending:
                results.setdefault(c.id, {"id": c.id, "outside_case": True, **death})
            break
        results[running] = {"id": running, **death}
        ids = [c.id for c in pending]
        pending = pending[ids.index(running) + 1:]
    return results


_results = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("error_paths")


def results_of(area, workdir):
    if area.name not in _results:
        _results[area.name] = run_area(area, workdir)
    return _results[area.name]


def check(c, record):
    assert record is not None, f"{c.id}: the child recorded no result"
    if "skip" in record:
        pytest.skip(record["skip"])
    if "died" in record:
        where = "before its cases ran (imports or prelude)" if record.get("outside_case") else "while running this case"
        pytest.fail(f"{c.id}: the child process {record['died']} {where}\n--- child stderr (tail) ---\n"
                    f"{record['stderr']}", pytrace=False)
    raised, message = record["raised"], record["message"]
    if c.exc is None:
        assert raised is None, f"{c.id}: must not raise, raised {raised}: {message}"
    else:
        expected = (c.exc,) if isinstance(c.exc, str) else c.exc
        assert raised is not None, f"{c.id}: no exception (expected {' or '.join(expected)})"
        assert raised in expected, f"{c.id}: raised {raised} ({message!r}), expected {' or '.join(expected)}"
        missing = [w for w in c.words if w not in message]
        assert not missing, f"{c.id}: the {raised} message {message!r} does not name {missing}"
    assert record["good"] is None, f"{c.id}: the correct call after the error failed: {record['good']}"


@pytest.mark.parametrize("area, c", [pytest.param(a, c, id=f"{a.name}-{c.id}") for a in AREAS for c in a.cases])
def test_error_path(area, c, workdir):
    check(c, results_of(area, workdir).get(c.id))


def test_case_ids_are_unique_per_area():
    for a in AREAS:
        ids = [c.id for c in a.cases]
        assert len(ids) == len(set(ids)), a.name


# ---- the runner itself: a crash and a hang are reported by name, and the cases after them still run
def test_runner_skips_an_area_whose_prelude_lacks_an_optional_module(workdir):
    area = Area("needs_missing", "import pytest\npytest.importorskip('no_such_module_for_lowbit')", (
        case("one", "raise ValueError('x')", "ValueError"),
        case("gpu_only", "raise ValueError('x')", "ValueError", when="gpu"),
    ))
    res = run_area(area, workdir)
    assert "no_such_module_for_lowbit" in res["one"]["skip"]
    assert "skip" in res["gpu_only"] and "died" not in res["one"]


def test_runner_names_the_signal_and_runs_the_cases_after_a_crash(workdir):
    area = Area("selftest", "def ok(): pass", (
        case("before", "raise ValueError('before')", "ValueError", "before"),
        case("crash", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "ValueError"),
        case("after", "raise IndexError('after')", "IndexError", "after"),
    ))
    res = run_area(area, workdir)
    assert res["before"]["raised"] == "ValueError" and res["before"]["good"] is None
    assert res["crash"]["died"] == "was killed by signal SIGSEGV"
    assert res["after"]["raised"] == "IndexError" and res["after"]["good"] is None


def test_runner_reports_a_hang(workdir):
    area = Area("selftest", "import time\ndef ok(): pass", (
        case("hang", "time.sleep(30)", "ValueError"),
        case("after", "raise KeyError('after')", "KeyError"),
    ))
    res = run_area(area, workdir, case_timeout=1)
    assert res["hang"]["died"] == "hung (no result within 1 s)"
    assert res["after"]["raised"] == "KeyError"
