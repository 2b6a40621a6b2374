"""lowbit._core weight/activation quantization against independent numpy/torch re-implementations of each
format (docs/formats.md), computed in float32 like the library so q/scales/zeros compare bit-exactly; plus
QuantizedWeight construction, cpu pack round trip, recipe parsing and error messages."""
import numpy as np
import pytest
import torch

from lowbit import _core as C

SHAPES = [(1, 2), (3, 130), (7, 64), (16, 576)]  # k not a multiple of the group; u4 rows need an even k
F32 = np.float32


def rand_w(n, k, seed):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * 0.05).astype(F32)
    w[rng.random((n, k)) < 0.01] *= 20  # outliers
    return w


def arr(t):
    return torch.from_dlpack(t).numpy()


def groups_of(k, group):
    return [slice(g, min(k, g + group)) for g in range(0, k, group)]


def pack_nibbles(q):
    """u4 values [n, k] -> bytes [n, k/2], element 2i in the low nibble of byte i."""
    q = q.astype(np.uint8)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)


# ---- independent references -------------------------------------------------------------------------

def ref_w8(w):
    s = np.abs(w).max(1) / F32(127)
    s[s == 0] = 1
    q = np.clip(np.rint(w / s[:, None]), -127, 127).astype(np.int8)
    return q, s.astype(F32)


def ref_e4m3(w):
    s = np.abs(w).max(1) / F32(448)
    s[s == 0] = 1
    x = torch.from_numpy(w / s[:, None])
    return x.to(torch.float8_e4m3fn).view(torch.uint8).numpy(), s.astype(F32)


def ref_w4(w, group, symmetric):
    n, k = w.shape
    q = np.zeros((n, k), np.int64)
    S, Z = [], []
    for sl in groups_of(k, group):
        g = w[:, sl]
        lo, hi = np.minimum(g.min(1), 0), np.maximum(g.max(1), 0)
        raw = np.maximum(hi, -lo) / F32(7) if symmetric else (hi - lo) / F32(15)
        s16 = raw.astype(np.float16)
        s16[s16 == 0] = 1
        s = s16.astype(F32)
        z = np.full(n, F32(8)) if symmetric else np.clip(np.rint(-lo / s), 0, 15).astype(F32)
        q[:, sl] = np.clip(np.rint(g / s[:, None]) + z[:, None], 0, 15)
        S.append(s16)
        Z.append(z.astype(np.float16))
    return q, np.stack(S, 1), np.stack(Z, 1)


def ref_level1(w):
    cs = np.abs(w).max(1) / F32(119)
    cs[cs == 0] = 1
    return np.clip(np.rint(w / cs[:, None]), -119, 119).astype(np.int64), cs.astype(F32)


def ref_two_level(w, group, kind):
    """(q, step, zero-or-offset, channel scale, s8 value) with plain integer meanings."""
    v, cs = ref_level1(w)
    n, k = w.shape
    q = np.zeros((n, k), np.int64)
    s8 = np.zeros((n, k), np.int64)
    S, Z = [], []
    for sl in groups_of(k, group):
        g = v[:, sl]
        if kind == "qoq":  # u4 zero in [0, 15] => the grid always contains 0
            lo, hi = np.minimum(g.min(1), 0), np.maximum(g.max(1), 0)
        else:
            lo, hi = g.min(1), g.max(1)
        step = np.maximum(1, -(-(hi - lo) // 15))  # ceil
        assert step.max() <= 16
        if kind == "qoq":
            z = np.clip(np.rint(-lo / step), 0, 15).astype(np.int64)
            qq = np.clip(np.rint(g / step[:, None]) + z[:, None], 0, 15).astype(np.int64)
            s8[:, sl] = (qq - z[:, None]) * step[:, None]
        else:
            z = 128 + lo
            qq = np.clip(np.rint((g - lo[:, None]) / step[:, None]), 0, 15).astype(np.int64)
            s8[:, sl] = lo[:, None] + qq * step[:, None]
            # LiquidGEMM Eq. 12 in u8 arithmetic gives the same byte as the plain value
            byte = (qq * step[:, None] + z[:, None])
            assert byte.max() <= 255
            assert np.array_equal(((byte ^ 0x80).astype(np.uint8)).view(np.int8), s8[:, sl].astype(np.int8))
        q[:, sl] = qq
        S.append(step)
        Z.append(z)
    assert s8.min() >= -128 and s8.max() <= 127
    return q, np.stack(S, 1), np.stack(Z, 1), cs, s8


# ---- weight formats ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n,k", SHAPES + [(3, 129), (1, 1)])
def test_w8_bit_exact(n, k):
    w = rand_w(n, k, n * 1000 + k)
    qw = C.quantize_weight(torch.from_numpy(w), "w8")
    q, s = ref_w8(w)
    assert (qw.format, qw.n, qw.k, qw.group) == ("w8", n, k, 0)
    assert np.array_equal(arr(qw.q), q)
    assert np.array_equal(arr(qw.scales), s)
    assert qw.zeros is None and qw.channel_scales is None
    assert np.array_equal(arr(C.dequantize_weight(qw)), q.astype(F32) * s[:, None])


@pytest.mark.parametrize("n,k", SHAPES + [(3, 129)])
def test_e4m3_bit_exact(n, k):
    w = rand_w(n, k, n * 1001 + k)
    qw = C.quantize_weight(torch.from_numpy(w), "e4m3")
    q, s = ref_e4m3(w)
    assert np.array_equal(torch.from_dlpack(qw.q).view(torch.uint8).numpy(), q)
    assert np.array_equal(arr(qw.scales), s)
    deq = torch.from_numpy(q).view(torch.float8_e4m3fn).float().numpy() * s[:, None]
    assert np.array_equal(arr(C.dequantize_weight(qw)), deq)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("symmetric", [False, True])
def test_w4_bit_exact(n, k, group, symmetric):
    w = rand_w(n, k, n * 7 + k + group)
    qw = C.quantize_weight(torch.from_numpy(w), "w4", group=group, symmetric=symmetric)
    q, s, z = ref_w4(w, group, symmetric)
    assert (qw.group, qw.symmetric, qw.num_groups) == (group, symmetric, -(-k // group))
    assert np.array_equal(arr(qw.q), q)
    assert np.array_equal(arr(qw.q_values), q)
    assert np.array_equal(arr(qw.q_packed), pack_nibbles(q))  # storage: two nibbles per byte, low first
    assert np.array_equal(arr(qw.scales).view(np.uint16), s.view(np.uint16))
    if symmetric:
        assert qw.zeros is None
    else:
        assert np.array_equal(arr(qw.zeros), z)
    gidx = np.arange(k) // group
    deq = (q.astype(F32) - z.astype(F32)[:, gidx]) * s.astype(F32)[:, gidx]
    assert np.array_equal(arr(C.dequantize_weight(qw)), deq)


@pytest.mark.parametrize("kind", ["qoq", "liquid"])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("group", [32, 64, 128])
def test_two_level_bit_exact(kind, n, k, group):
    w = rand_w(n, k, n * 13 + k + group)
    qw = C.quantize_weight(torch.from_numpy(w), kind, group=group)
    q, s, z, cs, s8 = ref_two_level(w, group, kind)
    assert np.array_equal(arr(qw.q), q)
    assert np.array_equal(arr(qw.q_packed), pack_nibbles(q))
    assert arr(qw.scales).dtype == np.uint8 and np.array_equal(arr(qw.scales), s)
    assert arr(qw.zeros).dtype == np.uint8 and np.array_equal(arr(qw.zeros), z)
    assert np.array_equal(arr(qw.channel_scales), cs)
    assert np.array_equal(arr(C.dequantize_weight(qw)), s8.astype(F32) * cs[:, None])


def test_default_groups():
    w = torch.from_numpy(rand_w(2, 256, 5))
    assert [C.quantize_weight(w, f).group for f in ("w4", "qoq", "liquid", "w8")] == [128, 128, 64, 0]
    qw = C.quantize_weight(w, "liquid")
    built = C.QuantizedWeight("liquid", torch.from_dlpack(qw.q), torch.from_dlpack(qw.scales),
                              torch.from_dlpack(qw.zeros), torch.from_dlpack(qw.channel_scales))
    assert built.group == 64 and built.num_groups == 4


def test_float_formats_and_half_input():
    w = rand_w(4, 66, 1)
    assert np.array_equal(arr(C.dequantize_weight(C.quantize_weight(torch.from_numpy(w), "f32"))), w)
    h = C.quantize_weight(torch.from_numpy(w), "f16")
    assert np.array_equal(arr(h.q), w.astype(np.float16))
    b = C.quantize_weight(torch.from_numpy(w), "bf16")
    assert torch.equal(torch.from_dlpack(b.q), torch.from_numpy(w).bfloat16())
    # f16 input quantizes like its f32 widening
    wh = torch.from_numpy(w).half()
    a = C.quantize_weight(wh, "w4", group=32)
    assert np.array_equal(arr(a.q), ref_w4(wh.float().numpy(), 32, False)[0])


def test_given_params_reuse_the_rounding():
    """A Python algorithm supplies its own params; the C++ rounds with them (GPTQ-style symmetric grid here)."""
    w = rand_w(5, 96, 3)
    G = 3
    amax = np.abs(w.reshape(5, G, 32)).max(2)
    s16 = (2 * amax / F32(15)).astype(np.float16)  # GPTQ sym: scale = 2 max / 15, zero 8
    z16 = np.full((5, G), 8, np.float16)
    qw = C.quantize_weight(torch.from_numpy(w), "w4", group=32, scales=torch.from_numpy(s16),
                           zeros=torch.from_numpy(z16))
    gidx = np.arange(96) // 32
    q = np.clip(np.rint(w / s16.astype(F32)[:, gidx]) + 8, 0, 15)
    assert np.array_equal(arr(qw.q), q)
    assert np.array_equal(arr(qw.scales), s16)
    # qoq with a clipped level-1 scale (QoQ clip search): level 2 recomputed from the clipped integers
    cs = (np.abs(w).max(1) * F32(0.8) / F32(119)).astype(F32)
    qq = C.quantize_weight(torch.from_numpy(w), "qoq", group=32, channel_scales=torch.from_numpy(cs))
    assert np.array_equal(arr(qq.channel_scales), cs)
    v = np.clip(np.rint(w / cs[:, None]), -119, 119)
    assert np.abs(arr(C.dequantize_weight(qq)) / cs[:, None] - v).max() <= 8  # half a step of at most 16


# ---- QuantizedWeight from tensors, pack round trip ---------------------------------------------------

@pytest.mark.parametrize("fmt", ["w8", "w4", "qoq", "liquid", "e4m3", "f16"])
def test_construct_from_tensors_matches_quantize(fmt):
    w = torch.from_numpy(rand_w(6, 130, 9))
    qw = C.quantize_weight(w, fmt, group=64)
    opt = lambda t: None if t is None else torch.from_dlpack(t).clone()  # noqa: E731
    q = torch.from_dlpack(qw.q).clone()
    if fmt == "e4m3":
        q = q.view(torch.uint8)  # raw bits are accepted too
    built = C.QuantizedWeight(fmt, q, opt(qw.scales), opt(qw.zeros), opt(qw.channel_scales), group=64)
    assert (built.format, built.n, built.k, built.group) == (qw.format, qw.n, qw.k, qw.group)
    assert torch.equal(torch.from_dlpack(C.dequantize_weight(built)), torch.from_dlpack(C.dequantize_weight(qw)))
    if fmt == "e4m3":  # and float8 tensors directly
        f8 = C.QuantizedWeight(fmt, q.view(torch.float8_e4m3fn), opt(qw.scales))
        assert torch.equal(torch.from_dlpack(C.dequantize_weight(f8)), torch.from_dlpack(C.dequantize_weight(qw)))


@pytest.mark.parametrize("fmt,sym", [("f32", False), ("bf16", False), ("w8", False), ("w4", False), ("w4", True),
                                     ("qoq", False), ("liquid", False), ("e4m3", False)])
def test_cpu_pack_round_trip(fmt, sym):
    qw = C.quantize_weight(torch.from_numpy(rand_w(19, 194, 4)), fmt, group=32, symmetric=sym)
    pw = C.pack_weight(qw, "cpu")
    assert (pw.format, pw.target, pw.n, pw.k) == (fmt, "cpu", 19, 194)
    back = C.unpack_weight(pw)
    for name in ["q", "scales", "zeros", "channel_scales"]:
        a, b = getattr(qw, name), getattr(back, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.equal(torch.from_dlpack(a).view(torch.uint8), torch.from_dlpack(b).view(torch.uint8)), name


# ---- activations ------------------------------------------------------------------------------------

@pytest.mark.parametrize("m,k", [(1, 1), (4, 576), (3, 300)])
def test_per_token_s8(m, k):
    x = (np.random.default_rng(k).standard_normal((m, k)) * 3).astype(F32)
    q, s = C.quantize_per_token_s8(torch.from_numpy(x))
    rs = np.abs(x).max(1) / F32(127)
    rs[rs == 0] = 1
    assert np.array_equal(arr(s), rs)
    assert np.array_equal(arr(q), np.clip(np.rint(x / rs[:, None]), -127, 127).astype(np.int8))
    # bf16 input: same as quantizing its f32 widening
    xb = torch.from_numpy(x).bfloat16()
    qb, _ = C.quantize_per_token_s8(xb)
    q2, _ = C.quantize_per_token_s8(xb.float())
    assert torch.equal(torch.from_dlpack(qb), torch.from_dlpack(q2))


def test_fmpq():
    x = (np.random.default_rng(0).standard_normal((5, 300)) * 2).astype(F32)
    x[:, 140] = 80  # an outlier channel in block 1, which gets 8 bits
    bits = [4, 8, 4]
    q, s = C.quantize_fmpq(torch.from_numpy(x), bits)
    q, s = arr(q), arr(s)
    assert s.shape == (5, 3)
    for b, sl in enumerate(groups_of(300, 128)):
        qmax = F32(7 if bits[b] == 4 else 127)
        rs = np.abs(x[:, sl]).max(1) / qmax
        assert np.array_equal(s[:, b], rs)
        assert np.array_equal(q[:, sl], np.clip(np.rint(x[:, sl] / rs[:, None]), -qmax, qmax).astype(np.int8))
    assert np.abs(q[:, :128]).max() <= 7


# ---- recipes ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,fmt,group,act,kb,vb,canon", [
    ("w16a16", "f32", 0, "float16", 16, 16, "w16a16"),
    ("W4A16KV8", "w4", 128, "float16", 8, 8, "w4a16kv8"),
    ("w4a16g32k8v4", "w4", 32, "float16", 8, 4, "w4a16g32k8v4"),
    ("w4a8kv4", "qoq", 128, "int8_per_token", 4, 4, "w4a8kv4"),
    ("w4a8kv4-liquid", "liquid", 64, "int8_per_token", 4, 4, "w4a8kv4-liquid"),
    ("w8a8k8v4", "w8", 0, "int8_per_token", 8, 4, "w8a8k8v4"),
    ("w4a4kv4", "qoq", 128, "fmpq_mixed", 4, 4, "w4a4kv4"),
    ("wfp8a16", "e4m3", 0, "float16", 16, 16, "wfp8a16"),
    ("wfp8a8k8v4", "e4m3", 0, "fp8_per_token", 8, 4, "wfp8a8k8v4"),
])
def test_parse_recipe(text, fmt, group, act, kb, vb, canon):
    r = C.parse_recipe(text)
    assert (r["weight_format"], r["group"], r["activation"], r["k_bits"], r["v_bits"], r["text"]) == \
        (fmt, group, act, kb, vb, canon)
    assert C.parse_recipe(r["text"]) == r


def test_kv2_parses_but_is_marked():
    assert C.parse_recipe("w4a16kv2")["has_kv2"] is True


@pytest.mark.parametrize("text,why", [("w4a8kv3", "kv bits"), ("w5a16", "weight bits"), ("w4a16g48", "group size"),
                                      ("w8a16-liquid", "need w4a8"), ("hello", "expected 'w'")])
def test_bad_recipe(text, why):
    with pytest.raises(ValueError, match="parse_recipe") as e:
        C.parse_recipe(text)
    assert why in str(e.value) and "w4a8kv4" in str(e.value) and repr(text) in str(e.value)


# ---- errors ------------------------------------------------------------------------------------------

def test_errors_name_op_argument_and_values():
    w = torch.from_numpy(rand_w(4, 64, 2))
    with pytest.raises(ValueError, match=r"quantize_weight: argument 'group' of w4 must be 32, 64 or 128, got 48"):
        C.quantize_weight(w, "w4", group=48)
    with pytest.raises(TypeError, match=r"quantize_weight: argument 'w' must be f32, f16 or bf16, got s32"):
        C.quantize_weight(w.int(), "w8")
    with pytest.raises(ValueError, match=r"quantize_weight.*'w'.*finite.*row 0"):
        C.quantize_weight(torch.full((2, 4), float("nan")), "w8")
    with pytest.raises(ValueError, match=r"unknown weight format 'w3'.*qoq"):
        C.quantize_weight(w, "w3")
    with pytest.raises(ValueError, match=r"scales.*\[4, 2\].*\[4, 3\]"):
        C.quantize_weight(w, "w4", group=32, scales=torch.ones(4, 3, dtype=torch.float16))
    with pytest.raises(TypeError, match=r"scales.*f16.*f32"):
        C.quantize_weight(w, "w4", group=32, scales=torch.ones(4, 2))
    with pytest.raises(ValueError, match=r"even k"):
        C.quantize_weight(torch.randn(3, 65), "qoq", group=32)
    qw = C.quantize_weight(w, "qoq", group=32)
    q = torch.from_dlpack(qw.q).clone()
    s = torch.from_dlpack(qw.scales).clone()
    z = torch.from_dlpack(qw.zeros).clone()
    cs = torch.from_dlpack(qw.channel_scales).clone()
    bad_q = q.clone()
    bad_q[1, 3] = 16
    with pytest.raises(ValueError, match=r"QuantizedWeight.*'q'.*<= 15.*16"):
        C.QuantizedWeight("qoq", bad_q, s, z, cs, group=32)
    with pytest.raises(ValueError, match=r"QuantizedWeight.*'zeros'.*\[4, 2\].*\[4, 1\]"):
        C.QuantizedWeight("qoq", q, s, z[:, :1].clone(), cs, group=32)
    with pytest.raises(ValueError, match=r"QuantizedWeight.*channel_scales"):
        C.QuantizedWeight("qoq", q, s, z, None, group=32)
    with pytest.raises(ValueError, match=r"group.*32, 64 or 128"):
        C.QuantizedWeight("qoq", q, s, z, cs, group=16)
    # adversarial parameters: 15 * 17 - 0 = 255 is not an s8 value, the constructor refuses it
    q2, s2, z2 = q.clone(), s.clone(), z.clone()
    q2[2, :32] = 0
    q2[2, 5], s2[2, 0], z2[2, 0] = 15, 17, 0
    with pytest.raises(ValueError, match=r"qoq weight overflows s8 at row 2 column 5"):
        C.QuantizedWeight("qoq", q2, s2, z2, cs, group=32)
    with pytest.raises(NotImplementedError, match=r"sm90.*qoq"):
        C.pack_weight(qw, "sm90")
    with pytest.raises(ValueError, match=r"pack target 'tpu'"):
        C.pack_weight(qw, "tpu")
    with pytest.raises(ValueError, match=r"quantize_fmpq.*block_bits.*5"):
        C.quantize_fmpq(torch.randn(2, 130), [4, 5])
    with pytest.raises(ValueError, match=r"quantize_fmpq.*block_bits.*\[2\].*\[1\]"):
        C.quantize_fmpq(torch.randn(2, 130), [4])
    with pytest.raises(TypeError, match=r"quantize_per_token_s8.*'x'.*s64"):
        C.quantize_per_token_s8(torch.zeros(2, 3, dtype=torch.int64))
