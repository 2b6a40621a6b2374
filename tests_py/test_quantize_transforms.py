"""Every equivalence transform leaves the float model's logits unchanged (< 1e-4 relative), on a tiny random
Llama with outlier channels, GQA, and an MLP width that is not a multiple of 64."""

import numpy as np
import pytest
import torch

from lowbit.quantize import transforms as T  # noqa: E402
from lowbit.quantize.fmpq import FMPQ  # noqa: E402
from lowbit.quantize.hadamard import hadamard, scaled_hadamard  # noqa: E402
from lowbit.quantize.pipeline import capture  # noqa: E402
from lowbit.quantize.recipes import parse_recipe  # noqa: E402
from lowbit.quantize.testing import random_tokens, tiny_llama  # noqa: E402
from lowbit.quantize.torch_model import TorchLlama, linear_name  # noqa: E402


def rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.fixture(params=[dict(), dict(hidden=48, heads=4, kv_heads=1, intermediate=100, outlier_channels=(5,))],
                ids=["h64-gqa2", "h48-mqa"])
def setup(request):
    lm = tiny_llama(seed=3, **request.param)
    tok = random_tokens(2, 40, seed=4)
    ref = TorchLlama(lm.config, lm.tensors).logits(tok)
    return lm, tok, ref


def test_torch_model_matches_transformers():
    transformers = pytest.importorskip("transformers")
    lm = tiny_llama(seed=5)
    c = lm.config
    hf_cfg = transformers.LlamaConfig(**{k: v for k, v in c.to_hf_config().items()
                                         if k not in ("architectures", "model_type")})
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    hf.load_state_dict({k: torch.from_numpy(v) for k, v in lm.tensors.items()}, strict=False)
    hf.tie_weights()
    tok = random_tokens(2, 33, seed=6)
    with torch.no_grad():
        want = hf(tok).logits.double()
    got = TorchLlama(c, lm.tensors).logits(tok).double()
    assert rel(got, want) < 1e-5


def test_fold_norms(setup):
    lm, tok, ref = setup
    m = TorchLlama(lm.config, lm.tensors)
    T.fold_norms(m)
    assert T.norms_are_folded(m) and "lm_head.weight" in m.weights
    assert rel(m.logits(tok), ref) < 1e-4


def test_rotation(setup):
    lm, tok, ref = setup
    m = TorchLlama(lm.config, lm.tensors)
    T.fold_norms(m)
    T.rotate_residual(m, torch.from_numpy(scaled_hadamard(lm.config.hidden_size)))
    assert rel(m.logits(tok), ref) < 1e-4
    # the rotation really changed the weights (a no-op transform would pass the check above)
    assert rel(m.weights["model.embed_tokens.weight"], torch.from_numpy(lm.tensors["model.embed_tokens.weight"])) > 0.5


def test_rotation_requires_folded_norms(setup):
    lm, _, _ = setup
    m = TorchLlama(lm.config, lm.tensors)
    with pytest.raises(ValueError, match="fold_norms must run first"):
        T.rotate_residual(m, torch.eye(lm.config.hidden_size, dtype=torch.float64))


def test_smooth_attention_and_smoothing(setup):
    lm, tok, ref = setup
    m = TorchLlama(lm.config, lm.tensors)
    c = lm.config
    h = m.embed(tok)
    for i in range(c.num_layers):
        cap = capture(m, i, h)
        lam = T.smooth_attention_scales(cap["keys"], 0.5)
        d = c.head_dim
        lam_h = lam.view(c.num_kv_heads, d)
        assert torch.equal(lam_h[:, : d // 2], lam_h[:, d // 2:])  # RoPE pairing respected
        T.smooth_attention(m, i, lam)
        g = torch.Generator().manual_seed(i)
        T.smooth_block_input(m, i, "attn", torch.rand(c.hidden_size, generator=g) + 0.5)
        T.smooth_block_input(m, i, "mlp", torch.rand(c.hidden_size, generator=g) + 0.5)
        T.smooth_v_o(m, i, torch.rand(c.num_kv_heads * d, generator=g) + 0.5)
        T.smooth_up_down(m, i, torch.rand(c.intermediate_size, generator=g) + 0.5)
        T.permute_intermediate(m, i, torch.randperm(c.intermediate_size, generator=g))
        h = m.layer(i, h)
        # the keys really got smoothed: their per-channel max is flatter
        k_after = capture(m, i, m.embed(tok) if i == 0 else h)["keys"] if i == 0 else None
        if k_after is not None:
            spread = lambda k: float(k.abs().amax((0, 2)).max() / k.abs().amax((0, 2)).median())  # noqa: E731
            assert spread(k_after) < spread(cap["keys"])
    assert rel(m.logits(tok), ref) < 1e-4


def test_fmpq_permutation_is_equivalent_in_float(setup):
    lm, tok, ref = setup
    m = TorchLlama(lm.config, lm.tensors)
    algo = FMPQ(parse_recipe("w4a4"), outlier_ratio=3.0)
    h = m.embed(tok)
    for i in range(lm.config.num_layers):
        algo.transform_layer(m, i, capture(m, i, h))
        h = m.layer(i, h)
    assert m.fake.input_perm  # permutations are in place ...
    assert rel(m.logits(tok), ref) < 1e-4  # ... and the float model does not notice


@pytest.mark.parametrize("n", [1, 2, 12, 20, 48, 64, 72, 576, 1536])
def test_hadamard_orders(n):
    h = hadamard(n)
    assert set(np.unique(h)) <= {-1, 1}
    hf = h.astype(np.float64)  # exact: integer sums far below 2^53
    np.testing.assert_array_equal(hf @ hf.T, n * np.eye(n))


def test_hadamard_unreachable_order_is_named():
    with pytest.raises(ValueError, match="order 22"):
        hadamard(22)


@pytest.mark.parametrize("fold", [True, False], ids=["folded", "norm-weights-kept"])
@pytest.mark.parametrize("sites", [("qkv",), ("gate_up",), ("qkv", "gate_up")])
def test_online_block_input_rotation(setup, sites, fold):
    lm, tok, ref = setup
    m = TorchLlama(lm.config, lm.tensors)
    if fold:
        T.fold_norms(m)
    assert T.norms_are_folded(m) == fold  # the tiny model's norm weights are not all ones
    folded = {k: v.clone() for k, v in m.weights.items()}
    T.rotate_block_inputs(m, sites, torch.from_numpy(scaled_hadamard(lm.config.hidden_size)))
    assert rel(m.logits(tok), ref) < 1e-4
    rotated = {linear_name(i, u) for site in sites for i in range(lm.config.num_layers) for u in T.BLOCK_INPUTS[site]}
    assert set(m.fake.input_rotation) == rotated
    for name, w in m.weights.items():
        if name in rotated:
            assert rel(w, folded[name]) > 0.5, name
        else:
            assert torch.equal(w, folded[name]), name


def test_online_rotation_of_both_block_inputs_quantizes_like_the_residual_rotation(setup):
    """Under int8 activations, qkv and gate/up see x·H either way, and the o/down inputs are not rotated by
    either: the two differ only in float rounding (and so in rare int8 rounding ties)."""
    lm, tok, _ = setup
    h = torch.from_numpy(scaled_hadamard(lm.config.hidden_size))
    plain, residual, online = (TorchLlama(lm.config, lm.tensors) for _ in range(3))
    for m in (residual, online):
        T.fold_norms(m)
    T.rotate_residual(residual, h)
    T.rotate_block_inputs(online, ("qkv", "gate_up"), h)
    for m in (plain, residual, online):
        m.fake.act_quant = "int8"
    want = residual.logits(tok)
    assert rel(online.logits(tok), want) < 1e-3
    assert rel(plain.logits(tok), want) > 10 * rel(online.logits(tok), want)  # the rotation matters under int8


def test_online_rotation_bad_sites(setup):
    lm, _, _ = setup
    m = TorchLlama(lm.config, lm.tensors)
    eye = torch.eye(lm.config.hidden_size, dtype=torch.float64)
    for bad in ((), ("o_proj",), ("qkv", "down")):
        with pytest.raises(ValueError, match="non-empty subset of"):
            T.rotate_block_inputs(m, bad, eye)
