"""The power-of-two FMPQ block-scale fake quantizer (activation_quant.fake_quant_fmpq_pow2, issue 19) against a
float64 loop written from its definition, on fresh random rows with outlier channels, odd shapes and block maps
from 0% to 100% int8; and the properties the W4A8 GEMM needs (every code an s8 multiple of 2^e, |code| <= 112 in
int4 blocks)."""
import numpy as np
import pytest
import torch

from lowbit.quantize.activation_quant import FMPQ_BLOCK, fake_quant_fmpq, fake_quant_fmpq_pow2, pow2_token_scale


def rows(m, k, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp(torch.randn(k, generator=g))
    x[:, torch.randint(0, k, (3,), generator=g)] *= 40  # outlier channels
    x[0] = 0.0 if m > 2 else x[0]  # one all-zero token where there are several
    return x


def block_map(k, frac, seed):
    nb = -(-k // FMPQ_BLOCK)
    bits = np.full(nb, 4, np.uint8)
    bits[np.random.default_rng(seed).permutation(nb)[: int(round(frac * nb))]] = 8
    return bits


def reference(x, bits):
    """float64 codes and token scales by the definition: s = max(max|int8 blocks| / 127, max|int4 blocks| / 112);
    int4 blocks: the smallest e in 0..4 with max|block| <= 7 s 2^e, code = clamp(round(x / (s 2^e)), -7, 7) << e."""
    xd = x.double().numpy()
    m, k = xd.shape
    codes = np.zeros((m, k))
    scales = np.zeros(m)
    for r in range(m):
        spans = [slice(b * FMPQ_BLOCK, min(k, (b + 1) * FMPQ_BLOCK)) for b in range(len(bits))]
        amax = [np.abs(xd[r, sl]).max() for sl in spans]
        s = max(a / (127.0 if bits[b] == 8 else 112.0) for b, a in enumerate(amax))
        s = s if s > 0 else 1.0
        scales[r] = s
        for b, sl in enumerate(spans):
            if bits[b] == 8:
                codes[r, sl] = np.clip(np.round(xd[r, sl] / s), -127, 127)
                continue
            e = 0
            while e < 4 and amax[b] > 7 * s * 2 ** e:
                e += 1
            codes[r, sl] = np.clip(np.round(xd[r, sl] / (s * 2 ** e)), -7, 7) * 2 ** e
    return codes, scales


@pytest.mark.parametrize("m,k", [(1, 128), (7, 300), (65, 1000), (300, 384)])
@pytest.mark.parametrize("frac", [0.0, 0.1, 0.25, 0.5, 1.0])
def test_pow2_fake_quant_matches_the_definition(m, k, frac):
    x = rows(m, k, seed=m * 31 + k)
    bits = block_map(k, frac, seed=k)
    codes, scales = reference(x, bits)
    s, _ = pow2_token_scale(x, bits)
    np.testing.assert_allclose(s[:, 0].double().numpy(), scales, rtol=1e-6)
    y = fake_quant_fmpq_pow2(x, bits).double().numpy()
    ref = codes * scales[:, None]
    err = np.abs(y - ref).max() / np.abs(ref).max()
    assert err < 1e-6, err  # f32 vs f64 scale arithmetic; a flipped rounding would be ~1/112
    # the codes the W4A8 GEMM reads: integers in s8, int4 blocks multiples of their 2^e within +-112
    q = np.round(y / s.double().numpy())
    assert np.abs(y / s.double().numpy() - q).max() < 1e-3 and np.abs(q).max() <= 127
    for b, bb in enumerate(bits):
        if bb == 4:
            assert np.abs(q[:, b * FMPQ_BLOCK:(b + 1) * FMPQ_BLOCK]).max() <= 112


def test_pow2_steps_are_never_finer_than_fmpq_or_per_token_int8():
    """Why pow2 costs accuracy: its step in every block is >= COMET's free block scale and >= one per-token int8
    scale (max|x| / 127), so on average its error exceeds both."""
    x = rows(64, 1000, seed=5)
    bits = block_map(1000, 0.25, seed=1)
    err = lambda y: float((y - x).pow(2).mean())  # noqa: E731
    s_tok = x.abs().amax(1, keepdim=True).clamp_min(1e-30) / 127
    int8 = torch.round(x / s_tok) * s_tok
    pow2 = fake_quant_fmpq_pow2(x, bits)
    assert err(pow2) > err(fake_quant_fmpq(x, bits)) and err(pow2) > err(int8)
    s, e = pow2_token_scale(x, bits)
    assert bool((s >= s_tok * (1 - 1e-6)).all()) and int(e.max()) <= 4


def test_pow2_fake_quant_rejects_bad_maps():
    x = torch.randn(3, 300)
    with pytest.raises(ValueError, match="block_bits has 2 entries, expected 3"):
        fake_quant_fmpq_pow2(x, [8, 4])
    with pytest.raises(ValueError, match="expected 4 or 8"):
        fake_quant_fmpq_pow2(x, [8, 4, 5])


def test_pow2_scales_option_calibrates_under_pow2_and_is_not_written(tmp_path):
    from lowbit.quantize import pipeline
    from lowbit.quantize.api import algorithm_class, quantize
    from lowbit.quantize.recipes import parse_recipe
    from lowbit.quantize.testing import random_tokens, tiny_llama
    from lowbit.quantize.torch_model import TorchLlama

    lm = tiny_llama(hidden=384, intermediate=700, heads=4, kv_heads=2)
    logits = {}
    for pow2 in (False, True):
        m = TorchLlama(lm.config, lm.tensors)
        algo = algorithm_class("fmpq")(parse_recipe("w4a4"), int8_fraction=0.25, pow2_scales=pow2)
        pipeline.run(m, random_tokens(2, 32), algo, pipeline.Progress(False, 2))
        assert m.fake.act_quant == ("fmpq_pow2" if pow2 else "fmpq")
        logits[pow2] = m.logits(random_tokens(1, 16))
    assert not torch.equal(logits[False], logits[True])
    with pytest.raises(ValueError, match="pow2_scales is a torch-model study"):
        quantize(None, "w4a4", "fmpq", tmp_path / "q", calib=[tmp_path], pow2_scales=True)
