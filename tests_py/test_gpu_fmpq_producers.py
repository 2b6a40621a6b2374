"""The fused producers of COMET FMPQ activations on the GPU: the RMSNorm (+ residual add) and SiLU·mul that write the
next linear's FMPQ codes and block scales themselves (rms_norm_quantize_fmpq, silu_mul_quantize_fmpq) must give the
bytes of the unfused path (rms_norm / add_rms_norm / silu_mul into f16 rows, then quantize_fmpq through the input
permutation) bit for bit, and the residual update of add_rms_norm; the unfused f16 rows are checked against float64
and the codes against an independent torch rounding. Odd token counts (1, 7, 65, 300), hidden sizes with block tails,
block maps of 0% / 10% / 100% int8, with and without a permutation, poisoned outputs. Then the engine: a w4a4 model
with the fused producers gives the unfused path's logits and greedy tokens exactly, in eager and CUDA-graph steps."""
import pytest
import torch

import lowbit
from lowbit import _core
from test_gpu_fmpq import BLOCK, block_map, fmpq_llama, nblocks, torch_fmpq

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]
EPS = 1e-5
FRACS = (0.0, 0.1, 1.0)


def rows(m, k, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * scale
    x[:, 3::41] *= 12  # outlier channels: their blocks' scales differ from the rest
    return x.half()


def unfused_quantize(y, bits, perm):
    """quantize_fmpq on the GPU (through perm) of f16 rows y: (q, scales) on the host."""
    m, k = y.shape
    q = torch.empty(m, k, dtype=torch.int8, device="cuda")
    s = torch.empty(m, nblocks(k), dtype=torch.float32, device="cuda")
    _core.quantize_fmpq_gpu(y, torch.tensor(bits, dtype=torch.uint8), q, s, perm=perm)
    torch.cuda.synchronize()
    return q.cpu(), s.cpu()


def poisoned(m, k):
    return (torch.full((m, k), -99, dtype=torch.int8, device="cuda"),
            torch.full((m, nblocks(k)), float("nan"), dtype=torch.float32, device="cuda"))


def perms(k, seed):
    """None, and a random permutation of k channels (s32 on the GPU)."""
    return [None, torch.randperm(k, generator=torch.Generator().manual_seed(seed)).to(torch.int32).cuda()]


# (tokens, hidden): odd token counts; 4104 (a 8-channel block tail, the 16-byte row layout past 4096 columns), 960
# (SmolLM2-360M, half a block), 576 (SmolLM2-135M), 4096 (Llama-3-8B), 1000 (one channel at a time: not a multiple of
# 8), 8192 (the register rows' limit), 8320 (past it: the op runs the two kernels it replaces).
NORM_CASES = [(1, 4104), (7, 960), (65, 576), (300, 4104), (7, 4096), (65, 1000), (1, 8192), (7, 8320), (300, 960)]


@pytest.mark.parametrize("m,h", NORM_CASES)
def test_norm_quantize_fmpq_is_the_unfused_bytes(m, h):
    residual = rows(m, h, seed=m * 3 + h)
    added = rows(m, h, seed=m + 7 * h, scale=0.5)
    g = torch.Generator().manual_seed(h)
    for wdtype in (torch.float16, torch.float32):
        weight = (0.5 + torch.rand(h, generator=g)).to(wdtype).cuda()
        for add in (False, True):
            x = added.cuda() if add else None
            # float64: residual (+ added, rounded to f16 as the residual holds it), then the norm
            r64 = (residual.float() + added.float()).half().double() if add else residual.double()
            ref = r64 / torch.sqrt((r64 * r64).mean(dim=1, keepdim=True) + EPS) * weight.cpu().double()
            r_unfused = residual.cuda()
            normed = torch.empty(m, h, dtype=torch.float16, device="cuda")
            if add:
                _core.add_rms_norm(r_unfused, x, weight, EPS, normed)
            else:
                _core.rms_norm(r_unfused, weight, EPS, normed)
            torch.cuda.synchronize()
            err = ((normed.cpu().double() - ref).abs().max() / ref.abs().max()).item()
            assert err < 2e-3, f"unfused norm vs float64: {err:.2e}"
            for frac in FRACS:
                bits = block_map(h, frac, seed=h + m + int(frac * 10))
                bb = torch.tensor(bits, dtype=torch.uint8)
                for perm in perms(h, seed=m + h):
                    q_ref, s_ref = unfused_quantize(normed, bits, perm)
                    gathered = normed.cpu() if perm is None else normed.cpu()[:, perm.long().cpu()]
                    q_t, s_t = torch_fmpq(gathered, bits)  # activation.h's rounding in torch
                    assert torch.equal(q_ref, q_t) and torch.equal(s_ref, s_t)
                    r_fused = residual.cuda()
                    q, s = poisoned(m, h)
                    _core.rms_norm_quantize_fmpq(r_fused, x, weight, EPS, bb, perm, q, s)
                    torch.cuda.synchronize()
                    what = f"{wdtype} add={add} frac={frac} perm={perm is not None}"
                    assert torch.equal(q.cpu(), q_ref), f"{what}: {(q.cpu() != q_ref).sum().item()} codes differ"
                    assert torch.equal(s.cpu(), s_ref), f"{what}: {(s.cpu() != s_ref).sum().item()} scales differ"
                    assert torch.equal(r_fused, r_unfused), f"{what}: the residual update differs"


# (tokens, I): 14336 (Llama-3-8B), 1536 (SmolLM2-135M), 2560 (SmolLM2-360M), 4104 and 200 (block tails), 1000 (a tail
# of 104 channels), 1004 (not a multiple of 8: element loads).
SILU_CASES = [(1, 14336), (7, 1536), (65, 4104), (300, 2560), (7, 200), (65, 1004), (300, 14336), (1, 1000)]


@pytest.mark.parametrize("m,inter", SILU_CASES)
def test_silu_mul_quantize_fmpq_is_the_unfused_bytes(m, inter):
    gate_up = rows(m, 2 * inter, seed=m + inter, scale=2.0).cuda()
    act = torch.empty(m, inter, dtype=torch.float16, device="cuda")
    _core.silu_mul(gate_up, act)
    torch.cuda.synchronize()
    gu = gate_up.cpu().double()
    ref = gu[:, :inter] / (1 + torch.exp(-gu[:, :inter])) * gu[:, inter:]
    err = ((act.cpu().double() - ref).abs().max() / ref.abs().max()).item()
    assert err < 2e-3, f"unfused silu_mul vs float64: {err:.2e}"
    wide = torch.zeros(m, 2 * inter + 8, dtype=torch.float16, device="cuda")
    wide[:, 4:4 + 2 * inter] = gate_up
    for frac in FRACS:
        bits = block_map(inter, frac, seed=inter + int(frac * 10))
        bb = torch.tensor(bits, dtype=torch.uint8)
        for perm in perms(inter, seed=m * inter):
            q_ref, s_ref = unfused_quantize(act, bits, perm)
            gathered = act.cpu() if perm is None else act.cpu()[:, perm.long().cpu()]
            q_t, s_t = torch_fmpq(gathered, bits)
            assert torch.equal(q_ref, q_t) and torch.equal(s_ref, s_t)
            # contiguous rows, and rows 8 bytes off 16-byte alignment (element loads)
            for src in (gate_up, wide[:, 4:4 + 2 * inter]):
                q, s = poisoned(m, inter)
                _core.silu_mul_quantize_fmpq(src, bb, perm, q, s)
                torch.cuda.synchronize()
                what = f"frac={frac} perm={perm is not None} strided={src is not gate_up}"
                assert torch.equal(q.cpu(), q_ref), f"{what}: {(q.cpu() != q_ref).sum().item()} codes differ"
                assert torch.equal(s.cpu(), s_ref), f"{what}: {(s.cpu() != s_ref).sum().item()} scales differ"


def test_fused_fmpq_producers_allocate_and_take_f32_rows():
    """Without q / scales the ops allocate them; f32 rows run the two kernels the fused ones replace."""
    m, h, inter = 5, 384, 256
    bits = [8, 4, 4]
    residual = rows(m, h, seed=1).float().cuda()
    weight = torch.rand(h, generator=torch.Generator().manual_seed(2)).cuda() + 0.5
    normed = torch.empty(m, h, dtype=torch.float32, device="cuda")
    _core.rms_norm(residual, weight, EPS, normed)
    q, s = _core.rms_norm_quantize_fmpq(residual, None, weight, EPS, torch.tensor(bits, dtype=torch.uint8))
    q_ref, s_ref = unfused_quantize(normed, bits, None)
    assert torch.equal(torch.from_dlpack(q).cpu(), q_ref) and torch.equal(torch.from_dlpack(s).cpu(), s_ref)
    gate_up = rows(m, 2 * inter, seed=3).float().cuda()
    act = torch.empty(m, inter, dtype=torch.float32, device="cuda")
    _core.silu_mul(gate_up, act)
    q, s = _core.silu_mul_quantize_fmpq(gate_up, torch.tensor([4, 8], dtype=torch.uint8))
    q_ref, s_ref = unfused_quantize(act, [4, 8], None)
    assert torch.equal(torch.from_dlpack(q).cpu(), q_ref) and torch.equal(torch.from_dlpack(s).cpu(), s_ref)


def test_fused_fmpq_producers_name_bad_arguments():
    h = 256
    residual = rows(2, h, seed=1).cuda()
    weight = torch.ones(h, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match=r"block_bits.*\[2\]"):
        _core.rms_norm_quantize_fmpq(residual, None, weight, EPS, torch.tensor([4], dtype=torch.uint8))
    with pytest.raises(ValueError, match="4 or 8"):
        _core.rms_norm_quantize_fmpq(residual, None, weight, EPS, torch.tensor([4, 5], dtype=torch.uint8))
    with pytest.raises(ValueError, match="perm"):
        _core.silu_mul_quantize_fmpq(residual, torch.tensor([4], dtype=torch.uint8),
                                     torch.arange(64, dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="scales"):
        _core.silu_mul_quantize_fmpq(residual, torch.tensor([4], dtype=torch.uint8), None,
                                     torch.empty(2, 128, dtype=torch.int8, device="cuda"),
                                     torch.empty(2, 2, device="cuda"))


# ---- the engine --------------------------------------------------------------------------------------------------
def engine_runs(model, ids, prompts):
    """Chunked-prefill logits, and greedy decoding (eager steps, then CUDA-graph steps) of `prompts`."""
    from test_gpu_engine import run_events
    logits = torch.from_dlpack(_core.Engine(model, max_batch_tokens=64).logits(ids)).clone()
    eager = run_events(_core.Engine(model, max_batch_tokens=256, cuda_graphs=False), prompts, 12, dict(temperature=0.0))
    graphs = run_events(_core.Engine(model, max_batch_tokens=256, cuda_graphs=True), prompts, 12, dict(temperature=0.0))
    return logits, eager, graphs


# (recipe, (hidden, intermediate, heads, kv heads, head_dim), int8 fraction, down_proj permuted): the default small
# Llama, and SmolLM2-135M's widths (576: half a block at the end of the norms' rows; 704: half a block at the end of
# the down linear's input). Quantized directories permute no down_proj (the plan fuses SiLU·mul only then); one case
# keeps a down permutation (the plan runs SiLU·mul and quantize_fmpq apart there).
SMALL, SMOL = (256, 320, 8, 2, 128), (576, 704, 9, 3, 64)
ENGINE_CASES = [("w4a4kv4", SMALL, 0.1, False), ("w4a4kv4", SMOL, 0.1, False), ("w4a4kv4", SMOL, 1.0, True),
                ("w4a4kv8", SMALL, 1.0, False)]


@pytest.mark.parametrize("recipe,shape,frac,permute_down", ENGINE_CASES)
def test_w4a4_fused_producers_give_the_unfused_logits(recipe, shape, frac, permute_down):
    """The w4a4 forward pass with the fused producers (the default) against fused_norm_quant / fused_silu_quant off
    (on SmolLM2's widths each alone too): the same codes reach the same GEMMs, so logits, greedy tokens and logprobs
    are equal exactly, eager and in CUDA graphs."""
    hidden, inter, heads, kv_heads, head_dim = shape
    ids = torch.randint(0, 1000, (150,), generator=torch.Generator().manual_seed(int(frac * 10))).tolist()
    prompts = [ids[:40], ids[:9], ids[:1], ids]
    variants = [("fused", None), ("unfused", {"fused_norm_quant": "off", "fused_silu_quant": "off"})]
    if shape == SMOL:
        variants += [("norm only", {"fused_silu_quant": "off"}), ("silu only", {"fused_norm_quant": "off"})]
    runs = {}
    for name, ov in variants:
        model = fmpq_llama(recipe, "cuda", "f16", frac, seed=4, hidden=hidden, inter=inter, heads=heads,
                           kv_heads=kv_heads, head_dim=head_dim, kernel_overrides=ov, permute_down=permute_down)
        runs[name] = engine_runs(model, ids, prompts)
    logits, eager, graphs = runs["fused"]
    assert torch.isfinite(logits).all()
    assert all(len(t) == 12 for t in graphs)
    for name, (lg, ev, gr) in runs.items():
        assert torch.equal(lg, logits), f"{name}: {(lg != logits).sum().item()} logits differ"
        assert ev == eager, f"{name}: eager greedy decoding differs"
        assert gr == graphs, f"{name}: CUDA-graph greedy decoding differs"
