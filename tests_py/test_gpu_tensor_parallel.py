"""Tensor parallelism on GPUs against one unsharded GPU rank (f16 compute, so f16 tolerances).

One GPU: the ranks share cuda:0 over the thread communicator (tensor_parallel_backend="threads"): every rank's
shard shapes through the GPU kernels, the partial sums and the vocabulary gather, for every weight family.
Two or more GPUs: NCCL ranks on cuda:0..N-1, eager and with CUDA graphs (the all-reduces and the gather captured in
the decode graphs), logits and greedy tokens against one GPU, with the default group where the GPUs have peer access
(the all-reduce after o / down pushed to the peers and fused into the RMSNorm after it, other small all-reduces
one-shot over peer memory), the same without the fusion (LOWBIT_TP_FUSED_NORM=0) and NCCL alone;
the one-shot all-reduce by itself against a float64 sum, back to back with skewed ranks and inside replayed CUDA graphs;
the fused all-reduce + residual add + RMSNorm (and its int8 / e4m3 codes) against float64, back to back with skewed
ranks and in replayed graphs too.
Run by tools/gpu_run.sh on the installed package."""
import random
import threading

import numpy as np
import pytest
import torch

import lowbit
from lowbit import _core
from tiny_random_model import write_config

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]

# 8 heads of 64 over 2 KV heads; every shard a multiple of 128 channels (the GPU GEMMs' k step), vocab 2000 = 2 x 1000.
SHAPE = dict(vocab_size=2000, hidden_size=512, intermediate_size=1024, num_attention_heads=8, num_key_value_heads=2,
             head_dim=64, num_hidden_layers=2)
PROMPT = [5, 17, 3, 88, 42, 9, 61, 700, 1999, 0, 12, 400, 401, 402]
KV = 32 << 20
# f16 logits, partial sums in another order: a few f16 ulps of the largest logit; a8 recipes quantize the
# row-parallel linears' inputs per rank (test_tensor_parallel.py), so they move by their activation rounding.
RECIPES = {"w16a16": 1e-2, "w4a16": 1e-2, "w8a8kv8": 4e-2, "w4a8kv4": 6e-2, "w16a16kc4v4": 2e-2}
NCCL = _core.nccl_available()[0] and torch.cuda.device_count() >= 2
PEER = NCCL and torch.cuda.can_device_access_peer(0, 1) and torch.cuda.can_device_access_peer(1, 0)
needs_peer = pytest.mark.skipif(not PEER, reason="needs 2 GPUs with peer access and a build with NCCL")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("tp_gpu"), **SHAPE)


def _llm(model_dir, recipe, tp=1, **kw):
    return lowbit.LLM(model_dir, recipe=recipe, load_format="random", device="cuda", progress=False,
                      kv_cache_memory=KV, tensor_parallel=tp, **kw)


def _run(llm, tokens=16):
    return np.asarray(llm.logits(PROMPT), dtype=np.float64), llm.generate(PROMPT, max_tokens=tokens)[0].token_ids


@pytest.fixture(scope="module")
def single(model_dir):
    out = {}
    for recipe in RECIPES:
        with _llm(model_dir, recipe) as llm:
            out[recipe] = _run(llm)
    return out


def _rel(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


# ---- the one-shot all-reduce by itself ------------------------------------------------------------------------------
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
# one rounding of an f32 sum of 2 values: within an ulp of the float64 sum (f32 sums of 2 f16/bf16 values are exact)
ULP = {torch.float32: 2.0 ** -23, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


def _group(max_bytes=-1):
    return _core.make_nccl_communicators([0, 1], oneshot_max_bytes=max_bytes)


def _stream(rank):
    return torch.cuda.current_stream(rank).cuda_stream


def _on_each_rank(work, on_error=lambda: None):
    """work(r) on one thread per rank with cuda:r current (NCCL ranks of one process must be driven concurrently);
    re-raises the first error after both threads end; on_error runs in the failing thread (to release the other)."""
    errors = []

    def go(r):
        try:
            with torch.cuda.device(r):
                work(r)
        except Exception as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
            on_error()
    threads = [threading.Thread(target=go, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _both(comms, tensors):
    """One all-reduce on each rank from its own thread."""
    _on_each_rank(lambda r: comms[r].all_reduce_sum(tensors[r], stream=_stream(r)))


def _draw(n, dtype, seed, offset=0):
    """Random values on each rank (never zeros), as views `offset` elements into their buffers (offset 1: not
    16-byte aligned), and their float64 sum on the host."""
    g = torch.Generator().manual_seed(seed)
    host = [torch.randn(n + offset, generator=g, dtype=torch.float64) * (r + 1) for r in range(2)]
    views = [h.to(dtype).to(f"cuda:{r}")[offset:] for r, h in enumerate(host)]
    want = sum(v.double().cpu() for v in views)
    return views, want


def _check(got, want, dtype, what):
    for r, g in enumerate(got):
        g = g.cpu()
        assert torch.isfinite(g.double()).all(), what
        # one rounding: an ulp of the sum, or of the smallest normal where the sum is subnormal (f16 cancellations)
        bound = ULP[dtype] * (want.abs() + torch.finfo(dtype).smallest_normal)
        bad = (g.double() - want).abs() > bound
        assert not bad.any(), f"{what}: rank {r}, {int(bad.sum())} elements off, e.g. index {int(bad.nonzero()[0])}"
    assert torch.equal(got[0].cpu(), got[1].cpu()), f"{what}: ranks differ"  # bit-identical on every rank


@needs_peer
def test_oneshot_is_the_default_and_can_be_turned_off(monkeypatch):
    comms = _group()
    assert comms[0].all_reduce.startswith("one-shot") and comms[0].capturable
    assert [c.all_reduce for c in _group(0)] == ["nccl", "nccl"]
    monkeypatch.setenv("LOWBIT_TP_ONESHOT", "0")
    assert _group()[0].all_reduce == "nccl"
    monkeypatch.setenv("LOWBIT_TP_ONESHOT", "1")
    monkeypatch.setenv("LOWBIT_TP_ONESHOT_MAX_BYTES", "65536")
    assert "<= 64 KiB" in _group()[0].all_reduce


@needs_peer
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_oneshot_all_reduce_matches_float64(dtype):
    dt = DTYPES[dtype]
    comms = _group()
    big = _core.ONESHOT_DEFAULT_BYTES // torch.tensor([], dtype=dt).element_size()
    # odd sizes, one 16-byte pack, one block's worth and many blocks, the largest message, misaligned views
    cases = [(1, 0), (7, 0), (8, 0), (1000, 0), (16384 + 3, 0), (2048 * 64 + 5, 0), (big, 0), (big - 3, 1), (999, 1)]
    for seed, (n, offset) in enumerate(cases):
        for rep in range(5):  # again and again on the same group: the step counters and both staging halves
            views, want = _draw(n, dt, 1000 * seed + rep, offset)
            _both(comms, views)
            _check(views, want, dt, f"{dtype} n={n} offset={offset} rep={rep}")


@needs_peer
def test_oneshot_back_to_back_with_skewed_ranks():
    """Many all-reduces of changing sizes queued without a GPU sync while one rank or the other is held back by a
    GPU sleep: a fast rank must never overwrite staging a slow one still reads, nor read a stale step. Each rank is
    driven by its own thread, as the engine does (a rank's kernel waits on the GPU for its peers: one thread queueing
    hundreds of one rank's collectives before the other's can block in the launch queue); the threads meet on the host
    every 20 steps only to bound that queue."""
    comms = _group()
    rng = random.Random(7)
    sizes = [8192, 1, 16387, 8192 * 8 + 1, 3, 8192]
    plan = [(sizes[i % len(sizes)], rng.random() < 0.3, rng.randrange(2)) for i in range(200)]
    wants, results = [], []
    for i, (n, skew, slow) in enumerate(plan):
        views, want = _draw(n, torch.float16, i)
        wants.append(want)
        results.append(views)
    barrier = threading.Barrier(2)

    def rank(r):
        for i, ((n, skew, slow), views) in enumerate(zip(plan, results)):
            if i % 20 == 0:
                barrier.wait()
            if skew and slow == r:
                torch.cuda._sleep(200_000)  # ~0.1 ms
            comms[r].all_reduce_sum(views[r], stream=_stream(r))
    _on_each_rank(rank, on_error=barrier.abort)
    for i, (want, views) in enumerate(zip(wants, results)):
        _check(views, want, torch.float16, f"step {i} n={plan[i][0]}")


@needs_peer
@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_oneshot_in_cuda_graphs_replayed_with_fresh_inputs(dtype):
    """Each rank captures x -> all-reduce(a), all-reduce(b), all-reduce(a) again; 60 replays, fresh inputs before each:
    the step counters live on the device, so every replay must advance them."""
    dt = DTYPES[dtype]
    comms = _group()
    sizes = (8192, 1003)
    static = [[torch.empty(n, dtype=dt, device=f"cuda:{r}") for n in sizes] for r in range(2)]
    work = [[torch.empty(n, dtype=dt, device=f"cuda:{r}") for n in sizes] for r in range(2)]
    out = [torch.empty(sizes[0], dtype=dt, device=f"cuda:{r}") for r in range(2)]
    graphs = []
    for r in range(2):
        with torch.cuda.device(r):
            g = torch.cuda.CUDAGraph()
            # a capture stream of rank r's own device (torch.cuda.graph's shared default one lives on the first GPU)
            with torch.cuda.graph(g, stream=torch.cuda.Stream(device=r)):
                for i in range(2):
                    work[r][i].copy_(static[r][i])
                    comms[r].all_reduce_sum(work[r][i], stream=_stream(r))
                out[r].copy_(work[r][0])
                comms[r].all_reduce_sum(out[r], stream=_stream(r))  # the sum summed again: 2 x the sum, exactly
            graphs.append(g)
    for rep in range(60):
        wants = []
        for i, n in enumerate(sizes):
            views, want = _draw(n, dt, 50_000 + 10 * rep + i)
            for r in range(2):
                static[r][i].copy_(views[r])
            wants.append(want)
        for r in range(2):
            with torch.cuda.device(r):
                graphs[r].replay()
        got_a = [w[0].clone() for w in work]
        _check(got_a, wants[0], dt, f"replay {rep}: a")
        _check([w[1].clone() for w in work], wants[1], dt, f"replay {rep}: b")
        for r in range(2):
            assert torch.equal(out[r].cpu(), (got_a[r] * 2).cpu()), f"replay {rep}: rank {r} second pass"


@needs_peer
def test_oneshot_bound_sends_larger_messages_to_nccl():
    comms = _group(4096)
    assert "<= 4 KiB" in comms[0].all_reduce
    for n in (2048, 2049, 100_000):  # 4096 bytes of f16 (one-shot), one element more and far more (NCCL)
        views, want = _draw(n, torch.float16, n)
        _both(comms, views)
        _check(views, want, torch.float16, f"n={n}")


@needs_peer
@pytest.mark.parametrize("recipe", ["w16a16", "w8a8kv8"])  # the norm writes f16 rows / int8 codes
@pytest.mark.parametrize("path", ["fused", "oneshot", "nccl"])
def test_two_gpus_greedy_fused_oneshot_and_nccl(model_dir, single, monkeypatch, recipe, path):
    monkeypatch.setenv("LOWBIT_TP_ONESHOT", "0" if path == "nccl" else "1")
    monkeypatch.setenv("LOWBIT_TP_FUSED_NORM", "1" if path == "fused" else "0")
    base, base_tokens = single[recipe]
    with _llm(model_dir, recipe, 2, cuda_graphs=True) as llm:
        name = llm.info()["tp_all_reduce"]
        assert name.startswith("nccl" if path == "nccl" else "one-shot") and ("fused" in name) == (path == "fused")
        got, tokens = _run(llm)
    assert _rel(got, base) < RECIPES[recipe], f"{_rel(got, base):.2e}"
    if recipe == "w16a16":
        assert tokens == base_tokens


# ---- the all-reduce fused with the residual add and the RMSNorm ---------------------------------------------------
EPS = 1e-5


def _norm_case(rows, cols, dt, seed, w_dtype):
    """Each rank's partial rows, the residual (the same on both ranks, as in the model), a norm weight, and the float64
    reference: the all-reduce rounded to dt, the residual add rounded to dt (so the new residual is exact), the norm."""
    g = torch.Generator().manual_seed(seed)
    parts = [(torch.randn(rows, cols, generator=g, dtype=torch.float64) * (r + 1)).to(dt) for r in range(2)]
    residual = (torch.randn(rows, cols, generator=g, dtype=torch.float64) * 3).to(dt)
    weight = (torch.rand(cols, generator=g, dtype=torch.float64) + 0.5).to(w_dtype)
    summed = (parts[0].double() + parts[1].double()).to(dt)
    new_res = (residual.double() + summed.double()).to(dt)
    x = new_res.double()
    normed = x / torch.sqrt((x * x).mean(dim=1, keepdim=True) + EPS) * weight.double()
    return parts, residual, weight, new_res, normed


def _fused(comms, parts, residual, weight, out=None, q=None, scales=None):
    took = [None, None]

    def go(r):
        took[r] = comms[r].all_reduce_add_rms_norm(parts[r], residual[r], weight[r], EPS, out=out and out[r],
                                                   q=q and q[r], scales=scales and scales[r], stream=_stream(r))
    _on_each_rank(go)
    return took


@needs_peer
@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
def test_fused_all_reduce_add_rms_norm_matches_float64(monkeypatch, dtype):
    monkeypatch.setenv("LOWBIT_TP_FUSED_NORM", "1")  # the default, said explicitly
    dt = DTYPES[dtype]
    comms = _group()
    assert "fused" in comms[0].all_reduce
    # odd widths (4104 = 513 packs of f16), one pack, many rows, up to the 512 KiB bound (32 x 8192 f16: the inbox)
    cases = [(1, 4104), (3, 4104), (1, 8192), (5, 512), (7, 1000), (1, 8), (32 if dt != torch.float32 else 16, 8192)]
    for seed, (rows, cols) in enumerate(cases):
        for w_dtype in (dt, torch.float32):
            for rep in range(3):  # again on the same group: step counters and both staging halves
                parts, residual, weight, want_res, want = _norm_case(rows, cols, dt, 100 * seed + rep, w_dtype)
                ps = [p.to(f"cuda:{r}") for r, p in enumerate(parts)]
                res = [residual.to(f"cuda:{r}") for r in range(2)]
                ws = [weight.to(f"cuda:{r}") for r in range(2)]
                out = [torch.full((rows, cols), float("nan"), dtype=dt, device=f"cuda:{r}") for r in range(2)]
                assert _fused(comms, ps, res, ws, out=out) == [True, True]
                what = f"{dtype} {rows}x{cols} weight {w_dtype} rep {rep}"
                for r in range(2):
                    assert torch.equal(res[r].cpu(), want_res), f"{what}: rank {r} residual"
                    got = out[r].cpu().double()
                    assert torch.isfinite(got).all(), what
                    bound = (ULP[dt] + 1e-5) * want.abs() + 1e-6 * want.abs().max()
                    bad = (got - want).abs() > bound
                    assert not bad.any(), f"{what}: rank {r}, {int(bad.sum())} off, e.g. {int(bad.nonzero()[0][1])}"
                assert torch.equal(out[0].cpu(), out[1].cpu()), f"{what}: ranks differ"
                assert torch.equal(ps[0].cpu(), parts[0]), f"{what}: the partial rows were written"


@needs_peer
@pytest.mark.parametrize("codes", ["s8", "e4m3"])
def test_fused_all_reduce_rms_norm_quantize_matches_float64(monkeypatch, codes):
    monkeypatch.setenv("LOWBIT_TP_FUSED_NORM", "1")
    comms = _group()
    code_dt = torch.int8 if codes == "s8" else torch.float8_e4m3fn
    qmax = 127.0 if codes == "s8" else 448.0
    for seed, (rows, cols) in enumerate([(1, 4104), (4, 8192), (9, 520)]):
        parts, residual, weight, want_res, want = _norm_case(rows, cols, torch.float16, 7 + seed, torch.float16)
        ps = [p.to(f"cuda:{r}") for r, p in enumerate(parts)]
        res = [residual.to(f"cuda:{r}") for r in range(2)]
        ws = [weight.to(f"cuda:{r}") for r in range(2)]
        q = [torch.full((rows, cols), 99, dtype=torch.int8, device=f"cuda:{r}").view(code_dt) for r in range(2)]
        scales = [torch.full((rows,), float("nan"), device=f"cuda:{r}") for r in range(2)]
        assert _fused(comms, ps, res, ws, q=q, scales=scales) == [True, True]
        normed16 = want.to(torch.float16).double()  # what the norm's f16 output would hold
        want_scale = normed16.abs().amax(dim=1) / qmax
        for r in range(2):
            assert torch.equal(res[r].cpu(), want_res), f"{codes} {rows}x{cols}: rank {r} residual"
            s = scales[r].cpu().double()
            assert torch.isfinite(s).all() and ((s - want_scale).abs() <= 2e-3 * want_scale).all(), (codes, rows, cols)
            deq = q[r].cpu().float().double() * s[:, None]
            # int8: half a step of rounding (+ an f16 ulp of the input); e4m3: 3 mantissa bits (2^-4 relative)
            tol = (0.5 + 1e-2) * s[:, None] + 2e-3 * normed16.abs() if codes == "s8" else \
                2 ** -4 * normed16.abs() + s[:, None] * 2 ** -9 + 2e-3 * normed16.abs()
            bad = (deq - normed16).abs() > tol
            assert not bad.any(), f"{codes} {rows}x{cols}: rank {r}, {int(bad.sum())} codes off"
        assert torch.equal(q[0].cpu().view(torch.int8), q[1].cpu().view(torch.int8)), "ranks differ"
        assert torch.equal(scales[0].cpu(), scales[1].cpu()), "ranks differ"


@needs_peer
def test_fused_norm_declines_what_it_does_not_take(monkeypatch):
    """Odd widths (not whole 16-byte packs), more rows than the kernel runs at once, messages above the bound: False,
    nothing written, on every rank alike (the model then all-reduces and normalizes in two steps). With
    LOWBIT_TP_FUSED_NORM=0: never; unset (the default) or 1: fused."""
    monkeypatch.setenv("LOWBIT_TP_FUSED_NORM", "1")
    comms = _group(65536)
    assert "fused" in comms[0].all_reduce
    # 4099 f16: not whole packs; 65 rows: more than the kernel's 64 blocks; 8 x 16 KB: above the 64 KiB bound
    for rows, cols in [(2, 4099), (65, 8), (8, 8192)]:
        parts, residual, weight, _, _ = _norm_case(rows, cols, torch.float16, rows, torch.float16)
        ps = [p.to(f"cuda:{r}") for r, p in enumerate(parts)]
        res = [residual.to(f"cuda:{r}") for r in range(2)]
        ws = [weight.to(f"cuda:{r}") for r in range(2)]
        out = [torch.zeros(rows, cols, dtype=torch.float16, device=f"cuda:{r}") for r in range(2)]
        assert _fused(comms, ps, res, ws, out=out) == [False, False], (rows, cols)
        assert torch.equal(res[0].cpu(), residual) and not out[0].any()
    monkeypatch.delenv("LOWBIT_TP_FUSED_NORM")
    assert "fused" in _group()[0].all_reduce
    monkeypatch.setenv("LOWBIT_TP_FUSED_NORM", "0")
    off = _group()
    assert "fused" not in off[0].all_reduce
    parts, residual, weight, _, _ = _norm_case(1, 8192, torch.float16, 3, torch.float16)
    ps = [p.to(f"cuda:{r}") for r, p in enumerate(parts)]
    res = [residual.to(f"cuda:{r}") for r in range(2)]
    ws = [weight.to(f"cuda:{r}") for r in range(2)]
    out = [torch.zeros(1, 8192, dtype=torch.float16, device=f"cuda:{r}") for r in range(2)]
    assert _fused(off, ps, res, ws, out=out) == [False, False]


@needs_peer
def test_fused_norm_back_to_back_with_skewed_ranks(monkeypatch):
    """Many fused calls of changing shapes (so each call lays its rows out differently in the inboxes) queued without a
    GPU sync while one rank or the other is held back by a GPU sleep: a fast rank's push must never land on lines a
    slow rank still reads, nor a stale line pass for the awaited step. Driven as the one-shot skew test above."""
    monkeypatch.setenv("LOWBIT_TP_FUSED_NORM", "1")
    comms = _group()
    rng = random.Random(11)
    shapes = [(1, 8192), (3, 4104), (1, 8), (16, 8192), (2, 520), (1, 16384)]
    plan = [(shapes[i % len(shapes)], rng.random() < 0.3, rng.randrange(2)) for i in range(120)]
    cases = []
    for i, ((rows, cols), _, _) in enumerate(plan):
        parts, residual, weight, want_res, want = _norm_case(rows, cols, torch.float16, 500 + i, torch.float16)
        ranks = [dict(p=parts[r].to(f"cuda:{r}"), res=residual.to(f"cuda:{r}"), w=weight.to(f"cuda:{r}"),
                      out=torch.full((rows, cols), float("nan"), dtype=torch.float16, device=f"cuda:{r}"))
                 for r in range(2)]
        cases.append((ranks, want_res, want))
    barrier = threading.Barrier(2)

    def rank(r):
        for i, ((_, skew, slow), (ranks, _, _)) in enumerate(zip(plan, cases)):
            if i % 20 == 0:
                barrier.wait()
            if skew and slow == r:
                torch.cuda._sleep(200_000)  # ~0.1 ms
            c = ranks[r]
            assert comms[r].all_reduce_add_rms_norm(c["p"], c["res"], c["w"], EPS, out=c["out"], stream=_stream(r))
    _on_each_rank(rank, on_error=barrier.abort)
    for i, (ranks, want_res, want) in enumerate(cases):
        for r in range(2):
            assert torch.equal(ranks[r]["res"].cpu(), want_res), f"call {i} {plan[i][0]}: rank {r} residual"
            got = ranks[r]["out"].cpu().double()
            bound = (ULP[torch.float16] + 1e-5) * want.abs() + 1e-6 * want.abs().max()
            assert not ((got - want).abs() > bound).any(), f"call {i} {plan[i][0]}: rank {r}"


@needs_peer
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_fused_norm_in_cuda_graphs_replayed_with_fresh_inputs(monkeypatch, dtype):
    """Each rank captures a plain all-reduce and two fused norms (two steps of the fused kernel's counter per replay,
    both inbox halves); 40 replays with fresh inputs copied in before each."""
    monkeypatch.setenv("LOWBIT_TP_FUSED_NORM", "1")
    dt = DTYPES[dtype]
    comms = _group()
    rows, cols, n = 3, 4104, 1003
    static_p = [torch.empty(rows, cols, dtype=dt, device=f"cuda:{r}") for r in range(2)]
    static_res = [torch.empty(rows, cols, dtype=dt, device=f"cuda:{r}") for r in range(2)]
    static_a = [torch.empty(n, dtype=dt, device=f"cuda:{r}") for r in range(2)]
    res = [torch.empty(rows, cols, dtype=dt, device=f"cuda:{r}") for r in range(2)]
    a = [torch.empty(n, dtype=dt, device=f"cuda:{r}") for r in range(2)]
    out = [torch.empty(rows, cols, dtype=dt, device=f"cuda:{r}") for r in range(2)]
    out2 = [torch.empty(rows, cols, dtype=dt, device=f"cuda:{r}") for r in range(2)]
    w64 = torch.rand(cols, generator=torch.Generator().manual_seed(5), dtype=torch.float64) + 0.5
    weight = [w64.float().to(f"cuda:{r}") for r in range(2)]  # f32 weight over dt rows
    w64 = w64.float().double()
    graphs = []
    for r in range(2):
        with torch.cuda.device(r):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=torch.cuda.Stream(device=r)):
                res[r].copy_(static_res[r])
                a[r].copy_(static_a[r])
                comms[r].all_reduce_sum(a[r], stream=_stream(r))
                assert comms[r].all_reduce_add_rms_norm(static_p[r], res[r], weight[r], EPS, out=out[r],
                                                        stream=_stream(r))
                # the same partial again onto the new residual: residual += 2 x the sum
                assert comms[r].all_reduce_add_rms_norm(static_p[r], res[r], weight[r], EPS, out=out2[r],
                                                        stream=_stream(r))
            graphs.append(g)
    for rep in range(40):
        g = torch.Generator().manual_seed(9000 + rep)
        parts = [(torch.randn(rows, cols, generator=g, dtype=torch.float64) * (r + 1)).to(dt) for r in range(2)]
        residual = (torch.randn(rows, cols, generator=g, dtype=torch.float64) * 3).to(dt)
        views, want_a = _draw(n, dt, 70_000 + rep)
        for r in range(2):
            static_p[r].copy_(parts[r])
            static_res[r].copy_(residual)
            static_a[r].copy_(views[r])
        for r in range(2):
            with torch.cuda.device(r):
                graphs[r].replay()
        _check([x.clone() for x in a], want_a, dt, f"replay {rep}: all-reduce")
        summed = (parts[0].double() + parts[1].double()).to(dt).double()
        res1 = (residual.double() + summed).to(dt)
        res2 = (res1.double() + summed).to(dt)
        for r in range(2):
            assert torch.equal(res[r].cpu(), res2), f"replay {rep}: rank {r} residual"
            for got, x in ((out[r], res1), (out2[r], res2)):
                x = x.double()
                want = x / torch.sqrt((x * x).mean(dim=1, keepdim=True) + EPS) * w64
                bad = (got.cpu().double() - want).abs() > (ULP[dt] + 1e-5) * want.abs() + 1e-6 * want.abs().max()
                assert not bad.any(), f"replay {rep}: rank {r}, {int(bad.sum())} off"
        assert torch.equal(out[0].cpu(), out[1].cpu()) and torch.equal(out2[0].cpu(), out2[1].cpu()), "ranks differ"


# ---- whole models ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_sharded_on_one_gpu_matches_one_rank(model_dir, single, recipe):
    base, base_tokens = single[recipe]
    with _llm(model_dir, recipe, 2, tensor_parallel_backend="threads") as llm:
        assert [m.tp_rank for m in llm.models] == [0, 1]
        got, tokens = _run(llm)
    assert np.isfinite(got).all()
    assert _rel(got, base) < RECIPES[recipe], f"{recipe}: {_rel(got, base):.2e}"
    if recipe in ("w16a16", "w4a16"):
        assert tokens == base_tokens


@pytest.mark.skipif(not NCCL, reason="needs 2 GPUs and a build with NCCL")
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_nccl_two_gpus_match_one(model_dir, single, recipe, graphs):
    base, base_tokens = single[recipe]
    with _llm(model_dir, recipe, 2, cuda_graphs=graphs) as llm:
        assert [m.info()["device"] for m in llm.models] == ["cuda:0", "cuda:1"]
        # the default group takes the one-shot all-reduce wherever the GPUs have peer access
        assert llm.info()["tp_all_reduce"].startswith("one-shot" if PEER else "nccl"), llm.info()["tp_all_reduce"]
        got, tokens = _run(llm)
        # a batch through the decode graphs (every bucket captured on both ranks) equals the requests one by one
        batch = llm.generate([PROMPT, PROMPT[:5], PROMPT[3:]], max_tokens=12)
    assert _rel(got, base) < RECIPES[recipe], f"{recipe}: {_rel(got, base):.2e}"
    if recipe in ("w16a16", "w4a16"):
        assert tokens == base_tokens
    with _llm(model_dir, recipe, 2, cuda_graphs=graphs) as again:
        for prompt, out in zip([PROMPT, PROMPT[:5], PROMPT[3:]], batch):
            assert again.generate(prompt, max_tokens=12)[0].token_ids == out.token_ids


@pytest.mark.skipif(not NCCL, reason="needs 2 GPUs and a build with NCCL")
def test_nccl_group_errors(model_dir):
    with pytest.raises(ValueError, match="listed twice"):
        _core.make_nccl_communicators([0, 0])
    with pytest.raises(ValueError, match="does not exist"):
        _core.make_nccl_communicators([0, torch.cuda.device_count()])


def test_nccl_unavailable_or_single_gpu_says_so(model_dir):
    ok, why = _core.nccl_available()
    if ok and torch.cuda.device_count() >= 2:
        pytest.skip("NCCL and 2 GPUs present: the group tests above run")
    with pytest.raises((NotImplementedError, ValueError)):
        _llm(model_dir, "w4a16", torch.cuda.device_count() + 1)


# ---- per-device launch state ----------------------------------------------------------------------------------------
TWO_SM90 = torch.cuda.device_count() >= 2 and all(torch.cuda.get_device_capability(d)[0] == 9 for d in range(2))


@pytest.mark.skipif(not TWO_SM90, reason="needs 2 sm_90 GPUs")
def test_sm90_multi_tile_launches_on_every_device():
    """The wgmma GEMMs' stream-K and persistent launches on each GPU of one process, device 1 first: what a launch
    needs on a device (its raised shared-memory limit, its occupancy) is prepared per device, so the first device to
    run a kernel does not stand in for the others (rank 1 of a TP=2 group hit cudaErrorInvalidValue that way at a
    128-token prefill, which the automatic plan sends to stream-K). Results against float64."""
    from test_gpu_w4a8 import s8_weights, two_level_weight
    from test_gpu_w4a16 import check, gemm_forced, w4_problem
    m, n, k = 128, 272, 576
    for device in (1, 0, 1):
        with torch.cuda.device(device):
            qw = two_level_weight("liquid", n, k, 64, seed=device + 1)
            pw = _core.pack_weight(qw, "sm80", f"cuda:{device}")
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(device)).half()
            xq = torch.empty(m, k, dtype=torch.int8, device="cuda")
            xs = torch.empty(m, device="cuda")
            _core.quantize_per_token_s8(x.cuda(), xq, xs)
            cs = torch.from_dlpack(qw.channel_scales).double()
            ref = (xq.cpu().double() @ s8_weights(qw).double().T) * xs.cpu().double()[:, None] * cs[None, :]
            for kernel in ("sm90k", "sm90p", ""):
                y = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
                _core.gemm_w4a8(xq, xs, pw, y, kernel=kernel)
                got = y.cpu().double()
                assert not torch.isnan(got).any(), (device, kernel)
                rel = float((got - ref).norm() / ref.norm())
                assert rel < 2e-3, (device, kernel, rel)
            xw, packed, ref16, _ = w4_problem(m, n, k, 64, seed=device + 7)
            for kernel in ("sm90k", ""):
                check(gemm_forced(kernel, xw, packed, n, k, 64), ref16)


@pytest.mark.skipif(not NCCL, reason="needs 2 GPUs and a build with NCCL")
@pytest.mark.parametrize("recipe", ["w4a8kv4", "w4a16"])
def test_nccl_two_gpus_prefill_of_128_tokens(model_dir, recipe):
    """A 128-token prompt: one full 128-token tile, where the automatic sm_90 plans take their stream-K kernel
    (the short PROMPT of the tests above never leaves the mma.sync kernels). TP=2 logits against one GPU."""
    prompt = [(7 * i + 3) % 2000 for i in range(128)]
    with _llm(model_dir, recipe) as llm:
        base = np.asarray(llm.logits(prompt), dtype=np.float64)
    with _llm(model_dir, recipe, 2) as llm:
        got = np.asarray(llm.logits(prompt), dtype=np.float64)
        assert len(llm.generate(prompt, max_tokens=4)[0].token_ids) == 4
    assert np.isfinite(got).all()
    assert _rel(got, base) < RECIPES[recipe], f"{recipe}: {_rel(got, base):.2e}"
