"""The W4A8 register-direct GEMV (gemm_w4a8 kernel "gemv", 1-16 tokens; its automatic configuration and each compiled one forced)
against the mma.sync W4A8 kernel ("sm80", its automatic split-K), the W4A16 GEMV (g128, "gemv") and cuBLAS fp16
(torch F.linear) in the same process, on Llama-3-8B's linears and one rank's shard of Llama-3-70B's at tensor
parallelism 2. The GEMM alone on int8 codes (the quantizer in front is the same for both W4A8 kernels). Reports
microseconds (CUDA graph replay, rotating weight copies past 3x L2) and weight bytes per second (packed codes + u8
steps and offsets; W4A16: + f16 scales and zeros), beside the device's read bandwidth (a 2 GiB f32 sum).
JSON to argv[1], rewritten after every row (a run cut short keeps its rows).
  python3 tools/bench_gpu_w4a8_decode.py out.json [--ms 1] [--formats qoq,liquid] [--configs r4b4,r6b3,...]
      [--shapes 8b.gate_up,70b_tp2.gate_up,...] [--kernels sm80,gemv,gemvw,] [--no-w4a16]
"""
import argparse

import torch
import torch.nn.functional as F

import lowbit
from bench_gpu_common import copies_for, device_meta, graph_time_us, read_bandwidth_gbs, write_json
from bench_gpu_gemm import random_two_level  # valid qoq / liquid fields drawn at random
from sweep_w4a16_decode_split import GROUP as W4A16_GROUP, SHAPES, calls as w4a16_calls, weights as w4a16_weights

FORMAT_GROUP = {"qoq": 128, "liquid": 64}


def w4a8_fns(ws, xq, xs, y, kernel):
    from lowbit import _core
    lx, ls, ly = (lowbit.from_dlpack(t) for t in (xq, xs, y))
    stream = torch.cuda.current_stream
    return [lambda w=w: _core.gemm_w4a8(lx, ls, w, ly, 0, stream().cuda_stream, kernel) for w in ws]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--ms", default="1")
    ap.add_argument("--formats", default="qoq,liquid")
    ap.add_argument("--configs", default="r4b4,r6b3,r8b2,r6b4,r3b5", help="gemv configurations to force (first format)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="shape names in the order to run them")
    ap.add_argument("--kernels", default="sm80,gemv,gemvw,",
                    help="gemm_w4a8 kernel names timed for every format ('' = the automatic choice)")
    ap.add_argument("--no-w4a16", action="store_true", help="skip the W4A16 GEMV columns")
    args = ap.parse_args()
    from lowbit import _core
    meta = device_meta()
    l2 = meta["l2_bytes"]
    read = read_bandwidth_gbs()
    print(f"{meta['device']}: read {read:.0f} GB/s (f32 sum)", flush=True)
    formats = [f for f in args.formats.split(",") if f]
    configs = [c for c in args.configs.split(",") if c]
    kernels = args.kernels.split(",")
    head = {"benchmark": "w4a8_decode_gemv", "meta": meta, "read_gbs": round(read, 1)}
    rows = []
    for m in (int(v) for v in args.ms.split(",")):
        for name in (v for v in args.shapes.split(",") if v):
            n, k = SHAPES[name]
            g = torch.Generator().manual_seed(n + k)
            xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g).cuda()
            xs = (torch.rand(m, generator=g) * 0.01 + 0.001).cuda()
            y = torch.empty(m, n, dtype=torch.float16, device="cuda")
            t, wbytes, by_config = {}, {}, {}
            for i, fmt in enumerate(formats):
                group = FORMAT_GROUP[fmt]
                wbytes[fmt] = n * k // 2 + 2 * n * (k // group)
                qw = random_two_level(fmt, n, k, group, 1)
                ws = [_core.pack_weight(qw, "sm80", "cuda:0") for _ in range(copies_for(wbytes[fmt], l2))]
                for kernel in kernels:
                    t[f"{fmt}.{kernel or 'auto'}"] = graph_time_us(w4a8_fns(ws, xq, xs, y, kernel))
                if i == 0 and m <= 16:
                    for cfg in configs:
                        by_config[cfg] = graph_time_us(w4a8_fns(ws, xq, xs, y, f"gemv:{cfg}"))
                del ws, qw
                torch.cuda.empty_cache()
            w16_bytes = n * k // 2 + n * (k // W4A16_GROUP) * 4
            if m <= 8 and not args.no_w4a16:
                ws16 = w4a16_weights(n, k, copies_for(w16_bytes, l2))
                t["w4a16.gemv"] = graph_time_us(w4a16_calls(ws16, n, k, m, 0, "gemv"))
                t["w4a16.auto"] = graph_time_us(w4a16_calls(ws16, n, k, m, 0, ""))
                del ws16
            f16 = [torch.randn(n, k, device="cuda").half() for _ in range(copies_for(n * k * 2, l2))]
            x = torch.randn(m, k, device="cuda").half()
            t["cublas"] = graph_time_us([lambda w=w: F.linear(x, w) for w in f16])
            del f16
            torch.cuda.empty_cache()
            f0 = formats[0]
            gbs = {key: (w16_bytes if key.startswith("w4a16") else wbytes[key.split(".")[0]]) / (us * 1e-6) / 1e9
                   for key, us in t.items() if key != "cublas"}
            row = {"shape": name, "n": n, "k": k, "m": m, "us": {key: round(v, 2) for key, v in t.items()},
                   "gemv_us_by_config": {c: round(v, 2) for c, v in by_config.items()},
                   "weight_gbs": {key: round(v, 1) for key, v in gbs.items()},
                   "read_ceiling_us": {f: round(wbytes[f] / (read * 1e9) * 1e6, 2) for f in formats}}
            for fmt in formats:
                if f"{fmt}.sm80" in t and f"{fmt}.gemv" in t:
                    row[f"{fmt}_gemv_vs_sm80"] = round(t[f"{fmt}.sm80"] / t[f"{fmt}.gemv"], 3)
            rows.append(row)
            nan = float("nan")
            print(f"{name:<16} m={m} | cuBLAS {t['cublas']:6.2f} | W4A16 gemv {t.get('w4a16.gemv', nan):6.2f} "
                  f"auto {t.get('w4a16.auto', nan):6.2f} | "
                  + " | ".join(fmt + " " + " ".join(f"{kn or 'auto'} {t[fmt + '.' + (kn or 'auto')]:6.2f}"
                                                    for kn in kernels) for fmt in formats)
                  + f" | ceiling {row['read_ceiling_us'][f0]:.1f}", flush=True)
            if by_config:
                print("    gemv by config: " + " ".join(f"{c}:{v:.1f}" for c, v in by_config.items()), flush=True)
            write_json(args.out, {**head, "rows": rows})
    write_json(args.out, {**head, "rows": rows})


if __name__ == "__main__":
    main()
