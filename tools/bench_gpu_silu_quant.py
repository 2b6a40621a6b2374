"""The down linear's input on W8A8 / FP8 / W4A8 plans: SiLU·mul then the per-token quantizer (two kernels, the f16
rows written and read back) against silu_mul_quantize (one kernel, the same codes), at decode and serving batch
sizes of the Llama-3-8B (I = 14336) and Llama-3-70B (I = 28672) shapes. Device time per call from the profiler's
kernel records (both paths' kernels summed; launch gaps, which the fused path also halves, are not counted), rotating
inputs past 3x L2. Checks that both give the same bytes.
  python3 tools/bench_gpu_silu_quant.py out.json
"""
import sys

import torch

from bench_gpu_common import copies_for, device_meta, profiled_kernel_us, write_json


def main(out):
    from lowbit import _core as lb
    meta = device_meta()
    rows = []
    print(f"{meta['device']}: us per call (device time), s8 codes")
    print(f"{'I':>6} {'T':>5} | {'silu_mul + quantize':>20} {'fused':>8} | {'speed-up':>8}")
    for inter in (14336, 28672):
        for tokens in (1, 16, 128, 512, 1280):
            nbytes = tokens * 2 * inter * 2
            copies = copies_for(nbytes, meta["l2_bytes"])
            g = torch.Generator(device="cuda").manual_seed(tokens + inter)
            gus = [torch.randn(tokens, 2 * inter, generator=g, device="cuda", dtype=torch.float16) * 3
                   for _ in range(copies)]
            act = torch.empty(tokens, inter, dtype=torch.float16, device="cuda")
            q = torch.empty(tokens, inter, dtype=torch.int8, device="cuda")
            s = torch.empty(tokens, dtype=torch.float32, device="cuda")
            q2, s2 = torch.empty_like(q), torch.empty_like(s)

            def unfused(gu):
                lb.silu_mul(gu, act)
                lb.quantize_per_token_s8(act, q, s, torch.cuda.current_stream().cuda_stream)

            unfused(gus[0])
            lb.silu_mul_quantize(gus[0], q2, s2)
            torch.cuda.synchronize()
            same = bool(torch.equal(q, q2) and torch.equal(s, s2))
            t_unfused = profiled_kernel_us([lambda gu=gu: unfused(gu) for gu in gus], reps=20)
            t_fused = profiled_kernel_us([lambda gu=gu: lb.silu_mul_quantize(gu, q2, s2) for gu in gus], reps=20)
            rows.append({"inter": inter, "tokens": tokens, "unfused_us": round(t_unfused, 2),
                         "fused_us": round(t_fused, 2), "same_bytes": same})
            print(f"{inter:>6} {tokens:>5} | {t_unfused:>20.2f} {t_fused:>8.2f} | {t_unfused / t_fused:>7.2f}x"
                  f"{'' if same else '  BYTES DIFFER'}")
    write_json(out, {"benchmark": "silu_mul_quantize", "meta": meta, "rows": rows})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench_silu_quant.json")
