"""The batch-1 W4A16 GEMV (the sm80 small-M kernel) against its split-K: every split from 1 to 32 beside the one the
automatic rule picks (gemm_w4a16_pick_split), on Llama-3-8B's linears and on one rank's shard of Llama-3-70B's at
tensor parallelism 2. The decode step is mostly these GEMVs, so the split rule is worth checking per GPU (an H200
has 1.4x an H100's bandwidth on the same 132 SMs, so the same rule may leave it with too few bytes in flight).

Reports, per shape, microseconds (CUDA graph replay, rotating weight copies past 3x L2) and the weight bytes per
second, for the automatic split and the best one; writes JSON (argv[1]).
  python3 tools/sweep_w4a16_decode_split.py out.json [--ms 1,4]
"""
import argparse

import torch

import lowbit
from bench_gpu_common import copies_for, copy_bandwidth_gbs, device_meta, graph_time_us, write_json

SHAPES = {
    "8b.qkv": (6144, 4096), "8b.o": (4096, 4096), "8b.gate_up": (28672, 4096), "8b.down": (4096, 14336),
    # one rank of Llama-3-70B at TP=2: q/k/v and gate/up split by output rows, o and down by input channels
    "70b_tp2.qkv": (5120, 8192), "70b_tp2.o": (8192, 4096), "70b_tp2.gate_up": (28672, 8192),
    "70b_tp2.down": (8192, 14336),
}
SPLITS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
GROUP = 128


def weights(n, k, copies):
    """Random packed W4A16 weights (g128, f16 scales and zeros), packed once, copied to the GPU `copies` times."""
    from lowbit import _core
    q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    s = (torch.rand(n, k // GROUP) * 0.02 + 0.002).half()
    z = (torch.rand(n, k // GROUP) * 15).half()
    data, ps, pz = (torch.from_dlpack(t).cuda() for t in _core.pack_w4_sm80(q, s, z, GROUP))
    return [tuple(lowbit.from_dlpack(t) for t in (data.clone(), ps.clone(), pz.clone())) for _ in range(copies)]


def calls(ws, n, k, m, split, kernel=""):
    """One gemm_w4a16 call per weight copy on `kernel` ("" = the op's choice) with a forced split (0 = the kernel's
    own; DLPack conversions done before any capture)."""
    from lowbit import _core
    x, y = torch.randn(m, k, device="cuda").half(), torch.empty(m, n, device="cuda").half()
    work = torch.empty(max(1, (split or 64) * m * n), device="cuda")  # split-K partials (an automatic split <= 64)
    lx, ly, lwork = lowbit.from_dlpack(x), lowbit.from_dlpack(y), lowbit.from_dlpack(work)
    keep = (x, y, work)  # the torch tensors must outlive the calls
    stream = torch.cuda.current_stream
    return [lambda w=w, keep=keep: _core.gemm_w4a16(lx, w[0], w[1], w[2], n, k, GROUP, ly, split, lwork,
                                                    stream().cuda_stream, kernel) for w in ws]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--ms", default="1")
    args = ap.parse_args()
    from lowbit import _core
    meta = device_meta()
    l2 = meta["l2_bytes"]
    copy = copy_bandwidth_gbs()
    rows = []
    print(f"{meta['device']}: copy {copy:.0f} GB/s")
    print(f"{'shape':<18} {'M':>3} | {'auto':>5} {'us':>7} {'GB/s':>6} | {'best':>5} {'us':>7} {'GB/s':>6} | us by split")
    for m in (int(v) for v in args.ms.split(",")):
        for name, (n, k) in SHAPES.items():
            weight_bytes = n * k // 2 + n * (k // GROUP) * 4  # codes + f16 scales and zeros
            ws = weights(n, k, copies_for(weight_bytes, l2))
            auto = _core.gemm_w4a16_pick_split(m, n, k)
            times = {}
            for split in sorted(set(SPLITS + [auto])):
                if split <= k // 64:  # at least one 64-k chunk per split
                    times[split] = graph_time_us(calls(ws, n, k, m, split))  # us per call
            del ws
            torch.cuda.empty_cache()
            best = min(times, key=times.get)
            gbs = {s: weight_bytes / (t * 1e-6) / 1e9 for s, t in times.items()}
            rows.append({"shape": name, "n": n, "k": k, "m": m, "auto_split": auto, "best_split": best,
                         "us": {str(s): round(t, 2) for s, t in times.items()},
                         "weight_gbs": {str(s): round(g, 1) for s, g in gbs.items()}})
            by = " ".join(f"{s}:{t:.1f}" for s, t in times.items())
            print(f"{name:<18} {m:>3} | {auto:>5} {times[auto]:>7.2f} {gbs[auto]:>6.0f} | {best:>5} {times[best]:>7.2f} "
                  f"{gbs[best]:>6.0f} | {by}", flush=True)
    write_json(args.out, {"benchmark": "w4a16_decode_split", "meta": meta, "copy_gbs": round(copy, 1), "rows": rows})


if __name__ == "__main__":
    main()
