"""Timing helpers shared by the GPU benchmarks: CUDA-graph replay, medians, copy bandwidth."""
import datetime
import json
import os
import statistics
import subprocess

import torch


def replay_median_us(graph, calls, reps, warmup):
    """Median microseconds per call of a captured CUDA graph holding `calls` calls: `warmup` replays, then `reps`
    replays each between two CUDA events (no host time between the kernels)."""
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    return statistics.median(times)


def graph_time_us(fn_calls, reps=20, warmup=3):
    """Median microseconds per call. `fn_calls` is a list of callables (e.g. one per weight copy, so
    successive calls do not hit in L2); they are captured once into a CUDA graph and replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            for f in fn_calls:
                f()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    # captured on the warmup stream: ops that keep per-stream scratch (stream-K) allocated it there during the warmup
    with torch.cuda.graph(graph, stream=stream):
        for f in fn_calls:
            f()
    return replay_median_us(graph, len(fn_calls), reps, warmup)


def kernel_times(prof):
    """{kernel name: [device microseconds, launches]} summed over a torch.profiler run's CUDA records."""
    per = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            name = ev.name.replace("(anonymous namespace)::", "").replace("void ", "").split("(")[0]
            t = per.setdefault(name, [0.0, 0])
            t[0] += getattr(ev, "device_time_total", None) or ev.cuda_time_total
            t[1] += 1
    return per


def profiled_kernel_us(fns, reps, name_part="", warmup=1):
    """Device microseconds per call from the torch profiler's kernel records, for launches a CUDA-graph
    capture refuses (lowbit ops on their own stream, ops that upload metadata per call). fns: one callable
    or a list (each call counts once); every call runs `warmup` times, then `reps` times under the profiler.
    Sums the kernels whose names contain name_part (all when empty), copies left out."""
    fns = list(fns) if isinstance(fns, (list, tuple)) else [fns]
    for _ in range(warmup):
        for f in fns:
            f()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            for f in fns:
                f()
        torch.cuda.synchronize()
    per = kernel_times(prof)
    total = sum(t for name, (t, _) in per.items() if name_part in name and not name.startswith("Memcpy"))
    if total <= 0:
        raise RuntimeError(f"no kernel named like {name_part!r} in the profile: {sorted(per)}")
    return total / (reps * len(fns))


def profiled_kernel_parts_us(fn, reps, name_parts, warmup=1):
    """Like profiled_kernel_us for one callable, one profile: microseconds per call of the kernels whose names
    contain each of name_parts (a list; one figure each, e.g. a launch's kernels and one kernel of them)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    per = kernel_times(prof)
    return [sum(t for name, (t, _) in per.items() if part in name and not name.startswith("Memcpy")) / reps
            for part in name_parts]


def call_spans_us(prof, reps):
    """Device microseconds per call from first kernel start to last kernel end, mean over the `reps` calls of a
    torch.profiler run that made only those calls, one after another (each call's kernels start after the previous
    call's last kernel ends, as on one stream or a fork joined back before its last kernel). Kernels on several streams
    count once however they overlap, unlike the summed kernel times above. None where the kernel records do not
    split into `reps` equal groups."""
    evs = sorted(((ev.time_range.start, ev.time_range.end) for ev in prof.events()
                  if ev.device_type == torch.autograd.DeviceType.CUDA and not ev.name.startswith(("Memcpy", "Memset"))))
    if not evs or len(evs) % reps:
        return None
    k = len(evs) // reps
    groups = [evs[i * k:(i + 1) * k] for i in range(reps)]
    return sum(max(e for _, e in g) - g[0][0] for g in groups) / reps


def profiled_parts_and_span_us(fn, reps, name_parts, warmup=1):
    """profiled_kernel_parts_us and call_spans_us from one profile: ([us per call of each name part], span us)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    per = kernel_times(prof)
    parts = [sum(t for name, (t, _) in per.items() if part in name and not name.startswith("Memcpy")) / reps
             for part in name_parts]
    return parts, call_spans_us(prof, reps)


def graph_calls_us(fn_on, calls=10, reps=10, warmup=3):
    """Median device microseconds per call of `fn_on(stream)` (stream: a cudaStream_t as an integer, for ops that take
    one; torch ops launch on the current stream, which is it) captured `calls` times into one CUDA graph on a side
    stream (relaxed mode: launches that set their shared-memory limit at each call) and replayed, CUDA events around
    each replay: no host time between the kernels. None (the error printed) where the capture fails."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            fn_on(stream.cuda_stream)
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="relaxed"):
            for _ in range(calls):
                fn_on(stream.cuda_stream)
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        print("graph capture:", repr(e)[:200])
        torch.cuda.synchronize()
        return None
    us = replay_median_us(graph, calls, reps, warmup)
    del graph
    torch.cuda.synchronize()
    return us


def read_bandwidth_gbs(nbytes=2 << 30):
    """A pure read: torch's sum over an f32 tensor of `nbytes` (one pass, the result a scalar), bytes read per second.
    What the device can stream from DRAM, to hold a kernel's weight bytes per second against (the copy figure below
    counts a read and a write per byte and is not a read ceiling)."""
    a = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    t = graph_time_us([lambda: a.sum()], reps=10)
    return nbytes / (t * 1e-6) / 1e9


def copy_bandwidth_gbs(nbytes=2 << 30):
    """Device-to-device copy, bytes read + written per second (the memory roofline we compare to)."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    t = graph_time_us([lambda: b.copy_(a)], reps=10)
    return 2 * nbytes / (t * 1e-6) / 1e9


def copies_for(nbytes, l2_bytes, at_least=2):
    """How many rotating copies of an operand keep the working set past 3x the L2 size."""
    return max(at_least, -(-3 * l2_bytes // max(nbytes, 1)))


def device_meta():
    props = torch.cuda.get_device_properties(0)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=False).stdout.strip()
    except OSError:
        commit = ""
    return {
        "device": props.name,
        "multiprocessors": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", 50 << 20),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": os.environ.get("LOWBIT_COMMIT") or commit,  # the caller knows best where the tree was copied
        "torch": torch.__version__,
        "timing": "CUDA graph replay, median of 20 replays, rotating operand copies past 3x L2",
    }


def write_json(path, payload):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
