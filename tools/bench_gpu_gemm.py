"""W4A16 / W8A8 / FP8 GEMMs vs peers on Llama-3-8B (or, with --llama70b, 70B) layer shapes (random weights;
cost does not depend on values). Modes: default (everything), --w4a16-only, --w8a8-only, --fp8-only, --sweep; --ms=256,1024 limits the
token counts.
--w4a8-only: lowbit W4A8 (QoQ g128 and LiquidQuant g64 weights, the GEMM alone and with the per-token int8
quantizer) vs cuBLAS fp16, lowbit W4A16 and W8A8, torch._scaled_mm fp8.
--f16-only: lowbit's f16 GEMM (the w16a16 linear: default dispatch and each registered f16 kernel forced
through linear(..., kernel=gemm_f16_{gemv,wmma,mma}_sm80 / gemm_f16_cublaslt)) vs cuBLAS fp16, on the four
linears and the 8B lm_head (128256 x 4096).
From M=64 the W4A16 rows also time each W4A16 kernel forced (gemm_w4a16(..., kernel=small / large:<tile> / sm90:<split>)).

Peers in the same process: cuBLAS fp16 (torch.matmul), tinygemm int4 (torch._weight_int4pack_mm),
int8 (torch._int_mm), fp8 (torch._scaled_mm). Writes JSON (argv[1]) and prints a table.
"""
import sys

import torch

import lowbit
from lowbit import _core

from bench_gpu_common import (copies_for, copy_bandwidth_gbs, device_meta, graph_time_us, profiled_kernel_us,
                              write_json)

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
# --f16-only also times the f16 lm_head of Llama-3-8B (vocab 128256; every recipe keeps it in f16).
LM_HEAD_8B = {"lm_head": (128256, 4096)}
# --llama70b: the same four linears of Llama-3-70B (hidden 8192, 64 q / 8 kv heads of 128, intermediate 28672).
SHAPES_70B = {"qkv": (10240, 8192), "o": (8192, 8192), "gate_up": (57344, 8192), "down": (8192, 28672)}
MS = [1, 16, 64, 256, 1024]
GROUP = 128


def ours_setup(n, k, copies, m, split=None, kernel="", group=GROUP, mins=False):
    """lowbit W4A16 calls over `copies` weight copies; mins: the weight is kept as w = q*s + m (GGUF Q4_1)."""
    q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    s = (torch.rand(n, k // group) * 0.02 + 0.002).half()
    z = (torch.rand(n, k // group) * 15).half()
    packed = _core.pack_w4_sm80(q, s, None, group, mins=-z * s) if mins else _core.pack_w4_sm80(q, s, z, group)
    data, ps, pz = (torch.from_dlpack(t).cuda() for t in packed)
    ws = [(data.clone(), ps.clone(), pz.clone()) for _ in range(copies)]
    split = _core.gemm_w4a16_pick_split(m, n, k, kernel=kernel) if split is None else split
    x = torch.randn(m, k, device="cuda").half()
    y = torch.empty(m, n, device="cuda").half()
    work = torch.empty(max(1, split * m * n), device="cuda")
    # Convert to lowbit tensors once: DLPack export is not allowed inside graph capture.
    lx, ly, lwork = lowbit.from_dlpack(x), lowbit.from_dlpack(y), lowbit.from_dlpack(work)
    lws = [tuple(lowbit.from_dlpack(t) for t in w) for w in ws]
    stream = torch.cuda.current_stream

    def make(w):
        return lambda: _core.gemm_w4a16(lx, w[0], w[1], w[2], n, k, group, ly, split, lwork,
                                        stream().cuda_stream, kernel=kernel, mins=mins)
    return [make(w) for w in lws], split


def cublas_baseline(name, n, k, m, l2):
    """The row every mode starts from: the shape, a random f16 activation x [m, k] and cuBLAS fp16's time
    for x · wᵀ over enough weight copies to miss L2. Returns (row, x)."""
    row = {"shape": name, "n": n, "k": k, "m": m}
    x = torch.randn(m, k, device="cuda").half()
    ws = [torch.randn(n, k, device="cuda").half() for _ in range(copies_for(n * k * 2, l2))]
    row["cublas_fp16_us"] = graph_time_us([lambda w=w: torch.matmul(x, w.T) for w in ws])
    return row, x


def bench_shape(name, n, k, m, l2):
    int4_bytes = n * k // 2 + 2 * n * (k // GROUP) * 2
    row, x = cublas_baseline(name, n, k, m, l2)
    c4 = copies_for(int4_bytes, l2)
    fns, split = ours_setup(n, k, c4, m)
    row["lowbit_w4a16_us"] = graph_time_us(fns)
    row["lowbit_split_k"] = split
    row["int4_bytes"] = int4_bytes
    del fns
    w4a16_forced_times(row, n, k, m, c4)
    int4_peers(row, x, n, k, c4)
    w8a8_and_int8_peers(row, x, n, k, m, l2)
    row["speedup_vs_cublas"] = row["cublas_fp16_us"] / row["lowbit_w4a16_us"]
    return row


def int4_peers(row, x, n, k, copies):
    """The int4 weight-only peers with group 128: tinygemm (torch._weight_int4pack_mm, bf16) and gemlite
    (pure Triton, A16W4 HQQ-style asymmetric groups, f16) when it is installed. A peer that cannot run
    records why."""
    try:
        xb = x.bfloat16()
        wq = torch.randint(0, 16, (n, k), dtype=torch.int32, device="cuda")
        packed = torch._convert_weight_to_int4pack((wq[:, ::2] << 4 | wq[:, 1::2]).to(torch.uint8), 8)
        sz = torch.randn(k // GROUP, n, 2, device="cuda").bfloat16()
        pk = [packed.clone() for _ in range(copies)]
        row["tinygemm_int4_us"] = graph_time_us([lambda p=p: torch._weight_int4pack_mm(xb, p, GROUP, sz) for p in pk])
        del pk
    except Exception as e:  # noqa: BLE001 - record why the peer could not run
        row["tinygemm_int4_error"] = str(e).splitlines()[0][:160]
    try:
        from gemlite.helper import A16W4_HQQ_INT
        layers = []
        for _ in range(copies):
            wq = torch.randint(0, 16, (n, k), dtype=torch.uint8, device="cuda")
            scales = (torch.rand(n, k // GROUP, device="cuda") * 0.02 + 0.002).half()
            zeros = (torch.rand(n, k // GROUP, device="cuda") * 15).half()
            layers.append(A16W4_HQQ_INT(device="cuda", dtype=torch.float16).from_weights(wq, scales, zeros))
        row["gemlite_w4a16_us"] = graph_time_us([lambda layer=layer: layer(x) for layer in layers])
        del layers
    except Exception as e:  # noqa: BLE001 - not installed, or it failed: say which
        row["gemlite_w4a16_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:140] if str(e) else ''}"


W4A16_KERNELS = ["small", "large", "large:64x128", "large:128x128", "large:128x256", "sm90", "sm90:1", "sm90:2",
                 "sm90:4"]


def w4a16_forced_times(row, n, k, m, copies):
    """From 64 tokens: the W4A16 time with each kernel / large-M tile forced (gemm_w4a16's kernel argument),
    as row["lowbit_w4a16_<kernel>_us"] (e.g. lowbit_w4a16_large:128x128_us). The default dispatch (the
    lowbit_w4a16_us column) runs the wgmma kernel ("sm90") on sm_90, else the large kernel, from 128 tokens,
    "small" below; on other GPUs the sm90 rows record their refusal."""
    if m < 64:
        return
    for kernel in W4A16_KERNELS:
        try:
            fns, _ = ours_setup(n, k, copies, m, kernel=kernel)
            row[f"lowbit_w4a16_{kernel}_us"] = graph_time_us(fns)
            del fns
        except Exception as e:  # noqa: BLE001 - record why (e.g. a tile over the GPU's shared memory)
            row[f"lowbit_w4a16_{kernel}_error"] = str(e).splitlines()[0][:160]


def w4a16_forced_str(row):
    return "  ".join(f"{kern} {row[f'lowbit_w4a16_{kern}_us']:7.1f}" for kern in W4A16_KERNELS
                     if f"lowbit_w4a16_{kern}_us" in row)


def bench_w4a16_only(name, n, k, m, l2):
    """--w4a16-only: W4A16 vs cuBLAS fp16 and tinygemm, without the W8A8/int8/fp8 peers."""
    int4_bytes = n * k // 2 + 2 * n * (k // GROUP) * 2
    row, x = cublas_baseline(name, n, k, m, l2)
    c4 = copies_for(int4_bytes, l2)
    fns, split = ours_setup(n, k, c4, m)
    row["lowbit_w4a16_us"], row["lowbit_split_k"], row["int4_bytes"] = graph_time_us(fns), split, int4_bytes
    del fns
    # A GGUF Q4_1 weight as stored: groups of 32 with mins (4x the parameter bytes of g128).
    fns, _ = ours_setup(n, k, copies_for(n * k // 2 + 2 * n * (k // 32) * 2, l2), m, group=32, mins=True)
    row["lowbit_w4a16_g32_mins_us"] = graph_time_us(fns)
    del fns
    for group in (0, 32):  # W8A16: per-channel w8 (recipe w8a16) and Q8_0's groups of 32 (w8a16g32)
        row[f"lowbit_w8a16_g{group}_us"] = w8a16_time(x, n, k, group, l2)
    w4a16_forced_times(row, n, k, m, c4)
    int4_peers(row, x, n, k, c4)
    row["speedup_vs_cublas"] = row["cublas_fp16_us"] / row["lowbit_w4a16_us"]
    return row


def w8a16_time(x, n, k, group, l2):
    """lowbit W8A16 over enough weight copies to miss L2: int8 [n, k] with f32 scales per channel or group."""
    scale_shape = (n,) if group == 0 else (n, k // group)
    ws = [(torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda"),
           torch.rand(scale_shape, device="cuda") * 0.01) for _ in range(copies_for(n * k, l2))]
    y = torch.empty(x.shape[0], n, device="cuda").half()
    m = x.shape[0]  # split-K partials (split <= 64, <= 8 from 65 tokens): no allocation inside the graph
    work = torch.empty((64 if m <= 64 else 8) * m * n, device="cuda")
    lx, ly, lwork = lowbit.from_dlpack(x), lowbit.from_dlpack(y), lowbit.from_dlpack(work)
    lws = [(lowbit.from_dlpack(q), lowbit.from_dlpack(s)) for q, s in ws]
    cs = torch.cuda.current_stream
    return graph_time_us([lambda w=w: _core.gemm_w8a16(lx, w[0], w[1], group, ly, workspace=lwork,
                                                       stream=cs().cuda_stream) for w in lws])


def w8a8_and_int8_peers(row, x, n, k, m, l2):
    """lowbit W8A8 (default dispatch, each kernel forced, with the quantizer), torch._int_mm, fp8 _scaled_mm."""
    # lowbit W8A8: the GEMM alone and with the per-token activation quantizer in front of it.
    xi8 = torch.empty(m, k, dtype=torch.int8, device="cuda")
    xs = torch.empty(m, device="cuda")
    y16 = torch.empty(m, n, device="cuda").half()
    w8 = [torch.randint(-127, 128, (n, k), dtype=torch.int8, device="cuda") for _ in range(copies_for(n * k, l2))]
    ws8 = torch.rand(n, device="cuda") * 0.01
    _core.quantize_per_token_s8(x, xi8, xs)
    lx, lxi8, lxs, ly16, lws8 = (lowbit.from_dlpack(t) for t in (x, xi8, xs, y16, ws8))
    lw8 = [lowbit.from_dlpack(w) for w in w8]
    cs = torch.cuda.current_stream
    row["lowbit_w8a8_us"] = graph_time_us(
        [lambda w=w: _core.gemm_w8a8(lxi8, lxs, w, lws8, ly16, cs().cuda_stream) for w in lw8])
    row["lowbit_w8a8_with_quant_us"] = graph_time_us(
        [lambda w=w: (_core.quantize_per_token_s8(lx, lxi8, lxs, cs().cuda_stream),
                      _core.gemm_w8a8(lxi8, lxs, w, lws8, ly16, cs().cuda_stream)) for w in lw8])
    row["w8a8_speedup_vs_cublas"] = row["cublas_fp16_us"] / row["lowbit_w8a8_with_quant_us"]
    forced_kernel_times(row, "lowbit_w8a8", lambda kernel: [
        lambda w=w: _core.gemm_w8a8(lxi8, lxs, w, lws8, ly16, cs().cuda_stream, kernel=kernel) for w in lw8])
    del w8, lw8
    try:
        if m > 16:
            xi = torch.randint(-128, 128, (m, k), dtype=torch.int8, device="cuda")
            wi = [torch.randint(-128, 128, (k, n), dtype=torch.int8, device="cuda").T.contiguous().T
                  for _ in range(copies_for(n * k, l2))]
            row["torch_int_mm_us"] = graph_time_us([lambda w=w: torch._int_mm(xi, w) for w in wi])
            del wi
    except Exception as e:  # noqa: BLE001
        row["torch_int_mm_error"] = str(e).splitlines()[0][:160]
    fp8_peers(row, x, n, k, m, l2)


def forced_kernel_times(row, prefix, make_fns):
    """Times make_fns(kernel) with each 8-bit GEMM kernel forced (the ops' kernel argument; the default
    dispatch picks per device): row[f"{prefix}_sm80_us"] and row[f"{prefix}_sm90_us"], or *_error when one
    cannot run."""
    for path in ("sm80", "sm90"):
        try:
            row[f"{prefix}_{path}_us"] = graph_time_us(make_fns(path))
        except Exception as e:  # noqa: BLE001 - e.g. sm90 on a non-Hopper GPU
            row[f"{prefix}_{path}_error"] = str(e).splitlines()[0][:160]


def fp8_peers(row, x, n, k, m, l2):
    """lowbit FP8 W8A8 (e4m3 GEMM: default dispatch, each kernel forced, and with its per-token quantizer)
    and torch._scaled_mm (fp8 e4m3, per-tensor scales, M padded to 16)."""
    cs = torch.cuda.current_stream
    try:
        xq = torch.empty(m, k, dtype=torch.uint8, device="cuda")
        xs = torch.empty(m, device="cuda")
        y16 = torch.empty(m, n, device="cuda").half()
        wf8 = [torch.randn(n, k, device="cuda").mul(20).to(torch.float8_e4m3fn).view(torch.uint8)
               for _ in range(copies_for(n * k, l2))]
        wsf = torch.rand(n, device="cuda") * 0.01
        lx, lxq, lxs, ly16, lwsf = (lowbit.from_dlpack(t) for t in (x, xq, xs, y16, wsf))
        lwf = [lowbit.from_dlpack(w) for w in wf8]
        _core.quantize_per_token_e4m3(lx, lxq, lxs)
        row["lowbit_fp8_us"] = graph_time_us(
            [lambda w=w: _core.gemm_fp8(lxq, lxs, w, lwsf, ly16, cs().cuda_stream) for w in lwf])
        row["lowbit_fp8_with_quant_us"] = graph_time_us(
            [lambda w=w: (_core.quantize_per_token_e4m3(lx, lxq, lxs, cs().cuda_stream),
                          _core.gemm_fp8(lxq, lxs, w, lwsf, ly16, cs().cuda_stream)) for w in lwf])
        row["fp8_speedup_vs_cublas"] = row["cublas_fp16_us"] / row["lowbit_fp8_with_quant_us"]
        def fp8_fns(kernel, fast_accum=False):
            return [lambda w=w: _core.gemm_fp8(lxq, lxs, w, lwsf, ly16, cs().cuda_stream, kernel=kernel,
                                               fast_accum=fast_accum) for w in lwf]
        forced_kernel_times(row, "lowbit_fp8", fp8_fns)
        if "lowbit_fp8_sm90_us" in row:  # without promotion to f32 per 128-k stage (opt-in)
            row["lowbit_fp8_sm90_fast_accum_us"] = graph_time_us(fp8_fns("sm90", fast_accum=True))
        del wf8, lwf
    except Exception as e:  # noqa: BLE001 - e.g. a GPU without fp8 tensor cores
        row["lowbit_fp8_error"] = str(e).splitlines()[0][:160]
    try:
        mm = max(m, 16)
        xf = torch.randn(mm, k, device="cuda").to(torch.float8_e4m3fn)
        wf = [torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn) for _ in range(copies_for(n * k, l2))]
        one = torch.ones((), device="cuda")
        row["torch_scaled_mm_fp8_us"] = graph_time_us(
            [lambda w=w: torch._scaled_mm(xf, w.T, scale_a=one, scale_b=one, out_dtype=torch.float16) for w in wf])
        row["fp8_m_used"] = mm
        del wf
    except Exception as e:  # noqa: BLE001
        row["torch_scaled_mm_error"] = str(e).splitlines()[0][:160]


def bench_fp8_only(name, n, k, m, l2):
    """--fp8-only: lowbit FP8 W8A8 (default dispatch, lowbit_fp8_sm80_us / _sm90_us with each kernel forced,
    lowbit_fp8_sm90_fast_accum_us without the per-stage f32 promotion, with the quantizer) vs cuBLAS fp16
    and torch._scaled_mm (whose default, use_fast_accum=False, also promotes)."""
    row, x = cublas_baseline(name, n, k, m, l2)
    fp8_peers(row, x, n, k, m, l2)
    return row


def bench_w8a8_only(name, n, k, m, l2):
    """--w8a8-only: W8A8 vs cuBLAS fp16 and the int8/fp8 peers, without the W4A16 ones."""
    row, x = cublas_baseline(name, n, k, m, l2)
    w8a8_and_int8_peers(row, x, n, k, m, l2)
    return row


def random_two_level(fmt, n, k, group, seed):
    """A valid qoq / liquid QuantizedWeight with random fields (cost does not depend on values; quantizing
    a float weight this size takes longer than the benchmark)."""
    g = torch.Generator().manual_seed(seed)
    groups = (k + group - 1) // group
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g)
    s = torch.randint(1, 9, (n, groups), dtype=torch.uint8, generator=g)
    if fmt == "qoq":  # zero points with z*s <= 128 and q*s - z*s inside s8
        z = torch.minimum(torch.randint(0, 16, (n, groups), generator=g), 128 // s.long()).to(torch.uint8)
    else:  # offsets a = 128 + min with q*s + a <= 255
        z = (128 - torch.randint(0, 120, (n, groups), generator=g)).clamp(max=255 - 15 * s.long()).to(torch.uint8)
    cs = torch.rand(n, generator=g) * 1e-3 + 1e-4
    return _core.QuantizedWeight(fmt, q, s, z, cs, group)


def w4a8_peers(row, x, n, k, m, l2):
    """lowbit W4A8 for both weight formats: the GEMM on int8 codes, and with the quantizer in front."""
    xi8 = torch.empty(m, k, dtype=torch.int8, device="cuda")
    xs = torch.empty(m, device="cuda")
    y16 = torch.empty(m, n, device="cuda").half()
    lx, lxi8, lxs, ly16 = (lowbit.from_dlpack(t) for t in (x, xi8, xs, y16))
    _core.quantize_per_token_s8(lx, lxi8, lxs)
    cs = torch.cuda.current_stream
    for fmt, group in (("qoq", 128), ("liquid", 64)):
        groups = (k + group - 1) // group
        copies = copies_for(n * k // 2 + 2 * n * groups, l2)
        ws = [_core.pack_weight(random_two_level(fmt, n, k, group, i), "sm80", "cuda:0") for i in range(copies)]
        row[f"lowbit_w4a8_{fmt}_us"] = graph_time_us(
            [lambda w=w: _core.gemm_w4a8(lxi8, lxs, w, ly16, 0, cs().cuda_stream) for w in ws])
        row[f"lowbit_w4a8_{fmt}_with_quant_us"] = graph_time_us(
            [lambda w=w: (_core.quantize_per_token_s8(lx, lxi8, lxs, cs().cuda_stream),
                          _core.gemm_w4a8(lxi8, lxs, w, ly16, 0, cs().cuda_stream)) for w in ws])
        # Each kernel forced (the default above is the op's automatic choice: wgmma from 128 tokens on sm_90).
        for kernel in ["sm80"] + (["sm90"] if torch.cuda.get_device_capability() == (9, 0) else []):
            row[f"lowbit_w4a8_{fmt}_{kernel}_us"] = graph_time_us(
                [lambda w=w: _core.gemm_w4a8(lxi8, lxs, w, ly16, 0, cs().cuda_stream, kernel) for w in ws])
        del ws
    row["w4a8_speedup_vs_cublas"] = row["cublas_fp16_us"] / row["lowbit_w4a8_liquid_with_quant_us"]


def bench_w4a8_only(name, n, k, m, l2):
    """--w4a8-only: W4A8 (both formats) vs cuBLAS fp16, lowbit W4A16 and W8A8, torch._scaled_mm fp8."""
    row, x = cublas_baseline(name, n, k, m, l2)
    w4a8_peers(row, x, n, k, m, l2)
    fns, split = ours_setup(n, k, copies_for(n * k // 2, l2), m)
    row["lowbit_w4a16_us"] = graph_time_us(fns)
    del fns
    w8a8_and_int8_peers(row, x, n, k, m, l2)
    return row


F16_KERNELS = ["mma", "wmma", "gemv", "cublaslt"]
# The f16 GEMM is reached only through lowbit's linear op, which launches on lowbit's current stream (the
# legacy default stream from Python: no stream scope is exposed), and a torch graph capture refuses such
# launches: it is timed by the profiler's device times (the GEMM and, with split-K, its sum kernel).
F16_REPS = 10
_F16_WEIGHTS = {}


def f16_kernel_name(kernel):
    return "gemm_f16_cublaslt" if kernel == "cublaslt" else f"gemm_f16_{kernel}_sm80"


def f16_setup(n, k, copies, m, kernel=""):
    """lowbit.linear calls y = x · wᵀ over `copies` f16 weights packed for sm80 (lowbit tensors made once),
    with a registered f16 kernel forced ("" = the registry's choice)."""
    key = (n, k, copies)
    if key not in _F16_WEIGHTS:  # made once per shape: the lm_head's 0.5 G values take seconds on the host
        _F16_WEIGHTS.clear()
        g = torch.Generator().manual_seed(n + k)
        qw = _core.quantize_weight((torch.randn(n, k, generator=g) * 0.02), "f16", GROUP)
        _F16_WEIGHTS[key] = [_core.pack_weight(qw, "sm80", "cuda") for _ in range(copies)]
    ws = _F16_WEIGHTS[key]
    x = torch.randn(m, k, device="cuda").half()
    y = torch.empty(m, n, device="cuda").half()
    lx, ly = lowbit.from_dlpack(x), lowbit.from_dlpack(y)
    return [lambda w=w: _core.linear(lx, w, None, ly, kernel=kernel) for w in ws]


def bench_f16_only(name, n, k, m, l2):
    """--f16-only: lowbit's f16 GEMM (default dispatch as lowbit_f16_us, each kernel forced as
    lowbit_f16_<kernel>_us; the GEMV forced only up to 64 tokens, it runs 16-row slices) vs cuBLAS fp16."""
    row, _ = cublas_baseline(name, n, k, m, l2)
    row["f16_bytes"] = n * k * 2
    copies = copies_for(n * k * 2, l2)
    row["lowbit_f16_us"] = profiled_kernel_us(f16_setup(n, k, copies, m), F16_REPS)
    for kernel in F16_KERNELS:
        if (kernel == "gemv" and m > 64) or (kernel == "wmma" and n * k > 1e9 / 2):
            continue  # the GEMV runs 16-row slices; wmma on the lm_head is minutes of nothing
        try:
            row[f"lowbit_f16_{kernel}_us"] = profiled_kernel_us(
                f16_setup(n, k, copies, m, kernel=f16_kernel_name(kernel)), F16_REPS)
        except Exception as e:  # noqa: BLE001 - record why
            row[f"lowbit_f16_{kernel}_error"] = str(e).splitlines()[0][:160]
    row["f16_speedup_vs_cublas"] = row["cublas_fp16_us"] / row["lowbit_f16_us"]
    return row


def split_sweep(l2):
    """W4A16 time per split-K choice for decode shapes: the data behind pick_split."""
    rows = []
    for name in ["gate_up", "down", "o"]:
        n, k = SHAPES[name]
        for m in [1, 16]:
            times = {}
            for split in [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]:
                if split > k // 64:
                    continue
                fns, used = ours_setup(n, k, copies_for(n * k // 2, l2), m, split)
                times[used] = graph_time_us(fns)
                del fns
            picked = _core.gemm_w4a16_pick_split(m, n, k)
            best = min(times, key=times.get)
            rows.append({"shape": name, "m": m, "times_us": times, "picked": picked, "best": best})
            print(f"sweep {name:8s} m={m:3d} picked {picked:3d} best {best:3d} ({times[best]:.1f} us)  " +
                  " ".join(f"{s}:{t:.1f}" for s, t in sorted(times.items())), flush=True)
    return rows


def main():
    ms_flag = [a for a in sys.argv[1:] if a.startswith("--ms=")]  # e.g. --ms=256,1024: only these M
    ms = [int(v) for v in ms_flag[0][5:].split(",")] if ms_flag else MS
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = args[0] if args else "bench_gemm.json"
    meta = device_meta()
    meta["copy_bandwidth_gbs"] = copy_bandwidth_gbs()
    sweep = split_sweep(meta["l2_bytes"]) if "--sweep" in sys.argv else []
    rows = []
    shapes = SHAPES_70B if "--llama70b" in sys.argv else SHAPES
    if "--f16-only" in sys.argv and "--llama70b" not in sys.argv:
        shapes = {**SHAPES, **LM_HEAD_8B}
    meta["shapes"] = "Llama-3-70B" if "--llama70b" in sys.argv else "Llama-3-8B"
    only = [a[9:].split(",") for a in sys.argv[1:] if a.startswith("--shapes=")]  # e.g. --shapes=gate_up
    for name, (n, k) in shapes.items():
        if only and name not in only[0]:
            continue
        for m in ms:
            if "--f16-only" in sys.argv:
                r = bench_f16_only(name, n, k, m, meta["l2_bytes"])
                r["f16_bytes_floor_us"] = r["f16_bytes"] / (meta["copy_bandwidth_gbs"] * 1e3)
                rows.append(r)
                forced = "  ".join(f"{kern} {r[f'lowbit_f16_{kern}_us']:8.1f}" for kern in F16_KERNELS
                                   if f"lowbit_f16_{kern}_us" in r)
                print(f"{name:8s} m={m:5d} cublas {r['cublas_fp16_us']:8.1f} us  f16 {r['lowbit_f16_us']:8.1f} us "
                      f"({r['f16_bytes'] / (r['lowbit_f16_us'] * 1e3):6.0f} GB/s, floor {r['f16_bytes_floor_us']:7.1f})"
                      f"  x{r['f16_speedup_vs_cublas']:.2f}  {forced}", flush=True)
                continue
            if "--fp8-only" in sys.argv:
                r = bench_fp8_only(name, n, k, m, meta["l2_bytes"])
                rows.append(r)
                print(f"{name:8s} m={m:5d} cublas {r['cublas_fp16_us']:8.1f}  fp8 {r.get('lowbit_fp8_us', float('nan')):7.1f} "
                      f"(sm80 {r.get('lowbit_fp8_sm80_us', float('nan')):7.1f}, sm90 "
                      f"{r.get('lowbit_fp8_sm90_us', float('nan')):7.1f}, fast-accum "
                      f"{r.get('lowbit_fp8_sm90_fast_accum_us', float('nan')):7.1f}, "
                      f"+quant {r.get('lowbit_fp8_with_quant_us', float('nan')):7.1f}, "
                      f"x{r.get('fp8_speedup_vs_cublas', float('nan')):.2f})  _scaled_mm "
                      f"{r.get('torch_scaled_mm_fp8_us', float('nan')):7.1f}  {r.get('lowbit_fp8_error', '')}", flush=True)
                continue
            if "--w4a8-only" in sys.argv:
                r = bench_w4a8_only(name, n, k, m, meta["l2_bytes"])
                r["w4_bytes_floor_us"] = (n * k // 2) / (meta["copy_bandwidth_gbs"] * 1e3)
                rows.append(r)
                print(f"{name:8s} m={m:5d} cublas {r['cublas_fp16_us']:8.1f}  w4a8 qoq {r['lowbit_w4a8_qoq_us']:7.1f} "
                      f"liquid {r['lowbit_w4a8_liquid_us']:7.1f} (+quant {r['lowbit_w4a8_liquid_with_quant_us']:7.1f}, "
                      f"x{r['w4a8_speedup_vs_cublas']:.2f}, floor {r['w4_bytes_floor_us']:6.1f}; sm80 "
                      f"{r['lowbit_w4a8_liquid_sm80_us']:7.1f} sm90 {r.get('lowbit_w4a8_liquid_sm90_us', float('nan')):7.1f})  "
                      f"w4a16 {r['lowbit_w4a16_us']:7.1f}  w8a8 {r['lowbit_w8a8_us']:7.1f}  "
                      f"fp8 {r.get('torch_scaled_mm_fp8_us', float('nan')):7.1f}", flush=True)
                continue
            if "--w8a8-only" in sys.argv:
                r = bench_w8a8_only(name, n, k, m, meta["l2_bytes"])
                rows.append(r)
                print(f"{name:8s} m={m:5d} cublas {r['cublas_fp16_us']:8.1f}  w8a8 {r['lowbit_w8a8_us']:7.1f} "
                      f"(sm80 {r.get('lowbit_w8a8_sm80_us', float('nan')):7.1f}, sm90 "
                      f"{r.get('lowbit_w8a8_sm90_us', float('nan')):7.1f}, +quant {r['lowbit_w8a8_with_quant_us']:7.1f}, "
                      f"x{r['w8a8_speedup_vs_cublas']:.2f})  int_mm {r.get('torch_int_mm_us', float('nan')):7.1f}  "
                      f"fp8 {r.get('torch_scaled_mm_fp8_us', float('nan')):7.1f}", flush=True)
                continue
            if "--w4a16-only" in sys.argv:
                r = bench_w4a16_only(name, n, k, m, meta["l2_bytes"])
                r["w4_bytes_floor_us"] = r["int4_bytes"] / (meta["copy_bandwidth_gbs"] * 1e3)
                rows.append(r)
                print(f"{name:8s} m={m:5d} cublas {r['cublas_fp16_us']:8.1f} us  w4a16 {r['lowbit_w4a16_us']:8.1f} us "
                      f"(split {r['lowbit_split_k']}, {r['int4_bytes'] / (r['lowbit_w4a16_us'] * 1e3):6.0f} GB/s)  "
                      f"tinygemm {r.get('tinygemm_int4_us', float('nan')):8.1f}  "
                      f"gemlite {r.get('gemlite_w4a16_us', float('nan')):8.1f}  x{r['speedup_vs_cublas']:.2f}  "
                      f"g32+mins {r['lowbit_w4a16_g32_mins_us']:8.1f}  w8a16 {r['lowbit_w8a16_g0_us']:8.1f} "
                      f"(g32 {r['lowbit_w8a16_g32_us']:8.1f})  {w4a16_forced_str(r)}", flush=True)
                continue
            r = bench_shape(name, n, k, m, meta["l2_bytes"])
            r["w4_bytes_floor_us"] = r["int4_bytes"] / (meta["copy_bandwidth_gbs"] * 1e3)
            r["w4_effective_gbs"] = r["int4_bytes"] / (r["lowbit_w4a16_us"] * 1e3)
            rows.append(r)
            print(f"{name:8s} m={m:5d} cublas {r['cublas_fp16_us']:8.1f} us  w4a16 {r['lowbit_w4a16_us']:8.1f} us "
                  f"(split {r['lowbit_split_k']}, {r['w4_effective_gbs']:6.0f} GB/s)  tinygemm "
                  f"{r.get('tinygemm_int4_us', float('nan')):8.1f}  int_mm {r.get('torch_int_mm_us', float('nan')):7.1f}"
                  f"  fp8 {r.get('torch_scaled_mm_fp8_us', float('nan')):7.1f}  x{r['speedup_vs_cublas']:.2f}  "
                  f"w8a8 {r['lowbit_w8a8_us']:7.1f} (+quant {r['lowbit_w8a8_with_quant_us']:7.1f}, "
                  f"x{r['w8a8_speedup_vs_cublas']:.2f})  {w4a16_forced_str(r)}",
                  flush=True)
    write_json(out, {"meta": meta, "gemm": rows, "split_sweep": sweep})


if __name__ == "__main__":
    main()
