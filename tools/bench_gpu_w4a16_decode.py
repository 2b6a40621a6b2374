"""The W4A16 decode GEMMs on Hopper: the TMA-fed decode kernel ("decode90", automatic split and each cluster size
forced) and the register-direct GEMV ("gemv", its automatic tiles per CTA and each forced, up to 8 tokens) against
the sm80 small-M kernel (its automatic split-K) and cuBLAS fp16 (torch F.linear) in the same process, on
Llama-3-8B's linears and on one rank's shard of Llama-3-70B's at tensor parallelism 2, at 1 and 16 tokens.
Reports microseconds (CUDA graph replay, rotating weight copies past 3x L2) and weight bytes per second (packed
codes + f16 scales and zeros; cuBLAS: its f16 weight), beside the device's copy bandwidth (read + write) and its read bandwidth (a 2 GiB f32 sum, bytes read).
JSON to argv[1], rewritten after every row (a run cut short keeps its rows).
  python3 tools/bench_gpu_w4a16_decode.py out.json [--ms 1,16] [--splits 1,2,4,8] [--gemv-tiles 1,2,4,8]
      [--gemv-configs r8b2,r4b2,...] [--shapes 8b.gate_up,70b_tp2.gate_up,...]
(an empty --splits / --gemv-tiles / --gemv-configs skips those sweeps)
"""
import argparse

import torch
import torch.nn.functional as F

from bench_gpu_common import (copies_for, copy_bandwidth_gbs, device_meta, graph_time_us, read_bandwidth_gbs,
                              write_json)
# the 8B and 70B/TP2 linears; g128 u4 codes with f16 scales and zeros, packed once and copied
from sweep_w4a16_decode_split import GROUP, SHAPES, calls, weights as packed_copies


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--splits", default="1,2,4,8", help="decode90 cluster sizes to force")
    ap.add_argument("--gemv-tiles", default="1,2,4,8", help="gemv tiles per CTA to force")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="shape names in the order to run them")
    ap.add_argument("--gemv-configs", default="r8b2,r4b2,r12b1,r6b3,r4b4,r3b5,r2b6",
                    help="gemv ring depth / CTAs per SM configurations to force (at T = 1)")
    args = ap.parse_args()
    from lowbit import _core
    meta = device_meta()
    l2 = meta["l2_bytes"]
    copy = copy_bandwidth_gbs()
    read = read_bandwidth_gbs()
    print(f"{meta['device']}: copy {copy:.0f} GB/s (read + write), read {read:.0f} GB/s (f32 sum)")
    splits = [int(v) for v in args.splits.split(",") if v]
    gemv_tiles = [int(v) for v in args.gemv_tiles.split(",") if v]
    gemv_configs = [v for v in args.gemv_configs.split(",") if v]
    head = {"benchmark": "w4a16_decode_sm90", "meta": meta, "copy_gbs": round(copy, 1), "read_gbs": round(read, 1)}
    print(f"{'shape':<16} {'M':>3} | {'cuBLAS':>7} {'small':>7} {'decode':>7} (S) {'gemv':>7} (T) | {'GB/s small':>10} "
          f"{'decode':>6} {'gemv':>6} | {'decode/small':>8} {'gemv/small':>8} | decode us by split | gemv us by T")
    rows = []
    for m in (int(v) for v in args.ms.split(",")):
        for name in (v for v in args.shapes.split(",") if v):
            n, k = SHAPES[name]
            weight_bytes = n * k // 2 + n * (k // GROUP) * 4
            ws = packed_copies(n, k, copies_for(weight_bytes, l2))
            auto = _core.gemm_w4a16_decode_sm90_split(m, n, k)
            t = {"small": graph_time_us(calls(ws, n, k, m, 0, "small")),
                 "decode": graph_time_us(calls(ws, n, k, m, 0, "decode90"))}
            by_split, by_tiles, by_config, gemv_auto = {}, {}, {}, None
            for split in splits:
                if k // 64 // split >= 2:
                    by_split[split] = graph_time_us(calls(ws, n, k, m, 0, f"decode90:{split}"))
            if m <= 8:
                gemv_auto = _core.gemm_w4a16_gemv_plan(m, n, k)[0]
                t["gemv"] = graph_time_us(calls(ws, n, k, m, 0, "gemv"))
                for tiles in gemv_tiles:
                    by_tiles[tiles] = graph_time_us(calls(ws, n, k, m, 0, f"gemv:{tiles}"))
                for cfg in gemv_configs:
                    by_config[cfg] = graph_time_us(calls(ws, n, k, m, 0, f"gemv:1:{cfg}"))
            del ws
            f16 = [torch.randn(n, k, device="cuda").half() for _ in range(copies_for(n * k * 2, l2))]
            x = torch.randn(m, k, device="cuda").half()
            t["cublas"] = graph_time_us([lambda w=w: F.linear(x, w) for w in f16])
            del f16
            torch.cuda.empty_cache()
            gbs = {key: weight_bytes / (us * 1e-6) / 1e9 for key, us in t.items() if key != "cublas"}
            row = {"shape": name, "n": n, "k": k, "m": m, "decode_split": auto, "gemv_tiles": gemv_auto,
                   "us": {key: round(v, 2) for key, v in t.items()},
                   "decode_us_by_split": {str(s): round(v, 2) for s, v in by_split.items()},
                   "gemv_us_by_tiles": {str(s): round(v, 2) for s, v in by_tiles.items()},
                   "gemv_us_by_config": {c: round(v, 2) for c, v in by_config.items()},
                   "gemv_split_by_config": {c: _core.gemm_w4a16_gemv_plan(m, n, k, kernel=f"gemv:1:{c}")[1]
                                            for c in by_config},
                   "read_ceiling_us": round(weight_bytes / (read * 1e9) * 1e6, 2),
                   "weight_gbs": {key: round(v, 1) for key, v in gbs.items()},
                   "decode_vs_small": round(t["small"] / t["decode"], 3),
                   "decode_vs_cublas": round(t["cublas"] / t["decode"], 3)}
            if "gemv" in t:
                row["gemv_vs_small"] = round(t["small"] / t["gemv"], 3)
                row["gemv_vs_decode"] = round(t["decode"] / t["gemv"], 3)
            rows.append(row)
            split_str = " ".join(f"{s}:{v:.1f}" for s, v in by_split.items())
            tile_str = " ".join(f"{s}:{v:.1f}" for s, v in by_tiles.items())
            gv = t.get("gemv", float("nan"))
            print(f"{name:<16} {m:>3} | {t['cublas']:>7.2f} {t['small']:>7.2f} {t['decode']:>7.2f} ({auto}) {gv:>7.2f} "
                  f"({gemv_auto}) | {gbs['small']:>10.0f} {gbs['decode']:>6.0f} {gbs.get('gemv', float('nan')):>6.0f} | "
                  f"{row['decode_vs_small']:>7.2f}x {row.get('gemv_vs_small', float('nan')):>7.2f}x | {split_str} | "
                  f"{tile_str}", flush=True)
            if by_config:
                print("    gemv:1 by config: " + " ".join(
                    f"{c}:{v:.1f}({weight_bytes / (v * 1e-6) / 1e9:.0f})" for c, v in by_config.items()) +
                    f" | read ceiling {weight_bytes / (read * 1e9) * 1e6:.1f} us", flush=True)
            write_json(args.out, {**head, "rows": rows})
    write_json(args.out, {**head, "rows": rows})


if __name__ == "__main__":
    main()
