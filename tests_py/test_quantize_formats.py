"""Weight formats (python/lowbit/quantize/formats.py) against scalar float64 references written from format.h
and the papers (QServe §3.1, LiquidGEMM §4), on random data with odd shapes."""
import math

import numpy as np
import pytest

from lowbit.quantize import formats as F  # noqa: E402


def rne(x):  # round half to even, the rounding the formats use
    return float(np.rint(x))


def ref_w4(w, group, symmetric):
    n, k = w.shape
    G = math.ceil(k / group)
    out = np.zeros((n, k))
    for r in range(n):
        for g in range(G):
            cols = range(g * group, min(k, (g + 1) * group))
            vals = [float(w[r, c]) for c in cols]
            if symmetric:
                scale, zero = max(abs(v) for v in vals) / 7.0, 8.0
            else:
                lo, hi = min(min(vals), 0.0), max(max(vals), 0.0)
                scale = (hi - lo) / 15.0
            scale = float(np.float16(np.float32(scale)))
            scale = scale if scale > 0 else 1.0
            if not symmetric:
                zero = min(max(rne(np.float32(-lo) / np.float32(scale)), 0), 15)
            for c in cols:
                q = min(max(rne(np.float32(w[r, c]) / np.float32(scale)) + zero, 0), 15)
                out[r, c] = (q - zero) * scale
    return out


def ref_two_level(w, group, kind):
    """Level 1 s8 in [-119, 119]; level 2 per group (qoq: zero point; liquid: offset 128 + min, XOR 0x80)."""
    n, k = w.shape
    out = np.zeros((n, k))
    for r in range(n):
        amax = float(np.abs(w[r]).max())
        cs = np.float32(amax) / np.float32(119) if amax > 0 else np.float32(1)
        s8 = [min(max(rne(np.float32(v) / cs), -119), 119) for v in w[r]]
        for g0 in range(0, k, group):
            vals = s8[g0:g0 + group]
            lo, hi = min(vals), max(vals)
            if kind == "qoq":  # QoQ's range includes 0 so that a u4 zero point exists
                lo, hi = min(lo, 0), max(hi, 0)
            step = max(math.ceil((hi - lo) / 15), 1)
            assert step <= 16  # the protective range guarantees it
            for j, v in enumerate(vals):
                if kind == "qoq":
                    z = min(max(rne(-lo / step), 0), 15)
                    q = min(max(rne(v / step) + z, 0), 15)
                    deq = q * step - z * step
                else:
                    q = min(max(rne((v - lo) / step), 0), 15)
                    u8 = int(q * step + 128 + lo)
                    assert 0 <= u8 <= 255  # LiquidGEMM Eq. 11: no u8 overflow
                    deq = (u8 ^ 0x80) - 256 if (u8 ^ 0x80) >= 128 else (u8 ^ 0x80)
                assert -128 <= deq <= 127
                out[r, g0 + j] = deq * float(cs)
    return out


def rand_w(n, k, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    w[rng.integers(0, n), rng.integers(0, k)] *= 20  # an outlier
    return w


SHAPES = [(1, 7), (3, 130), (5, 64), (4, 200)]


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("symmetric", [False, True])
def test_w4_matches_reference(n, k, group, symmetric):
    w = rand_w(n, k, n * k + group)
    f = F.quantize_rtn(w, "w4", group, symmetric)
    assert f.q.dtype == np.uint8 and f.q.max() <= 15
    assert f.scales.dtype == np.float16 and f.scales.shape == (n, math.ceil(k / group))
    assert (f.zeros is None) == symmetric
    np.testing.assert_allclose(F.dequantize(f), ref_w4(w, group, symmetric), rtol=0, atol=1e-7)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("fmt,group", [("qoq", 128), ("qoq", 32), ("liquid", 64), ("liquid", 32)])
def test_two_level_formats_match_reference(n, k, fmt, group):
    w = rand_w(n, k, n + k)
    f = F.quantize_rtn(w, fmt, group)
    assert f.scales.dtype == np.uint8 and f.zeros.dtype == np.uint8 and f.channel_scales.dtype == np.float32
    assert f.scales.max() <= 16 and f.scales.min() >= 1
    if fmt == "qoq":
        assert f.zeros.max() <= 15
    else:  # offset a = 128 + min(s8) with min in [-119, 119]
        assert 9 <= f.zeros.min() and f.zeros.max() <= 247
    np.testing.assert_allclose(F.dequantize(f), ref_two_level(w, group, fmt), rtol=1e-6, atol=0)


@pytest.mark.parametrize("n,k", SHAPES)
def test_w8_and_e4m3(n, k):
    w = rand_w(n, k, 7 * n + k)
    f = F.quantize_rtn(w, "w8")
    scale = np.abs(w).max(1).astype(np.float32) / np.float32(127)
    np.testing.assert_array_equal(f.q, np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8))
    np.testing.assert_allclose(F.dequantize(f), w, atol=float(scale.max()) / 2 + 1e-9, rtol=0)
    e = F.quantize_rtn(w, "e4m3")
    # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normal values
    d = F.dequantize(e)
    big = np.abs(w) > np.abs(w).max(1, keepdims=True) / 64
    assert np.all(np.abs(d - w)[big] <= np.abs(w)[big] * 2 ** -4 + 1e-12)


def test_error_shrinks_with_bits():
    w = rand_w(16, 256, 3)
    err = {fmt: np.abs(F.dequantize(F.quantize_rtn(w, fmt, 64)) - w).mean() for fmt in ("w8", "w4", "qoq")}
    assert err["w8"] < err["qoq"] and err["w8"] < err["w4"]


@pytest.mark.parametrize("k", [1, 2, 9, 130])
def test_pack_u4_roundtrip_and_nibble_order(k):
    rng = np.random.default_rng(k)
    q = rng.integers(0, 16, (3, k)).astype(np.uint8)
    p = F.pack_u4(q)
    assert p.shape == (3, (k + 1) // 2)
    assert p[0, 0] & 0x0F == q[0, 0]  # low nibble = even k
    if k > 1:
        assert p[0, 0] >> 4 == q[0, 1]
    np.testing.assert_array_equal(F.unpack_u4(p, k), q)


def test_bad_inputs_named():
    with pytest.raises(ValueError, match="unknown weight format 'w3'"):
        F.quantize_rtn(np.ones((2, 2)), "w3")
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        F.quantize_rtn(np.ones(4), "w8")
    with pytest.raises(ValueError, match="NaN"):
        F.quantize_rtn(np.full((2, 2), np.nan), "w8")
    with pytest.raises(ValueError, match="positive group"):
        F.quantize_rtn(np.ones((2, 2)), "w4", 0)
    with pytest.raises(ValueError, match="expected 2 for k=4"):
        F.unpack_u4(np.zeros((1, 3), np.uint8), 4)


def _core():
    try:
        import lowbit._core as core
    except ImportError:
        return None
    return core if hasattr(core, "quantize_weight") else None


def _np(t):
    import torch
    if t is None:
        return None
    x = torch.from_dlpack(t)
    return (x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x).numpy()


@pytest.mark.parametrize("fmt,group,symmetric", [("w8", 0, False), ("e4m3", 0, False), ("w4", 128, False),
                                                 ("w4", 32, True), ("qoq", 128, False), ("qoq", 64, False),
                                                 ("liquid", 64, False), ("liquid", 32, False)])
def test_bit_exact_with_cpp_quantize_weight(fmt, group, symmetric):
    core = _core()
    if core is None:
        pytest.skip("lowbit._core.quantize_weight is not importable (build the extension, set LOWBIT_DEV_BUILD)")
    import torch
    for n, k in ((5, 200), (1, 64), (3, 130)):
        w = rand_w(n, k, n + k)
        ours = F.quantize_rtn(w, fmt, group or 128, symmetric)
        theirs = core.quantize_weight(torch.from_numpy(w), fmt, group, symmetric)
        np.testing.assert_array_equal(_np(theirs.q).astype(np.int32), ours.q.astype(np.int32))
        for field in ("scales", "zeros", "channel_scales"):
            a, b = _np(getattr(theirs, field)), getattr(ours, field)
            assert (a is None) == (b is None), field
            if a is not None:
                assert a.dtype == b.dtype, (field, a.dtype, b.dtype)
                np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(_np(core.dequantize_weight(theirs)), F.dequantize(ours))
