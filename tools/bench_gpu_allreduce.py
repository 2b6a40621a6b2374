"""The tensor-parallel all-reduce by itself (issue 20): lowbit's one-shot peer-memory kernel against NCCL on the same
GPUs, f16 messages from 16 KB to 4 MB. Each rank's thread captures K all-reduces of one buffer into a CUDA graph; the
ranks replay their graphs at the same time; per all-reduce = replay time / K, median of the replays, rank 0's events
(the ranks wait for each other, so rank 1's numbers agree). Both groups are made with make_nccl_communicators: NCCL
alone (oneshot_max_bytes=0) and one-shot for every size up to the staging capacity.
Prediction written before the first run (2x H200, NVLink): 16 KB NCCL ~13 us (the step profile's), one-shot ~4 us
(two NVLink round trips of flags and data plus a launch); the one-shot stays ahead up to ~512 KB-1 MB, where reading
every peer's whole message over NVLink costs more than NCCL's ring.
  python3 tools/bench_gpu_allreduce.py out.json [--gpus 2] [--k 20] [--reps 25]
"""
import argparse
import statistics
import sys
import threading
import os

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gpu_common import device_meta, write_json  # noqa: E402

SIZES = [16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20]


def time_group(comms, nbytes, k, reps):
    """Median us per all-reduce of nbytes of f16 on every rank, graph-replayed; also checks the eager result."""
    world = len(comms)
    n = nbytes // 2
    barrier = threading.Barrier(world)
    out, errors = [None] * world, []

    def rank(r):
        try:
            torch.cuda.set_device(r)
            g = torch.Generator(device=f"cuda:{r}").manual_seed(r)
            x = torch.randn(n, device=f"cuda:{r}", dtype=torch.float16, generator=g) * 1e-4
            first = x.cpu()
            stream = torch.cuda.Stream(r)
            with torch.cuda.stream(stream):
                check = x.clone()
                comms[r].all_reduce_sum(check, stream=stream.cuda_stream)
                for _ in range(3):
                    comms[r].all_reduce_sum(x, stream=stream.cuda_stream)
            stream.synchronize()
            barrier.wait()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                for _ in range(k):
                    comms[r].all_reduce_sum(x, stream=stream.cuda_stream)
            barrier.wait()
            times = []
            with torch.cuda.stream(stream):
                for i in range(reps + 3):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record(stream)
                    graph.replay()
                    b.record(stream)
                    b.synchronize()
                    if i >= 3:
                        times.append(a.elapsed_time(b) * 1e3 / k)
            out[r] = (statistics.median(times), check.cpu(), first)
        except Exception as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)
            barrier.abort()
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    same = all(torch.equal(out[0][1], o[1]) for o in out)
    want = sum(o[2].double() for o in out)  # the first (eager) all-reduce against a float64 sum of the inputs
    correct = all(bool(((o[1].double() - want).abs() <= 2.0 ** -10 * want.abs() + 1e-7).all()) for o in out)
    return out[0][0], max(o[0] for o in out), same and correct


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--reps", type=int, default=25)
    args = ap.parse_args()
    from lowbit import _core
    if torch.cuda.device_count() < args.gpus or not _core.nccl_available()[0]:
        print(f"needs {args.gpus} GPUs and NCCL: {torch.cuda.device_count()} GPU(s), {_core.nccl_available()}")
        return
    devices = list(range(args.gpus))
    groups = {"oneshot": _core.make_nccl_communicators(devices, oneshot_max_bytes=_core.ONESHOT_CAPACITY_BYTES),
              "nccl": _core.make_nccl_communicators(devices, oneshot_max_bytes=0)}
    print("all-reduce paths:", {k: g[0].all_reduce for k, g in groups.items()})
    rows = []
    for nbytes in SIZES:
        row = {"bytes": nbytes}
        for name, comms in groups.items():
            us, worst, same = time_group(comms, nbytes, args.k, args.reps)
            row[f"{name}_us"] = round(us, 2)
            row[f"{name}_us_slowest_rank"] = round(worst, 2)
            row[f"{name}_correct_and_identical"] = same
        row["speedup"] = round(row["nccl_us"] / row["oneshot_us"], 2)
        rows.append(row)
        print(f"{nbytes >> 10:>6} KB  one-shot {row['oneshot_us']:8.2f} us  nccl {row['nccl_us']:8.2f} us  "
              f"x{row['speedup']:.2f}  correct, ranks identical: {row['oneshot_correct_and_identical']}", flush=True)
    meta = device_meta()
    meta["timing"] = f"CUDA graph of {args.k} all-reduces per rank, ranks replaying together, median of {args.reps}"
    write_json(args.out, {"bench": "allreduce", "gpus": args.gpus, "dtype": "f16",
                          "paths": {k: g[0].all_reduce for k, g in groups.items()}, **meta, "results": rows})


if __name__ == "__main__":
    main()
