"""The weight-stationary wgmma GEMMs (W4A16 gemm_w4a16_sm90, W4A8 gemm_w4a8_sm90) per tile and split-K cluster,
serial and overlapped mainloop, vs cuBLAS fp16 and torch._scaled_mm fp8 in the same process, on Llama-3-8B layer
shapes (random weights: cost does not depend on values).

  python tools/bench_gpu_sm90_tiles.py OUT.json [--ms=128,256,1024] [--shapes=qkv,o] [--variants=sm90:1:256,...]
      [--streamk=128,256] [--w4a8=auto] [--w4a8-only]

Per (shape, M) row: cublas_fp16_us, torch_scaled_mm_fp8_us (per-tensor scales), and for each kernel
w4a16_<name>_us / w4a8_<name>_us where <name> is a gemm_w4a16 / gemm_w4a8 kernel string: 'sm90' (the cost
model's choice, its (tokens, split, head) in *_plan; head > 0: tiles [0, head) unsplit in a first launch, the rest
at the split in a second), 'sm90:S:T' (overlapped mainloop, split S, T tokens per tile, one launch) and 'sm90s:S:T'
(the serial mainloop the kernels had before); --variants limits the forced ones. W4A8 is the GEMM alone on int8 codes
(QoQ g128 weights). Stream-K columns, both kernels: *_sm90k:T_us (one persistent launch over every resident CTA, T
tokens per tile; --streamk=128,256 picks the tiles, --streamk= none) and *_sm90n_us (the automatic plan without the
stream-K candidate: the previous rounds' plan, in *_plan_n); --w4a8=auto times W4A8 at those columns only, --w4a8=none
not at all. W4A16's wide tile (256 weight rows x 128 tokens per CTA) is named like the others in --variants: 'sm90w:S',
'sm90w' (its split by the cost model), 'sm90wk' (stream-K). --w4a8-only skips W4A16 and adds w4a8_sm90o_us (the W4A8
kernel's earlier one-thread producer, its automatic plan in w4a8_plan_o); W4A8 variants may then name it ('sm90o:1:256'),
or the persistent tile loop ('sm90p', 'sm90p:T'; the tile a free 'sm90p' takes in w4a8_plan_p). --no-ab drops the
sm90n / sm90o columns (a shorter run for the persistent kernel's A/B: --w4a8-only --no-ab --streamk=
--variants=sm90:1:256,sm90p:256,sm90p:128,sm90p).
"""
import sys

import torch

import lowbit
from lowbit import _core

from bench_gpu_common import copies_for, device_meta, graph_time_us, write_json

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
MS = [128, 256, 1024]
VARIANTS = [f"{loop}:{s}:{t}" for loop in ("sm90s", "sm90") for t in (128, 256) for s in (1, 2, 4)]


def w4a16_weights(n, k, copies):
    q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    s = (torch.rand(n, k // 128) * 0.02 + 0.002).half()
    z = (torch.rand(n, k // 128) * 15).half()
    data, ps, pz = (torch.from_dlpack(t).cuda() for t in _core.pack_w4_sm80(q, s, z, 128))
    ws = [(data.clone(), ps.clone(), pz.clone()) for _ in range(copies)]
    return ws, [tuple(lowbit.from_dlpack(t) for t in w) for w in ws]


def w4a8_weights(n, k, copies):
    g = torch.Generator().manual_seed(n + k)
    groups = k // 128
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g)
    s = torch.randint(1, 9, (n, groups), dtype=torch.uint8, generator=g)
    z = torch.minimum(torch.randint(0, 16, (n, groups), generator=g), 128 // s.long()).to(torch.uint8)
    cs = torch.rand(n, generator=g) * 1e-3 + 1e-4
    qw = _core.QuantizedWeight("qoq", q, s, z, cs, 128)
    return [_core.pack_weight(qw, "sm80", "cuda:0") for _ in range(copies)]


def time_or_error(row, key, fns):
    try:
        row[key] = graph_time_us(fns)
    except Exception as e:  # noqa: BLE001 - record why (e.g. a refused split)
        row[key.replace("_us", "_error")] = str(e).splitlines()[0][:160]


def bench_shape(name, n, k, ms, l2, variants=VARIANTS, streamk=("sm90k:128", "sm90k:256"), w4a8_all=True,
                w4a8_none=False, w4a8_only=False, ab=True):
    rows = []
    stream = torch.cuda.current_stream
    wf16 = [torch.randn(n, k, device="cuda").half() for _ in range(copies_for(n * k * 2, l2))]
    wf8 = [torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn) for _ in range(copies_for(n * k, l2))]
    _, w16 = w4a16_weights(n, k, 1 if w4a8_only else copies_for(n * k // 2, l2))
    w8 = [] if w4a8_none else w4a8_weights(n, k, copies_for(n * k // 2, l2))
    one = torch.ones((), device="cuda")
    for m in ms:
        row = {"shape": name, "n": n, "k": k, "m": m}
        x = torch.randn(m, k, device="cuda").half()
        row["cublas_fp16_us"] = graph_time_us([lambda w=w: torch.matmul(x, w.T) for w in wf16])
        xf = torch.randn(max(m, 16), k, device="cuda").to(torch.float8_e4m3fn)
        time_or_error(row, "torch_scaled_mm_fp8_us", [
            lambda w=w: torch._scaled_mm(xf, w.T, scale_a=one, scale_b=one, out_dtype=torch.float16) for w in wf8])
        y = torch.empty(m, n, device="cuda").half()
        lx, ly = lowbit.from_dlpack(x), lowbit.from_dlpack(y)
        xq = torch.randint(-127, 128, (m, k), dtype=torch.int8, device="cuda")
        xs = torch.rand(m, device="cuda") * 0.01
        lxq, lxs = lowbit.from_dlpack(xq), lowbit.from_dlpack(xs)
        row["w4a16_plan"] = list(_core.gemm_w4a16_sm90_plan(m, n, k))
        row["w4a8_plan"] = [] if w4a8_none else list(_core.gemm_w4a8_sm90_plan(m, n, k))
        row["w4a16_plan_n"] = list(_core.gemm_w4a16_sm90_plan(m, n, k, kernel="sm90n"))
        if hasattr(_core, "gemm_w4a16_sm90_plan_rows"):  # the wide tile's round: rows per CTA, the plan before it
            row["w4a16_plan_rows"] = _core.gemm_w4a16_sm90_plan_rows(m, n, k)
            row["w4a16_plan_nw"] = list(_core.gemm_w4a16_sm90_plan(m, n, k, kernel="sm90nw"))
            row["w4a16_plan_w"] = list(_core.gemm_w4a16_sm90_plan(m, n, k, kernel="sm90w"))
        row["w4a8_plan_n"] = [] if w4a8_none else list(_core.gemm_w4a8_sm90_plan(m, n, k, kernel="sm90n"))
        if w4a8_only:
            row["w4a8_plan_o"] = list(_core.gemm_w4a8_sm90_plan(m, n, k, kernel="sm90o"))
        if any(v.startswith("sm90p") for v in variants):
            row["w4a8_plan_p"] = list(_core.gemm_w4a8_sm90_plan(m, n, k, kernel="sm90p"))
        ab_columns = (["sm90n"] + (["sm90o"] if w4a8_only else [])) if ab else []
        for kernel in ["sm90"] + ab_columns + variants + list(streamk):
            if not w4a8_only:
                time_or_error(row, f"w4a16_{kernel}_us", [
                    lambda w=w, kn=kernel: _core.gemm_w4a16(lx, w[0], w[1], w[2], n, k, 128, ly, 0, None,
                                                            stream().cuda_stream, kernel=kn) for w in w16])
            if w4a8_none or (not w4a8_all and kernel in variants):
                continue
            time_or_error(row, f"w4a8_{kernel}_us", [
                lambda w=w, kn=kernel: _core.gemm_w4a8(lxq, lxs, w, ly, 0, stream().cuda_stream, kn) for w in w8])
        rows.append(row)
        # The fastest one-launch pair timed (with every overlapped pair: the best the one-launch plans can do).
        before16 = row.get("w4a16_sm90n_us", float("nan"))
        before8 = row.get("w4a8_sm90n_us", float("nan"))
        cb, f8 = row["cublas_fp16_us"], row.get("torch_scaled_mm_fp8_us", float("nan"))
        a16, a8 = row.get("w4a16_sm90_us", float("nan")), row.get("w4a8_sm90_us", float("nan"))
        if w4a8_only:
            old = row.get("w4a8_sm90o_us", float("nan"))
            if not ab:
                print(f"{name:8s} M={m:5d} cuBLAS {cb:7.1f} fp8 {f8:7.1f} | W4A8 sm90 {a8:7.1f} "
                      f"{tuple(row['w4a8_plan'])} {f8 / a8:5.2f}x fp8 | sm90p plan {tuple(row.get('w4a8_plan_p', ()))}",
                      flush=True)
                print("   W4A8  " + " ".join(f"{v} {row.get(f'w4a8_{v}_us', float('nan')):.1f} "
                                             f"({f8 / row.get(f'w4a8_{v}_us', float('nan')):.2f}x fp8)"
                                             for v in variants + list(streamk)))
                continue
            print(f"{name:8s} M={m:5d} cuBLAS {cb:7.1f} fp8 {f8:7.1f} | W4A8 one-producer {old:7.1f} "
                  f"{tuple(row['w4a8_plan_o'])} now {a8:7.1f} {tuple(row['w4a8_plan'])} {cb / a8:5.2f}x cuBLAS "
                  f"{f8 / a8:5.2f}x fp8 (was {f8 / old:5.2f}x)", flush=True)
            print("   W4A8  " + " ".join(f"{v} {row.get(f'w4a8_{v}_us', float('nan')):.1f}"
                                         for v in variants + list(streamk)))
            continue
        print(f"{name:8s} M={m:5d} cuBLAS {cb:7.1f} fp8 {f8:7.1f} | W4A16 no-SK {before16:7.1f} now {a16:7.1f} "
              f"{tuple(row['w4a16_plan'])} {cb / a16:5.2f}x | W4A8 no-SK {before8:7.1f} now {a8:7.1f} "
              f"{tuple(row['w4a8_plan'])} {cb / a8:5.2f}x cuBLAS {f8 / a8:5.2f}x fp8", flush=True)
        print("   W4A16 " + " ".join(f"{v} {row.get(f'w4a16_{v}_us', float('nan')):.1f}"
                                     for v in variants + list(streamk)))
        print("   W4A8  " + " ".join(f"{v} {row.get(f'w4a8_{v}_us', float('nan')):.1f}"
                                     for v in variants + list(streamk)))
    return rows


def main():
    out = sys.argv[1]
    ms = next((a[5:] for a in sys.argv[2:] if a.startswith("--ms=")), None)
    ms = [int(v) for v in ms.split(",")] if ms else MS
    names = next((a[9:].split(",") for a in sys.argv[2:] if a.startswith("--shapes=")), list(SHAPES))
    variants = next(([v for v in a[11:].split(",") if v] for a in sys.argv[2:] if a.startswith("--variants=")), VARIANTS)
    sk = next((a[10:] for a in sys.argv[2:] if a.startswith("--streamk=")), "128,256")
    streamk = [f"sm90k:{t}" for t in sk.split(",") if t]
    w4a8_all = "--w4a8=auto" not in sys.argv[2:]
    w4a8_none = "--w4a8=none" in sys.argv[2:]
    w4a8_only = "--w4a8-only" in sys.argv[2:]
    ab = "--no-ab" not in sys.argv[2:]
    meta = device_meta()
    rows = []
    for name in names:
        rows += bench_shape(name, *SHAPES[name], ms, meta["l2_bytes"], variants, streamk, w4a8_all, w4a8_none,
                            w4a8_only, ab)
        write_json(out, {"meta": meta, "gemm": rows})


if __name__ == "__main__":
    main()
