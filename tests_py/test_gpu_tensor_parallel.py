"""Tensor parallelism on GPUs against one unsharded GPU rank (f16 compute, so f16 tolerances).

One GPU: the ranks share cuda:0 over the thread communicator (tensor_parallel_backend="threads"): every rank's
shard shapes through the GPU kernels, the partial sums and the vocabulary gather, for every weight family.
Two or more GPUs: NCCL ranks on cuda:0..N-1, eager and with CUDA graphs (the all-reduces and the gather captured in
the decode graphs), logits and greedy tokens against one GPU. Run by tools/gpu_run.sh on the installed package."""
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
