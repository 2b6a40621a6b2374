"""Device time of the fused COMET FMPQ producers against the kernels they replace, on the Llama-3-8B widths (hidden
4096, intermediate 14336) at decode token counts, from the profiler's kernel records (the ops launch on lowbit's
current stream):
  norm: add_rms_norm into f16 rows + quantize_fmpq through the input permutation  vs  rms_norm_quantize_fmpq
  silu: silu_mul into f16 rows + quantize_fmpq (no permutation: the down linear's)  vs  silu_mul_quantize_fmpq
beside W8A8's fused per-token quantizers (rms_norm_quantize, silu_mul_quantize) for scale. Block maps with 10% int8
blocks. Operands are re-used call after call (up to ~30 MB at 512 tokens: they stay in the H100/H200 L2, as a
producer's input written by the GEMM just before does in a step). JSON to argv[1].
  python3 tools/bench_gpu_fmpq_producers.py out.json [--tokens 1,64,256,512]
"""
import argparse
import json

import torch

import lowbit  # noqa: F401
from lowbit import _core as lb

from bench_gpu_common import device_meta, profiled_kernel_us

H, I = 4096, 14336
REPS = 50


def block_map(k, frac, seed):
    nb = (k + 127) // 128
    g = torch.Generator().manual_seed(seed)
    bits = torch.full((nb,), 4, dtype=torch.uint8)
    bits[torch.randperm(nb, generator=g)[: round(frac * nb)]] = 8
    return bits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokens", default="1,64,256,512")
    ap.add_argument("--int8-fraction", type=float, default=0.1)
    args = ap.parse_args()
    rows = []
    eps = 1e-5
    for t in [int(v) for v in args.tokens.split(",")]:
        g = torch.Generator(device="cuda").manual_seed(t)
        res = torch.randn(t, H, device="cuda", generator=g).half()
        x = (0.01 * torch.randn(t, H, device="cuda", generator=g)).half()  # small: the residual stays finite
        w = (torch.rand(H, device="cuda", generator=g) + 0.5).half()
        perm = torch.randperm(H, device="cuda", generator=g).to(torch.int32)
        hb, ib = block_map(H, args.int8_fraction, 1), block_map(I, args.int8_fraction, 2)
        normed = torch.empty(t, H, device="cuda").half()
        qh = torch.empty(t, H, dtype=torch.int8, device="cuda")
        sh = torch.empty(t, hb.numel(), device="cuda")
        s_tok = torch.empty(t, device="cuda")
        gu = torch.randn(t, 2 * I, device="cuda", generator=g).half()
        act = torch.empty(t, I, device="cuda").half()
        qi = torch.empty(t, I, dtype=torch.int8, device="cuda")
        si = torch.empty(t, ib.numel(), device="cuda")
        r = {"tokens": t, "hidden": H, "intermediate": I, "int8_fraction": args.int8_fraction}

        def norm_unfused():
            lb.add_rms_norm(res, x, w, eps, normed)
            lb.quantize_fmpq_gpu(normed, hb, qh, sh, perm=perm)

        r["norm_unfused_us"] = profiled_kernel_us(norm_unfused, REPS, warmup=3)
        r["norm_fused_us"] = profiled_kernel_us(lambda: lb.rms_norm_quantize_fmpq(res, x, w, eps, hb, perm, qh, sh),
                                                REPS, warmup=3)
        r["norm_fused_noperm_us"] = profiled_kernel_us(
            lambda: lb.rms_norm_quantize_fmpq(res, x, w, eps, hb, None, qh, sh), REPS, warmup=3)
        r["w8a8_norm_quantize_us"] = profiled_kernel_us(lambda: lb.rms_norm_quantize(res, x, w, eps, qh, s_tok),
                                                        REPS, warmup=3)

        def silu_unfused():
            lb.silu_mul(gu, act)
            lb.quantize_fmpq_gpu(act, ib, qi, si)

        r["silu_unfused_us"] = profiled_kernel_us(silu_unfused, REPS, warmup=3)
        r["silu_fused_us"] = profiled_kernel_us(lambda: lb.silu_mul_quantize_fmpq(gu, ib, None, qi, si), REPS,
                                                warmup=3)
        iperm = torch.randperm(I, device="cuda", generator=g).to(torch.int32)
        r["silu_fused_perm_us"] = profiled_kernel_us(lambda: lb.silu_mul_quantize_fmpq(gu, ib, iperm, qi, si), REPS,
                                                     warmup=3)
        r["w8a8_silu_quantize_us"] = profiled_kernel_us(lambda: lb.silu_mul_quantize(gu, qi, s_tok), REPS, warmup=3)
        # per layer: two norms (qkv, gate_up) and one SiLU·mul
        r["layer_saved_us"] = 2 * (r["norm_unfused_us"] - r["norm_fused_us"]) + r["silu_unfused_us"] - \
            r["silu_fused_us"]
        rows.append(r)
        print("  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()), flush=True)
    with open(args.out, "w") as f:
        json.dump({"meta": {**device_meta(), "timing": f"profiler kernel time, mean of {REPS} calls"}, "rows": rows},
                  f, indent=1)


if __name__ == "__main__":
    main()
