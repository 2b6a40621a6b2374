"""COMET W4Ax (FMPQ activations, 10% int8 blocks) GEMM vs lowbit's W4A8 and cuBLAS fp16 on Llama-3-8B layer
shapes, all in one process (random weights: cost does not depend on values). Per shape and token count:
  cublas_fp16_us          torch.matmul f16
  w4a8_us / _with_quant   lowbit gemm_w4a8 on s8 codes (the op's automatic choice: wgmma from 128 tokens on
                          sm_90), and with quantize_per_token_s8 in front
  w4a8_sm80_us            gemm_w4a8 forced to its mma.sync kernel (the pipeline gemm_fmpq_sm80 shares)
  fmpq_us / _with_quant   lowbit gemm_fmpq on FMPQ codes (automatic: wgmma from 128 tokens on sm_90), and with
                          quantize_fmpq in front
  fmpq_sm80_us            gemm_fmpq forced to its mma.sync kernel
  fmpq_gemv_us            (up to 16 tokens) gemm_fmpq forced to the register-direct GEMV ('gemv', its width by shape)
  fmpq_serial_us          (sm_90, from 128 tokens) gemm_fmpq forced to the wgmma kernel's serial mainloop
                          ('sm90s': each block flushed between blocks), A/B against fmpq_us (overlapped)
  w4a8_t128_us            (sm_90, from 128 tokens) gemm_w4a8 forced to 128-token tiles ('sm90:0:128'), FMPQ's tile
LiquidQuant g64 weights for both. CUDA-graph replay, medians, rotating weight copies past 3x L2.
    python tools/bench_gpu_fmpq.py OUT.json [--ms=1,16,256]
"""
import sys

import torch

import lowbit
from lowbit import _core

from bench_gpu_common import copies_for, device_meta, graph_time_us, write_json
from bench_gpu_gemm import random_two_level

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
MS = [1, 16, 64, 256, 1024, 4096]
INT8_FRACTION = 0.1
SM90 = torch.cuda.get_device_capability() == (9, 0)
GROUP = 64


def bench_shape(name, n, k, ms, l2):
    copies = copies_for(n * k // 2 + 2 * n * (k // GROUP), l2)
    ws = [_core.pack_weight(random_two_level("liquid", n, k, GROUP, i), "sm80", "cuda:0") for i in range(copies)]
    w16 = [torch.randn(n, k, device="cuda").half() for _ in range(copies_for(n * k * 2, l2))]
    blocks = (k + 127) // 128
    bits = torch.full((blocks,), 4, dtype=torch.uint8)
    bits[torch.randperm(blocks, generator=torch.Generator().manual_seed(0))[: round(INT8_FRACTION * blocks)]] = 8
    cs = torch.cuda.current_stream
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda").half()
        xi8 = torch.empty(m, k, dtype=torch.int8, device="cuda")
        xs = torch.empty(m, device="cuda")
        fq = torch.empty(m, k, dtype=torch.int8, device="cuda")
        fs = torch.empty(m, blocks, device="cuda")
        y = torch.empty(m, n, device="cuda").half()
        # lowbit tensors made once: DLPack export is not allowed inside a graph capture.
        lx, lxi8, lxs, lfq, lfs, ly = (lowbit.from_dlpack(t) for t in (x, xi8, xs, fq, fs, y))
        lbits = lowbit.from_dlpack(bits)
        _core.quantize_per_token_s8(lx, lxi8, lxs)
        _core.quantize_fmpq_gpu(lx, lbits, lfq, lfs)
        row = {"shape": name, "n": n, "k": k, "m": m, "int8_block_fraction": float((bits == 8).float().mean())}
        row["cublas_fp16_us"] = graph_time_us([lambda w=w: torch.matmul(x, w.T) for w in w16])
        row["w4a8_us"] = graph_time_us([lambda w=w: _core.gemm_w4a8(lxi8, lxs, w, ly, 0, cs().cuda_stream) for w in ws])
        row["w4a8_with_quant_us"] = graph_time_us(
            [lambda w=w: (_core.quantize_per_token_s8(lx, lxi8, lxs, cs().cuda_stream),
                          _core.gemm_w4a8(lxi8, lxs, w, ly, 0, cs().cuda_stream)) for w in ws])
        row["w4a8_sm80_us"] = graph_time_us(
            [lambda w=w: _core.gemm_w4a8(lxi8, lxs, w, ly, 0, cs().cuda_stream, "sm80") for w in ws])
        row["fmpq_us"] = graph_time_us([lambda w=w: _core.gemm_fmpq(lfq, lfs, w, ly, 0, cs().cuda_stream) for w in ws])
        row["fmpq_sm80_us"] = graph_time_us(
            [lambda w=w: _core.gemm_fmpq(lfq, lfs, w, ly, 0, cs().cuda_stream, "sm80") for w in ws])
        if m <= 16:
            row["fmpq_gemv_us"] = graph_time_us(
                [lambda w=w: _core.gemm_fmpq(lfq, lfs, w, ly, 0, cs().cuda_stream, "gemv") for w in ws])
        if SM90 and m >= 128:
            row["fmpq_serial_us"] = graph_time_us(
                [lambda w=w: _core.gemm_fmpq(lfq, lfs, w, ly, 0, cs().cuda_stream, "sm90s") for w in ws])
            row["w4a8_t128_us"] = graph_time_us(
                [lambda w=w: _core.gemm_w4a8(lxi8, lxs, w, ly, 0, cs().cuda_stream, "sm90:0:128") for w in ws])
        row["fmpq_with_quant_us"] = graph_time_us(
            [lambda w=w: (_core.quantize_fmpq_gpu(lx, lbits, lfq, lfs, cs().cuda_stream),
                          _core.gemm_fmpq(lfq, lfs, w, ly, 0, cs().cuda_stream)) for w in ws])
        row["fmpq_vs_w4a8"] = row["w4a8_with_quant_us"] / row["fmpq_with_quant_us"]
        row["fmpq_alone_vs_w4a8"] = row["w4a8_us"] / row["fmpq_us"]  # GEMM alone, each op's own kernel
        row["fmpq_vs_w4a8_sm80"] = row["w4a8_sm80_us"] / row["fmpq_sm80_us"]
        row["fmpq_vs_cublas"] = row["cublas_fp16_us"] / row["fmpq_with_quant_us"]
        rows.append(row)
        print(f"{name:8s} m={m:5d} cublas {row['cublas_fp16_us']:8.1f}  w4a8 {row['w4a8_us']:7.1f} "
              f"(+quant {row['w4a8_with_quant_us']:7.1f}, sm80 {row['w4a8_sm80_us']:7.1f})  fmpq {row['fmpq_us']:7.1f} "
              f"(+quant {row['fmpq_with_quant_us']:7.1f}, sm80 {row['fmpq_sm80_us']:7.1f})  fmpq/w4a8 x{row['fmpq_vs_w4a8']:.2f}  "
              f"vs sm80 x{row['fmpq_vs_w4a8_sm80']:.2f}  vs cublas x{row['fmpq_vs_cublas']:.2f}"
              + (f"  serial {row['fmpq_serial_us']:7.1f}  w4a8 t128 {row['w4a8_t128_us']:7.1f}" if "fmpq_serial_us" in row
                 else "") + (f"  gemv {row['fmpq_gemv_us']:7.1f}" if "fmpq_gemv_us" in row else ""), flush=True)
    return rows


def main():
    ms_flag = [a for a in sys.argv[1:] if a.startswith("--ms=")]
    ms = [int(v) for v in ms_flag[0][5:].split(",")] if ms_flag else MS
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = args[0] if args else "bench_fmpq.json"
    meta = device_meta()
    meta["shapes"] = "Llama-3-8B"
    meta["weights"] = f"liquid g{GROUP}"
    rows = []
    for name, (n, k) in SHAPES.items():
        rows += bench_shape(name, n, k, ms, meta["l2_bytes"])
        torch.cuda.empty_cache()
        write_json(out, {"meta": meta, "rows": rows})  # after every shape: a timed-out run keeps what it measured


if __name__ == "__main__":
    main()
