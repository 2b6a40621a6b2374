"""W4A16 at decode batches (5-127 tokens) on Hopper: the wgmma kernel's plan ("sm90": its 16 / 32 / 64-token tiles to
64 tokens, stream-K over 128-token tiles above), each split of the small tile forced ("sm90:S:T"), stream-K over
128-token tiles forced ("sm90k:128"), against the mma.sync small-M kernel ("small", its automatic split-K), the op's
automatic choice ("") and cuBLAS fp16 (torch F.linear) in the same process, on Llama-3-8B's linears and one rank's shard
of Llama-3-70B's at tensor parallelism 2. Microseconds of CUDA graph replay over rotating weight copies past 3x L2.
JSON to argv[1], rewritten after every row (a run cut short keeps its rows).
  python3 tools/bench_gpu_w4a16_small.py out.json [--ms 16,32,64,96] [--shapes 8b.qkv,...] [--splits 1,2,4,8]
"""
import argparse

import torch
import torch.nn.functional as F

from bench_gpu_common import copies_for, device_meta, graph_time_us, write_json
# the 8B and 70B/TP2 linears; g128 u4 codes with f16 scales and zeros, packed once and copied
from sweep_w4a16_decode_split import GROUP, SHAPES, calls, weights as packed_copies


def small_tile(m):
    return 16 if m <= 16 else 32 if m <= 32 else 64 if m <= 64 else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--ms", default="16,32,64,96")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="shape names in the order to run them")
    ap.add_argument("--splits", default="1,2,4,8", help="splits of the small tile to force")
    args = ap.parse_args()
    from lowbit import _core
    meta = device_meta()
    l2 = meta["l2_bytes"]
    splits = [int(v) for v in args.splits.split(",") if v]
    head = {"benchmark": "w4a16_small_tiles_sm90", "meta": meta}
    print(f"{'shape':<16} {'M':>3} | {'cuBLAS':>7} {'small':>7} {'auto':>7} {'sm90':>7} {'plan':>8} {'sk128':>7} | "
          f"{'sm90/small':>10} {'sm90/cuBLAS':>11} | forced small tile by split")
    rows = []
    for m in (int(v) for v in args.ms.split(",")):
        for name in (v for v in args.shapes.split(",") if v):
            n, k = SHAPES[name]
            weight_bytes = n * k // 2 + n * (k // GROUP) * 4
            ws = packed_copies(n, k, copies_for(weight_bytes, l2))
            plan = _core.gemm_w4a16_sm90_plan(m, n, k)
            t = {"small": graph_time_us(calls(ws, n, k, m, 0, "small")),
                 "auto": graph_time_us(calls(ws, n, k, m, 0, "")),
                 "sm90": graph_time_us(calls(ws, n, k, m, 0, "sm90")),
                 "sm90k128": graph_time_us(calls(ws, n, k, m, 0, "sm90k:128"))}
            forced = {}
            tile = small_tile(m)
            for split in splits if tile else []:
                if k // 64 >= split:
                    forced[f"sm90:{split}:{tile}"] = graph_time_us(calls(ws, n, k, m, 0, f"sm90:{split}:{tile}"))
            del ws
            f16 = [torch.randn(n, k, device="cuda").half() for _ in range(copies_for(n * k * 2, l2))]
            x = torch.randn(m, k, device="cuda").half()
            t["cublas"] = graph_time_us([lambda w=w: F.linear(x, w) for w in f16])
            del f16
            torch.cuda.empty_cache()
            row = {"shape": name, "n": n, "k": k, "m": m, "sm90_plan": list(plan),
                   "us": {key: round(v, 2) for key, v in t.items()},
                   "forced_us": {key: round(v, 2) for key, v in forced.items()},
                   "sm90_vs_small": round(t["small"] / t["sm90"], 3),
                   "sm90_vs_cublas": round(t["cublas"] / t["sm90"], 3)}
            rows.append(row)
            forced_str = " ".join(f"{key.split(':')[1]}:{v:.1f}" for key, v in forced.items())
            print(f"{name:<16} {m:>3} | {t['cublas']:>7.2f} {t['small']:>7.2f} {t['auto']:>7.2f} {t['sm90']:>7.2f} "
                  f"{'%d/%d' % (plan[0], plan[1]):>8} {t['sm90k128']:>7.2f} | {row['sm90_vs_small']:>9.2f}x "
                  f"{row['sm90_vs_cublas']:>10.2f}x | {forced_str}", flush=True)
            write_json(args.out, {**head, "rows": rows})
    write_json(args.out, {**head, "rows": rows})


if __name__ == "__main__":
    main()
