"""The table of error paths that test_error_paths.py drives in child processes, one area per child.

An area's prelude runs once in its child (after `import torch`, then lowbit) and defines what its cases share,
always including ok(): a correct call of the area's API. A case is a snippet `bad` that must raise `exc` (an
exception type name, a tuple of accepted names, or None for "must not raise", e.g. a second close) with a message
holding every string of `words` (the offending value, argument, tensor or recipe), then a snippet `good` (by default
ok()) that must succeed in the same process afterwards. `when` limits a case to some machines: "gpu" (lowbit and torch
see a CUDA GPU), "no_gpu", "cpu_build" (lowbit built without CUDA). The prelude sees torch, lowbit, C (lowbit._core),
np, WORKDIR (a scratch folder), GPU and cuda_labelled(t) (t's host memory labelled as CUDA: lets a CPU machine
check that GPU tensors are refused before they are touched; used only on machines without a GPU).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    id: str
    bad: str
    exc: str | tuple[str, ...] | None
    words: tuple[str, ...] = ()
    good: str = "ok()"
    when: str = "always"


@dataclass(frozen=True)
class Area:
    name: str
    prelude: str
    cases: tuple[Case, ...]


def case(id, bad, exc, *words, good="ok()", when="always"):
    return Case(id, bad, exc, tuple(words), good, when)


# ---------------------------------------------------------------- bindings/core.cpp: tensors, DLPack
CORE = Area("core", """
x = torch.arange(6, dtype=torch.float32)

class ReturnsInt:
    def __dlpack__(self, **kw):
        return 42

class Refuses:
    def __dlpack__(self, **kw):
        raise RuntimeError("no export from Refuses")

def ok():
    t = C.empty([2, 3], "f16")
    assert t.shape == (2, 3) and t.dtype == "f16"
    assert torch.equal(torch.from_dlpack(C.from_dlpack(x)), x)
""", (
    case("from_dlpack_list", "C.from_dlpack([1, 2, 3])", "TypeError", "argument 'obj'", "list"),
    case("from_dlpack_none", "C.from_dlpack(None)", "TypeError", "from_dlpack()", "NoneType"),
    case("from_dlpack_complex", "C.from_dlpack(torch.zeros(2, dtype=torch.complex64))", "TypeError",
         "argument 'obj'", "unsupported DLPack dtype"),
    case("from_dlpack_float64_numpy", "C.from_dlpack(np.zeros(3))", "TypeError", "argument 'obj'", "bits=64"),
    case("from_dlpack_meta_tensor", "C.from_dlpack(torch.zeros(3, device='meta'))", "BufferError", "meta"),
    case("from_dlpack_not_a_capsule", "C.from_dlpack(ReturnsInt())", "TypeError", "ReturnsInt.__dlpack__()",
         "returned int", "not a DLPack capsule"),
    case("from_dlpack_producer_raises", "C.from_dlpack(Refuses())", "RuntimeError", "no export from Refuses"),
    case("from_dlpack_consumed_capsule", "cap = x.__dlpack__(); C.from_dlpack(cap); C.from_dlpack(cap)",
         "TypeError", "already consumed"),
    case("from_dlpack_versioned_capsule", "C.from_dlpack(x.__dlpack__(max_version=(1, 0)))", "TypeError",
         "versioned"),
    case("tensor_no_constructor", "C.Tensor()", "TypeError", "Tensor"),
    case("empty_bad_dtype", "C.empty([2], 'f64')", "TypeError", "'f64'"),
    case("empty_negative_dim", "C.empty([2, -1])", "ValueError", "negative dimension", "[2, -1]"),
    case("empty_shape_not_ints", "C.empty('ab')", "TypeError", "empty()", "incompatible function arguments"),
    case("empty_element_count_overflows", "C.empty([1 << 62], 'f32')", "ValueError", "[4611686018427387904]", "f32"),
    case("empty_element_count_overflows_2d", "C.empty([1 << 40, 1 << 40], 'u8')", "ValueError",
         "[1099511627776, 1099511627776]"),
    case("empty_host_out_of_memory", "C.empty([1 << 50], 'u8')", "MemoryError", "out of memory", "1125899906842624"),
    case("empty_bad_device", "C.empty([2], 'f32', 'tpu')", "ValueError", "'tpu'"),
    case("view_wrong_numel", "C.from_dlpack(x).view([4])", "ValueError", "[4]", "f32[6]"),
    case("view_not_contiguous", "C.from_dlpack(torch.zeros(4, 4).T).view([16])", "ValueError", "not contiguous"),
    case("view_as_bytes_not_contiguous", "C.from_dlpack(torch.zeros(4, 4).T).view_as_bytes()", "ValueError",
         "not contiguous"),
    case("slice_out_of_bounds", "C.from_dlpack(x).slice(0, 4, 9)", "IndexError", "[4, 9)", "size 6"),
    case("slice_bad_dim", "C.from_dlpack(x).slice(3, 0, 1)", "IndexError", "dimension 3"),
    case("copy_shape_mismatch", "C.empty([6]).copy_(torch.zeros(5))", "ValueError", "shape mismatch", "f32[5]"),
    case("copy_dtype_mismatch", "C.empty([6]).copy_(torch.zeros(6, dtype=torch.int32))", "TypeError",
         "dtype mismatch", "s32"),
    case("copy_from_float64", "C.empty([6]).copy_(torch.zeros(6, dtype=torch.float64))", "TypeError",
         "argument 'src'", "bits=64"),
    case("to_bad_device", "C.from_dlpack(x).to('tpu')", "ValueError", "'tpu'"),
    case("dlpack_max_version_not_tuple", "C.empty([2]).__dlpack__(max_version='1.0')", "TypeError",
         "'max_version'", "'1.0'"),
    case("dlpack_max_version_empty", "C.empty([2]).__dlpack__(max_version=())", "TypeError", "'max_version'", "()"),
    case("scalar_type_bits_unknown", "C.scalar_type_bits('f13')", "TypeError", "'f13'"),
    case("allocator_stats_bad_device", "C.allocator_stats('tpu')", "ValueError", "'tpu'"),
    case("empty_cache_bad_device", "C.empty_cache('tpu')", "ValueError", "'tpu'"),
))

# ---------------------------------------------------------------- bindings/quant.cpp: formats, quantize, pack
QUANT = Area("quant", """
w = torch.randn(16, 64)
qw = C.quantize_weight(w, "w4", group=32)
qoq = C.quantize_weight(w, "qoq", group=32)
qoq_parts = [torch.from_dlpack(t).clone() for t in (qoq.q, qoq.scales, qoq.zeros, qoq.channel_scales)]
f16 = torch.float16

def ok():
    q8 = C.quantize_weight(w, "w8")
    back = torch.from_dlpack(C.dequantize_weight(q8))
    assert back.shape == (16, 64) and (back - w).abs().max() < 0.05
    p = C.pack_weight(qw, "cpu")
    assert (p.n, p.k, p.group) == (16, 64, 32)
""", (
    case("quantize_unknown_format", "C.quantize_weight(w, 'w3')", "ValueError", "'w3'"),
    case("quantize_bad_group", "C.quantize_weight(w, 'w4', group=48)", "ValueError", "'group'", "48"),
    case("quantize_int_weight", "C.quantize_weight(w.int(), 'w8')", "TypeError", "'w'", "s32"),
    case("quantize_1d_weight", "C.quantize_weight(torch.randn(64), 'w8')", "ValueError", "'w'", "2-D", "[64]"),
    case("quantize_empty_weight", "C.quantize_weight(torch.randn(0, 64), 'w8')", "ValueError", "'w'", "[0, 64]"),
    case("quantize_nan_weight", "C.quantize_weight(torch.full((2, 4), float('nan')), 'w8')", "ValueError",
         "finite", "row 0"),
    case("quantize_odd_k_u4", "C.quantize_weight(torch.randn(3, 65), 'qoq', group=32)", "ValueError", "even k",
         "[3, 65]"),
    case("quantize_given_scales_shape", "C.quantize_weight(w, 'w4', group=32, scales=torch.ones(16, 3, dtype=f16))",
         "ValueError", "scales", "[16, 2]", "[16, 3]"),
    case("quantize_given_scales_dtype", "C.quantize_weight(w, 'w4', group=32, scales=torch.ones(16, 2))",
         "TypeError", "scales", "f16", "f32"),
    case("quantized_weight_unknown_format", "C.QuantizedWeight('w3', torch.zeros(4, 64, dtype=torch.uint8))",
         "ValueError", "'w3'"),
    case("quantized_weight_u4_value_too_big",
         "C.QuantizedWeight('w4', torch.full((4, 64), 16, dtype=torch.uint8), torch.ones(4, 2, dtype=f16), "
         "torch.ones(4, 2, dtype=f16), group=32)", "ValueError", "'q'", "<= 15", "16"),
    case("quantized_weight_q_dtype", "C.QuantizedWeight('w8', torch.zeros(4, 64), torch.ones(4))", "TypeError",
         "'q'", "s8", "f32"),
    case("quantized_weight_missing_scales", "C.QuantizedWeight('w8', torch.zeros(4, 64, dtype=torch.int8))",
         "ValueError", "'scales'", "undefined"),
    case("quantized_weight_bad_group", "C.QuantizedWeight('qoq', *qoq_parts, group=16)", "ValueError",
         "group", "16"),
    case("quantized_weight_zeros_shape",
         "q, s, z, cs = qoq_parts; C.QuantizedWeight('qoq', q, s, z[:, :1].clone(), cs, group=32)", "ValueError",
         "'zeros'", "[16, 2]", "[16, 1]"),
    case("dequantize_packed_weight", "C.dequantize_weight(C.pack_weight(qw))", "TypeError", "dequantize_weight()",
         "PackedWeight"),
    case("pack_unknown_target", "C.pack_weight(qw, 'tpu')", "ValueError", "'tpu'"),
    case("pack_sm90_qoq", "C.pack_weight(qoq, 'sm90')", "NotImplementedError", "sm90", "qoq"),
    case("pack_cpu_target_on_cuda", "C.pack_weight(qw, 'cpu', 'cuda')", "ValueError", "target cpu", "cuda:0"),
    case("unpack_wrong_object", "C.unpack_weight(qw)", "TypeError", "unpack_weight()", "QuantizedWeight"),
    case("weight_bits_unknown", "C.weight_bits('w3')", "ValueError", "'w3'"),
    case("per_token_s8_int_input", "C.quantize_per_token_s8(torch.zeros(2, 3, dtype=torch.int64))", "TypeError",
         "'x'", "s64"),
    case("per_token_s8_1d_input", "C.quantize_per_token_s8(torch.randn(8))", "ValueError", "'x'", "2-D"),
    case("fmpq_bad_block_bits", "C.quantize_fmpq(torch.randn(2, 130), [4, 5])", "ValueError", "'block_bits'",
         "got 5"),
    case("fmpq_block_bits_count", "C.quantize_fmpq(torch.randn(2, 130), [4])", "ValueError", "block_bits", "[2]",
         "[1]"),
    case("fmpq_block_bits_not_ints", "C.quantize_fmpq(torch.randn(2, 130), ['4', 4])", "TypeError",
         "'block_bits'", "str"),
    case("fmpq_block_bits_tensor_dtype", "C.quantize_fmpq(torch.randn(2, 130), torch.tensor([4, 4], dtype=torch.int32))",
         "TypeError", "'block_bits'", "u8", "s32"),
    case("parse_recipe_bad_kv_bits", "C.parse_recipe('w4a8kv3')", "ValueError", "'w4a8kv3'", "kv bits"),
    case("parse_recipe_empty", "C.parse_recipe('')", "ValueError", "bad recipe ''"),
))

# ---------------------------------------------------------------- bindings/kv.cpp: block allocator, KV cache
KV = Area("kv", """
def pool():
    a = C.BlockAllocator(4, 16)
    s = a.create_sequence()
    assert a.append_tokens(s, 20)[0]
    return a, s

def ok():
    a, s = pool()
    assert a.block_table(s) == [0, 1]
    a.free_sequence(s)
    assert a.num_free_blocks == 4
    a.check_invariants()
    c = C.KVCache(2, 1, 64, 4)
    c.copy_block(0, 1)
    assert c.k_data(1).shape == (4, 1, 16, 64)
""", (
    case("allocator_no_blocks", "C.BlockAllocator(0, 4)", "ValueError", "'num_blocks'", "got 0"),
    case("allocator_no_block_size", "C.BlockAllocator(4, 0)", "ValueError", "'block_size'", "got 0"),
    case("free_sequence_twice", "a, s = pool(); a.free_sequence(s); a.free_sequence(s)", "IndexError",
         "unknown sequence id 0", good="a.check_invariants(); assert a.num_free_blocks == 4; ok()"),
    case("append_unknown_sequence", "a, s = pool(); a.append_tokens(17, 1)", "IndexError", "unknown sequence id 17"),
    case("append_negative_tokens", "a, s = pool(); a.append_tokens(s, -1)", "ValueError", "'n'", "got -1"),
    case("fork_unknown_sequence", "a, s = pool(); a.fork(42)", "IndexError", "42"),
    case("ref_count_out_of_range", "a, s = pool(); a.ref_count(9)", "IndexError", "block 9", "[0, 4)"),
    case("slot_of_out_of_range", "a, s = pool(); a.slot_of(s, 99)", "IndexError", "token index 99", "20 tokens"),
    case("adopt_prefix_into_a_used_sequence", "a, s = pool(); a.adopt_cached_prefix(s, [1] * 40)", "ValueError",
         "argument 'seq'", "20 tokens", good="a.check_invariants(); ok()"),
    case("cache_computed_beyond_the_sequence", "a, s = pool(); a.cache_computed_blocks(s, [1] * 30, 25)",
         "ValueError", "'num_computed' (25)", "(20)"),
    case("is_cached_out_of_range", "a, s = pool(); a.is_cached(-1)", "IndexError", "block -1", "[0, 4)"),
    case("kv_cache_per_channel_u2_group_on_gpu", "C.KVCache(1, 1, 64, 4, block_size=40, k_type='u2', device='cuda', "
         "k_per_channel=True)", "ValueError", "multiples of 16", "40", when="gpu"),
    case("kv_cache_u2_head_dim", "C.KVCache(1, 1, 66, 4, k_type='u2')", "ValueError", "divisible by 4", "66"),
    case("kv_write_per_channel_k_without_prepare",
         "c = C.KVCache(1, 1, 64, 4, block_size=32, k_type='u4', device='cuda', k_per_channel=True); "
         "k = torch.randn(2, 1, 64, device='cuda').half(); "
         "m = C.AttentionMeta([0], [2], [2], torch.tensor([[0]], dtype=torch.int32, device='cuda'), "
         "torch.tensor([0, 1], dtype=torch.int32, device='cuda')); C.kv_write(c, 0, k, k, m)",
         "ValueError", "prepare_k_window", "layer 0", "2 (with padding rows)", when="gpu"),
    case("kv_cache_per_channel_k_group_on_gpu", "C.KVCache(1, 1, 64, 4, block_size=24, k_type='u4', device='cuda', "
         "k_per_channel=True)", "ValueError", "multiples of 16", "24", when="gpu"),
    case("kv_cache_per_channel_u8", "C.KVCache(1, 1, 64, 4, k_type='u8', k_per_channel=True)", "TypeError",
         "k_per_channel", "u8"),
    case("kv_cache_bad_type", "C.KVCache(1, 1, 64, 4, v_type='s8')", "TypeError", "v_type", "s8"),
    case("kv_cache_unknown_type", "C.KVCache(1, 1, 64, 4, k_type='f13')", "TypeError", "'f13'"),
    case("kv_cache_zero_head_dim", "C.KVCache(1, 1, 0, 4)", "ValueError", "'head_dim'", "got 0"),
    case("kv_cache_odd_head_dim_u4", "C.KVCache(1, 1, 65, 4, k_type='u4')", "ValueError", "divisible by 2", "65"),
    case("kv_cache_bad_device", "C.KVCache(1, 1, 64, 4, device='tpu')", "ValueError", "'tpu'"),
    case("kv_cache_larger_than_memory", "C.KVCache(1, 1, 64, 1 << 40)", "MemoryError", "out of memory"),
    case("copy_block_out_of_range", "C.KVCache(2, 1, 64, 4).copy_block(0, 9)", "IndexError", "'dst'", "9"),
    case("k_data_layer_out_of_range", "C.KVCache(2, 1, 64, 4).k_data(5)", "IndexError", "KVCache.k_data",
         "'layer' = 5", "[0, 2)"),
    case("v_params_negative_layer", "C.KVCache(2, 1, 64, 4, 16, 'u8', 'u8').v_params(-1)", "IndexError",
         "KVCache.v_params", "'layer' = -1"),
    case("bytes_per_token_bad_config", "C.KVCache.bytes_per_token(0, 1, 64)", "ValueError", "'num_layers'"),
))

# ---------------------------------------------------------------- bindings/ops.cpp: linear, norms, elementwise, sampling
OPS = Area("ops", """
qw = C.quantize_weight(torch.randn(16, 64), "w4", group=32)
pw = C.pack_weight(qw, "cpu")
logits = torch.randn(10)
inf = float("inf")

def ok():
    y = torch.from_dlpack(C.linear(torch.randn(2, 64), pw))
    assert y.shape == (2, 16) and torch.isfinite(y).all()
    assert 0 <= C.sample_token(logits, temperature=0.7, top_k=5, top_p=0.9, uniform=0.3) < 10
""", (
    case("linear_wrong_k", "C.linear(torch.randn(2, 63), pw)", "ValueError", "'x'", "[2, 63]", "k = 64"),
    case("linear_int_input", "C.linear(torch.zeros(2, 64, dtype=torch.int32), pw)", "TypeError", "'x'", "s32"),
    case("linear_3d_input", "C.linear(torch.randn(2, 2, 64), pw)", "ValueError", "'x'", "2-D"),
    case("linear_out_dtype", "C.linear(torch.randn(2, 64), pw, out=torch.empty(2, 16, dtype=torch.float16))",
         "TypeError", "'y'", "f16"),
    case("linear_out_shape", "C.linear(torch.randn(2, 64), pw, out=torch.empty(2, 15))", "ValueError", "'y'"),
    case("linear_bias_shape", "C.linear(torch.randn(2, 64), pw, bias=torch.randn(17))", "ValueError", "'bias'"),
    case("linear_unknown_act", "C.linear(torch.randn(2, 64), pw, act='int3')", "ValueError", "'act'", "'int3'"),
    case("linear_int8_act_needs_w8", "C.linear(torch.randn(2, 64), pw, act='int8_per_token')",
         "NotImplementedError", "int8_per_token", "w4"),
    case("linear_quantized_not_packed", "C.linear(torch.randn(2, 64), qw)", "TypeError", "linear()",
         "QuantizedWeight"),
    case("linear_meta_input", "C.linear(torch.randn(2, 64, device='meta'), pw)", "BufferError", "meta"),
    case("linear_fmpq_needs_s8_weight",
         "q, s = C.quantize_fmpq(torch.randn(2, 64), [8]); C.linear_fmpq(q, s, pw)", "NotImplementedError", "s8"),
    case("rms_norm_weight_shape", "C.rms_norm(torch.randn(2, 8), torch.ones(7))", "ValueError", "'weight'"),
    case("rms_norm_out_shape", "C.rms_norm(torch.randn(2, 8), torch.ones(8), out=torch.empty(2, 7))", "ValueError",
         "'out'", "[2, 7]"),
    case("add_rms_norm_rows", "C.add_rms_norm(torch.randn(2, 8), torch.randn(3, 8), torch.ones(8))", "ValueError",
         "'residual'", "'x'"),
    case("silu_mul_odd_width", "C.silu_mul(torch.randn(2, 7))", "ValueError", "'gate_up'", "even"),
    case("silu_mul_quantize_odd_width", "C.silu_mul_quantize(torch.randn(2, 7).half(), torch.empty(2, 3, "
         "dtype=torch.int8), torch.empty(2))", "ValueError", "'gate_up'", "even"),
    case("silu_mul_quantize_f32", "C.silu_mul_quantize(torch.randn(2, 8), torch.empty(2, 4, dtype=torch.int8), "
         "torch.empty(2))", "TypeError", "'gate_up'", "f16"),
    case("silu_mul_quantize_on_cpu", "C.silu_mul_quantize(torch.randn(2, 8).half(), torch.empty(2, 4, "
         "dtype=torch.int8), torch.empty(2))", "NotImplementedError", "silu_mul_quantize", "GPU only"),
    case("rms_norm_quantize_fmpq_on_cpu", "C.rms_norm_quantize_fmpq(torch.randn(2, 128).half(), None, "
         "torch.ones(128).half(), 1e-5, torch.tensor([4], dtype=torch.uint8))", "NotImplementedError",
         "rms_norm_quantize_fmpq", "GPU only"),
    case("rms_norm_quantize_fmpq_rows", "C.rms_norm_quantize_fmpq(torch.randn(2, 8), torch.randn(3, 8), "
         "torch.ones(8), 1e-5, torch.tensor([4], dtype=torch.uint8))", "ValueError", "'residual'", "'x'"),
    case("silu_mul_quantize_fmpq_odd_width", "C.silu_mul_quantize_fmpq(torch.randn(2, 7).half(), "
         "torch.tensor([4], dtype=torch.uint8))", "ValueError", "'gate_up'", "even"),
    case("silu_mul_quantize_fmpq_on_cpu", "C.silu_mul_quantize_fmpq(torch.randn(2, 8).half(), "
         "torch.tensor([4], dtype=torch.uint8))", "NotImplementedError", "silu_mul_quantize_fmpq", "GPU only"),
    case("embedding_id_out_of_range", "C.embedding(torch.tensor([1, 50], dtype=torch.int32), torch.randn(50, 8))",
         "IndexError", "ids[1] = 50", "50 rows"),
    case("embedding_int64_ids", "C.embedding(torch.tensor([1, 2]), torch.randn(50, 8))", "TypeError", "'ids'", "s64"),
    case("softmax_not_contiguous", "C.softmax(torch.randn(8, 4).T)", "ValueError", "'x'", "contiguous"),
    case("softmax_scalar", "C.softmax(torch.tensor(1.0))", "ValueError", "'x'", "scalar"),
    case("sample_negative_temperature", "C.sample_token(logits, temperature=-1.0)", "ValueError", "temperature", "-1"),
    case("sample_infinite_temperature", "C.sample_token(logits, temperature=inf)", "ValueError", "temperature",
         "inf"),
    case("sample_top_p_zero", "C.sample_token(logits, top_p=0.0)", "ValueError", "top_p", "got 0"),
    case("sample_top_p_above_one", "C.sample_token(logits, top_p=1.5)", "ValueError", "top_p", "1.5"),
    case("sample_negative_top_k", "C.sample_token(logits, top_k=-1)", "ValueError", "top_k", "-1"),
    case("sample_min_p_above_one", "C.sample_token(logits, min_p=2.0)", "ValueError", "min_p", "2"),
    case("sample_uniform_one", "C.sample_token(logits, uniform=1.0)", "ValueError", "uniform", "1"),
    case("sample_f16_logits", "C.sample_token(logits.half())", "TypeError", "'logits'", "f16"),
    case("sample_2d_logits", "C.sample_token(torch.randn(2, 5))", "ValueError", "'logits'", "1-D"),
    case("sample_empty_logits", "C.sample_token(torch.randn(0))", "ValueError", "'logits'", "empty"),
    case("token_logprob_out_of_range", "C.token_logprob(logits, 10)", "IndexError", "token 10", "vocabulary of 10"),
    case("top_logprobs_negative_n", "C.top_logprobs(logits, -1)", "ValueError", "n must be >= 0", "-1"),
    case("penalties_history_out_of_range", "C.apply_penalties(logits.clone(), [50], repetition_penalty=1.1)",
         "IndexError", "history[0] = 50"),
    case("penalties_zero_repetition", "C.apply_penalties(logits.clone(), [1], repetition_penalty=0.0)",
         "ValueError", "repetition_penalty", "0"),
    case("penalties_infinite_presence", "C.apply_penalties(logits.clone(), [1], presence_penalty=inf)",
         "ValueError", "presence", "inf"),
))

# ---------------------------------------------------------------- bindings/attention.cpp: rope, kv_write, paged attention
ATTENTION = Area("attention", """
i32 = torch.int32
cache = C.KVCache(2, 1, 64, 4, 16, "f16", "u4")
meta = C.AttentionMeta([0], [2], [2], block_tables=torch.tensor([[0, 1]], dtype=i32),
                       slot_mapping=torch.tensor([0, 1], dtype=i32))
q, k, pos = torch.randn(2, 3, 64), torch.randn(2, 1, 64), torch.tensor([0, 1], dtype=i32)

def slots(*s):
    return C.AttentionMeta([], [], [], slot_mapping=torch.tensor(s, dtype=i32))

def ok():
    C.rope_kv_write(q.clone(), k.clone(), k.clone(), pos, cache, 0, meta)
    out = torch.from_dlpack(C.paged_attention(q, cache, 0, meta, 0.125))
    assert out.shape == (2, 3, 64) and torch.isfinite(out).all()
""", (
    case("rope_odd_rotary_dim", "C.rope(q, None, pos, rotary_dim=33)", "ValueError", "rotary_dim 33"),
    case("rope_positions_shape", "C.rope(q, None, torch.tensor([0, 1, 2], dtype=i32))", "ValueError",
         "'positions'", "[2]", "[3]"),
    case("rope_nothing_to_rotate", "C.rope(None, None, pos)", "ValueError", "'q' and 'k'", "undefined"),
    case("rope_bad_llama3_factors", "C.rope(q, None, pos, llama3=True, low_freq_factor=4.0)", "ValueError",
         "low_freq_factor"),
    case("rope_int_q", "C.rope(q.int(), None, pos)", "TypeError", "'q'", "s32"),
    case("kv_write_v_shape", "C.kv_write(cache, 0, k, torch.randn(2, 2, 64), meta)", "ValueError", "'v'",
         "[2, 1, 64]", "[2, 2, 64]"),
    case("kv_write_slot_past_cache", "C.kv_write(cache, 0, k, k, slots(0, 64))", "IndexError",
         "slot_mapping[1] = 64", "64 slots"),
    case("kv_write_int64_slots",
         "C.kv_write(cache, 0, k, k, C.AttentionMeta([], [], [], slot_mapping=torch.tensor([0, 1])))",
         "TypeError", "'meta.slot_mapping'", "s64"),
    case("kv_write_layer_out_of_range", "C.kv_write(cache, 2, k, k, meta)", "IndexError", "'layer' = 2", "[0, 2)"),
    case("rope_kv_write_tokens_disagree", "C.rope_kv_write(torch.randn(3, 3, 64), k, k, pos, cache, 0, meta)",
         "ValueError", "'q'", "'k'", "tokens"),
    case("rope_kv_write_int_k", "C.rope_kv_write(q, k.int(), k, pos, cache, 0, meta)", "TypeError", "'k'", "s32"),
    case("attention_int_q", "C.paged_attention(q.int(), cache, 0, meta, 0.1)", "TypeError", "'q'", "s32"),
    case("attention_head_dim", "C.paged_attention(torch.randn(2, 3, 32), cache, 0, meta, 0.1)", "ValueError",
         "head_dim 32", "64"),
    case("attention_layer_out_of_range", "C.paged_attention(q, cache, 2, meta, 0.1)", "IndexError", "'layer' = 2"),
    case("attention_out_shape", "C.paged_attention(q, cache, 0, meta, 0.1, torch.empty(2, 3, 63))", "ValueError",
         "'out'", "[2, 3, 63]"),
    case("attention_no_block_tables", "C.paged_attention(q, cache, 0, C.AttentionMeta([0], [2], [2]), 0.1)",
         "ValueError", "'meta.block_tables'", "undefined"),
    case("attention_kv_len_below_q_len",
         "C.paged_attention(q, cache, 0, C.AttentionMeta([0], [2], [1], block_tables=meta.block_tables), 0.1)",
         "ValueError", "kv_len 1 < q_len 2"),
    case("attention_block_not_in_cache",
         "C.paged_attention(q, cache, 0, C.AttentionMeta([0], [2], [20], "
         "block_tables=torch.tensor([[0, 7]], dtype=i32)), 0.1)", "IndexError", "block_tables[0, 1] = 7", "[0, 4)"),
    case("attention_too_few_table_columns",
         "C.paged_attention(q, cache, 0, C.AttentionMeta([0], [2], [40], block_tables=meta.block_tables), 0.1)",
         "ValueError", "3 blocks", "kv_len 40", "2 columns"),
    case("attention_infinite_scale", "C.paged_attention(q, cache, 0, meta, float('inf'))", "ValueError", "'scale'",
         "inf"),
    case("attention_meta_lengths_disagree",
         "C.paged_attention(q, cache, 0, C.AttentionMeta([0], [2, 1], [2], block_tables=meta.block_tables), 0.1)",
         "ValueError", "q_start", "q_len", "kv_len"),
))

# ---------------------------------------------------------------- bindings/engine.cpp: Model, Engine
ENGINE = Area("engine", """
from lowbit import models
from lowbit.model_loading import core_config
from test_models_loader import _tiny_config

cfg = _tiny_config()  # vocab 258, hidden 64, 2 layers, context 256
CFG = core_config(cfg)
rng = np.random.default_rng(0)
W = {n: (rng.standard_normal(s) * 0.2).astype(np.float32) for n, s in models.expected_shapes(cfg).items()}
Q = "model.layers.0.self_attn.q_proj.weight"
inf, nan = float("inf"), float("nan")

def make_model(recipe="w16a16", finalize=True):
    m = C.Model(CFG, recipe)
    for name, t in W.items():
        m.set_weight(name, t)
    if finalize:
        m.finalize()
    return m

model = make_model()
BLOCK_BYTES = model.info()["kv_bytes_per_token"] * 16

def run(eng):
    out = {}
    while eng.has_unfinished():
        for ev in eng.step():
            if ev.token >= 0:
                out.setdefault(ev.request_id, []).append(ev.token)
    return out

def ok(eng=None):
    eng = eng or C.Engine(model)
    eng.add_request(99, [1, 2, 3], temperature=0.0, max_tokens=3)
    assert len(run(eng)[99]) == 3

def bad_request(**kw):
    eng = C.Engine(model)
    eng.add_request(1, [1, 2, 3], temperature=0.0, max_tokens=2)  # another request keeps running
    args = dict(request_id=2, prompt_ids=[4, 5])
    args.update(kw)
    try:
        eng.add_request(args.pop("request_id"), args.pop("prompt_ids"), **args)
    finally:
        globals()["ENG"] = eng

def serves():  # the engine that refused a request still serves the one it had and a new one
    ENG.add_request(99, [1, 2, 3], temperature=0.0, max_tokens=3)
    out = run(ENG)
    assert len(out[1]) == 2 and len(out[99]) == 3, out
""", (
    case("model_bad_recipe", "C.Model(CFG, 'w4a8kv3')", "ValueError", "'w4a8kv3'", "kv bits"),
    case("model_per_channel_k8_recipe", "C.Model(CFG, 'w16a16kc8v8')", "ValueError", "'w16a16kc8v8'", "4 or 2 bits"),
    case("model_int_dtype", "C.Model(CFG, 'w16a16', 'cpu', 's8')", "TypeError", "'dtype'", "s8"),
    case("model_unknown_dtype", "C.Model(CFG, 'w16a16', 'cpu', 'f64')", "TypeError", "'f64'"),
    case("model_bad_device", "C.Model(CFG, 'w16a16', 'tpu')", "ValueError", "'tpu'"),
    case("model_empty_config", "C.Model(C.ModelConfig(), 'w16a16')", "ValueError", "ModelConfig"),
    case("set_weight_after_finalize", "model.set_weight('model.norm.weight', W['model.norm.weight'])", "ValueError",
         "Model.set_weight", "already finalized"),
    case("finalize_twice", "model.finalize()", "ValueError", "Model.finalize", "already finalized"),
    case("set_weight_wrong_shape", "m = make_model(finalize=False); m.set_weight(Q, np.ones((64, 63), np.float32))",
         "ValueError", "q_proj", "[64, 64]", "[64, 63]", good="m.set_weight(Q, W[Q]); m.finalize(); ok()"),
    case("set_weight_int_tensor", "m = make_model(finalize=False); m.set_weight(Q, np.ones((64, 64), np.int32))",
         "TypeError", "q_proj", "s32", good="m.finalize(); ok()"),
    case("set_weight_float64_tensor", "m = make_model(finalize=False); m.set_weight(Q, np.ones((64, 64)))",
         "TypeError", "q_proj", "bits=64", good="m.finalize(); ok()"),
    case("set_weight_not_a_tensor", "m = make_model(finalize=False); m.set_weight(Q, [[1.0] * 64] * 64)",
         "TypeError", "q_proj", "list", good="m.finalize(); ok()"),
    case("set_weight_unknown_name", "m = make_model(finalize=False); m.set_weight('model.foo.weight', W[Q])",
         "ValueError", "'model.foo.weight'", good="m.finalize(); ok()"),
    case("set_weight_layer_out_of_range",
         "m = make_model(finalize=False); m.set_weight('model.layers.7.mlp.up_proj.weight', W[Q])", "IndexError",
         "layer 7", "[0, 2)", good="m.finalize(); ok()"),
    case("set_quantized_weight_wrong_format",
         "m = make_model(finalize=False); m.set_quantized_weight(Q, C.quantize_weight(torch.from_numpy(W[Q]), 'w8'))",
         "ValueError", "format w8", "w16a16", good="m.finalize(); ok()"),
    case("set_input_permutation_repeated",
         "m = make_model(finalize=False); m.set_input_permutation(Q, torch.zeros(64, dtype=torch.int32))",
         "ValueError", "'perm'", "permutation", "repeated", good="m.finalize(); ok()"),
    case("set_fmpq_block_bits_without_a4",
         "m = make_model(finalize=False); m.set_fmpq_block_bits(Q, torch.tensor([4], dtype=torch.uint8))",
         "ValueError", "w16a16", "no FMPQ", good="m.finalize(); ok()"),
    case("finalize_missing_weights", "C.Model(CFG, 'w16a16').finalize()", "ValueError", "missing",
         "model.norm.weight"),
    case("engine_on_unfinalized_model", "C.Engine(make_model(finalize=False))", "ValueError", "finalize"),
    case("engine_zero_batch_tokens", "C.Engine(model, max_batch_tokens=0)", "ValueError", "'max_batch_tokens'"),
    case("engine_zero_max_seqs", "C.Engine(model, max_seqs=0)", "ValueError", "'max_seqs'"),
    case("engine_zero_block_size", "C.Engine(model, block_size=0)", "ValueError", "'block_size'"),
    case("engine_gpu_memory_fraction", "C.Engine(model, gpu_memory_fraction=1.5)", "ValueError",
         "'gpu_memory_fraction'", "1.5"),
    case("engine_negative_kv_bytes", "C.Engine(model, kv_cache_bytes=-1)", "ValueError", "'kv_cache_bytes'", "-1"),
    case("engine_kv_pool_below_one_block", "C.Engine(model, kv_cache_bytes=1)", "ValueError", "'kv_cache_bytes' (1)",
         "one KV block"),
    case("request_beyond_context", "bad_request(prompt_ids=[1] * 250, max_tokens=10)", "ValueError",
         "max_position_embeddings (256)", good="serves()"),
    case("request_beyond_tiny_pool",
         "eng = C.Engine(model, kv_cache_bytes=BLOCK_BYTES); eng.add_request(1, [1] * 20, max_tokens=5)",
         "ValueError", "2 KV blocks", "kv_cache_bytes", good="ok(eng)"),
    case("logits_beyond_free_pool", "eng = C.Engine(model, kv_cache_bytes=BLOCK_BYTES); eng.logits([1] * 20)",
         "MemoryError", "20 tokens", "KV blocks", good="assert eng.logits([1, 2, 3]).shape == (3, 258); ok(eng)"),
    case("logits_beyond_context", "C.Engine(model).logits([1] * 300)", "ValueError", "max_position_embeddings"),
    case("logits_empty_prompt", "C.Engine(model).logits([])", "ValueError", "'prompt_ids'", "empty"),
    case("request_empty_prompt", "bad_request(prompt_ids=[])", "ValueError", "'prompt_ids'", "empty",
         good="serves()"),
    case("request_token_outside_vocab", "bad_request(prompt_ids=[1, 258])", "ValueError", "'prompt_ids'[1] = 258",
         good="serves()"),
    case("request_zero_max_tokens", "bad_request(max_tokens=0)", "ValueError", "'max_tokens'", "got 0",
         good="serves()"),
    case("request_negative_temperature", "bad_request(temperature=-0.5)", "ValueError", "'temperature'", "-0.5",
         good="serves()"),
    case("request_infinite_temperature", "bad_request(temperature=inf)", "ValueError", "'temperature'", "inf",
         good="serves()"),
    case("request_nan_temperature", "bad_request(temperature=nan)", "ValueError", "'temperature'", "nan",
         good="serves()"),
    case("request_top_p_zero", "bad_request(top_p=0.0)", "ValueError", "'top_p'", "got 0", good="serves()"),
    case("request_top_p_above_one", "bad_request(top_p=1.01)", "ValueError", "'top_p'", "1.01", good="serves()"),
    case("request_negative_top_k", "bad_request(top_k=-1)", "ValueError", "'top_k'", "-1", good="serves()"),
    case("request_min_p_above_one", "bad_request(min_p=1.5)", "ValueError", "'min_p'", "1.5", good="serves()"),
    case("request_zero_repetition_penalty", "bad_request(repetition_penalty=0.0)", "ValueError",
         "'repetition_penalty'", "got 0", good="serves()"),
    case("request_infinite_repetition_penalty", "bad_request(repetition_penalty=inf)", "ValueError",
         "'repetition_penalty'", "inf", good="serves()"),
    case("request_infinite_presence_penalty", "bad_request(presence_penalty=inf)", "ValueError",
         "'presence_penalty'", "inf", good="serves()"),
    case("request_nan_frequency_penalty", "bad_request(frequency_penalty=nan)", "ValueError",
         "'frequency_penalty'", "nan", good="serves()"),
    case("request_negative_min_tokens", "bad_request(min_tokens=-1)", "ValueError", "'min_tokens'", "-1",
         good="serves()"),
    case("request_negative_logprobs", "bad_request(logprobs=-1)", "ValueError", "'logprobs'", "-1",
         good="serves()"),
    case("request_stop_token_outside_vocab", "bad_request(stop_token_ids=[1000])", "ValueError",
         "'stop_token_ids'", "1000", good="serves()"),
    case("request_negative_seed", "bad_request(seed=-1)", "TypeError", "add_request()", "seed", good="serves()"),
    case("request_id_in_use", "bad_request(request_id=1)", "ValueError", "'request_id' 1", "in use",
         good="serves()"),
    case("session_in_use",
         "eng = C.Engine(model); eng.add_request(1, [1, 2], max_tokens=2, session_id=5); "
         "eng.add_request(2, [1, 2], max_tokens=2, session_id=5)", "ValueError", "'session_id' 5",
         "in use by request 1", good="ok(eng)"),
))

# ---------------------------------------------------------------- python/lowbit: LLM, GenerationConfig, Session
LLM = Area("llm", """
import os
from test_models_loader import _tiny_config, make_gguf
from test_llm import tiny_tensors

cfg = _tiny_config()  # vocab 258, context 256
PATH = str(make_gguf(os.path.join(WORKDIR, "tiny.gguf"), cfg, tiny_tensors(cfg)))
CUT = os.path.join(WORKDIR, "cut.gguf")
with open(PATH, "rb") as f, open(CUT, "wb") as g:
    g.write(f.read()[:5000])
MISSING = os.path.join(WORKDIR, "nope.gguf")
llm = lowbit.LLM(PATH, progress=False)
one_block = llm.info()["kv_bytes_per_token"] * 16
small = lowbit.LLM(PATH, kv_cache_memory=one_block, progress=False)
threaded = lowbit.LLM(PATH, step_thread=True, progress=False)
threaded.close()

def ok(model=None):
    out = (model or llm).generate([3, 4, 5], max_tokens=4, ignore_eos=True)[0]
    assert len(out.token_ids) == 4 and out.finish_reason == "length"
    assert llm.stats()["num_free_blocks"] == llm.stats()["num_blocks"]

def gen(prompt=(1, 2), **kw):
    return llm.generate(list(prompt) if isinstance(prompt, tuple) else prompt, **kw)
""", (
    case("llm_bad_recipe", "lowbit.LLM(PATH, recipe='w5a16', progress=False)", "ValueError", "'w5a16'"),
    case("llm_bad_recipe_checked_before_file", "lowbit.LLM(MISSING, recipe='w4a8kv3', progress=False)",
         "ValueError", "'w4a8kv3'"),
    case("llm_missing_model_file", "lowbit.LLM(MISSING, progress=False)", "FileNotFoundError", "nope.gguf"),
    case("llm_truncated_model_file", "lowbit.LLM(CUT, progress=False)", "ValueError", "cut.gguf",
         "truncated or corrupt"),
    case("llm_bad_device", "lowbit.LLM(PATH, device='tpu', progress=False)", "ValueError", "'tpu'"),
    case("llm_cuda_on_a_machine_without_gpu", "lowbit.LLM(PATH, device='cuda', progress=False)",
         ("NotImplementedError", "RuntimeError"), "cuda:0", when="no_gpu"),
    case("llm_unknown_dtype", "lowbit.LLM(PATH, dtype='f64', progress=False)", "TypeError", "'f64'"),
    case("llm_kc_group_recipe", "lowbit.LLM(PATH, recipe='w16a16kc4g48v4', progress=False)", "ValueError",
         "K group size must be 32, 64 or 128"),
    case("llm_zero_kv_cache_memory", "lowbit.LLM(PATH, kv_cache_memory=0, progress=False)", "ValueError",
         "kv_cache_memory", "0"),
    case("llm_kv_cache_below_one_block", "lowbit.LLM(PATH, kv_cache_memory=1, progress=False)", "ValueError",
         "'kv_cache_bytes' (1)", "one KV block"),
    case("llm_negative_num_threads", "lowbit.LLM(PATH, num_threads=-2, progress=False)", "ValueError",
         "num_threads", "-2"),
    case("llm_zero_gpu_memory_fraction", "lowbit.LLM(PATH, gpu_memory_fraction=0, progress=False)", "ValueError",
         "gpu_memory_fraction"),
    case("llm_prefix_caching_not_bool", "lowbit.LLM(PATH, prefix_caching='yes', progress=False)", "ValueError",
         "prefix_caching", "'yes'"),
    case("llm_zero_max_batch_tokens", "lowbit.LLM(PATH, max_batch_tokens=0, progress=False)", "ValueError",
         "'max_batch_tokens'"),
    case("generate_beyond_context", "gen(list(range(250)), max_tokens=10)", "ValueError", "250 prompt tokens",
         "context of 256"),
    case("generate_beyond_tiny_kv_pool", "small.generate([1] * 20, max_tokens=5)", "ValueError", "KV blocks",
         "kv_cache_bytes", good="ok(small)"),
    case("generate_negative_temperature", "gen(temperature=-0.1)", "ValueError", "temperature", "-0.1"),
    case("generate_infinite_temperature", "gen(temperature=float('inf'))", "ValueError", "temperature", "inf"),
    case("generate_temperature_not_a_number", "gen(temperature='hot')", "TypeError", "temperature", "'hot'"),
    case("generate_top_p_zero", "gen(top_p=0.0)", "ValueError", "top_p", "0.0"),
    case("generate_top_p_above_one", "gen(top_p=1.5)", "ValueError", "top_p", "1.5"),
    case("generate_negative_top_k", "gen(top_k=-1)", "ValueError", "top_k", "-1"),
    case("generate_min_p_above_one", "gen(min_p=2.0)", "ValueError", "min_p", "2.0"),
    case("generate_zero_repetition_penalty", "gen(repetition_penalty=0.0)", "ValueError", "repetition_penalty"),
    case("generate_infinite_repetition_penalty", "gen(repetition_penalty=float('inf'))", "ValueError",
         "repetition_penalty", "inf"),
    case("generate_presence_penalty_out_of_range", "gen(presence_penalty=3.0)", "ValueError", "presence_penalty",
         "3.0"),
    case("generate_zero_max_tokens", "gen(max_tokens=0)", "ValueError", "max_tokens", "0"),
    case("generate_min_tokens_above_max", "gen(max_tokens=2, min_tokens=3)", "ValueError", "min_tokens", "3"),
    case("generate_too_many_logprobs", "gen(logprobs=21)", "ValueError", "logprobs", "21"),
    case("generate_negative_seed", "gen(seed=-1)", "ValueError", "seed", "-1"),
    case("generate_empty_stop_string", "gen(stop=[''])", "ValueError", "stop"),
    case("generate_negative_stop_token", "gen(stop_token_ids=[-1])", "ValueError", "stop_token_ids"),
    case("generate_stop_token_outside_vocab", "gen(stop_token_ids=[10 ** 6])", "ValueError", "stop_token_ids",
         "1000000"),
    case("generate_unknown_option", "gen(top_q=0.5)", "TypeError", "top_q"),
    case("generate_config_not_a_config", "llm.generate([1, 2], config={'max_tokens': 3})", "TypeError",
         "GenerationConfig", "dict"),
    case("generate_empty_prompt", "gen('')", "ValueError", "empty prompt"),
    case("generate_no_prompts", "gen([])", "ValueError", "no prompts"),
    case("generate_token_outside_vocab", "gen([1, 258])", "ValueError", "token id 258", "[0, 258)"),
    case("generate_bytes_not_utf8", "gen(b'ok \\xff\\xfe')", "ValueError", "not valid UTF-8"),
    case("generate_prompt_not_a_sequence", "gen([1.5])", "TypeError", "prompt 0", "float"),
    case("generate_prompts_not_iterable", "gen(None)", "TypeError", "expected a prompt", "NoneType"),
    case("chat_no_conversations", "llm.chat([])", "ValueError", "no conversations"),
    case("chat_message_without_content", "llm.chat([{'role': 'user'}])", "ValueError", "message 0",
         "'role' and 'content'"),
    case("stream_bad_top_p", "next(llm.stream([1, 2], top_p=2))", "ValueError", "top_p", "2"),
    case("logits_empty_prompt", "llm.logits([])", "ValueError", "'prompt_ids'", "empty"),
    case("logits_token_outside_vocab", "llm.logits([999])", "ValueError", "999"),
    case("perplexity_bad_window", "llm.perplexity('hello world', window=0)", "ValueError", "window", "0"),
    case("session_empty_message", "s = llm.session(); s.send('')", "ValueError", "user message",
         good="assert s.send('hi', max_tokens=2).token_ids; s.close(); ok()"),
    case("session_send_after_close", "s = llm.session(); s.close(); s.send('hi')", "RuntimeError", "session",
         "closed"),
    case("session_close_twice", "s = llm.session(); s.send('hi', max_tokens=2); s.close(); s.close()", None,
         good="assert llm.stats()['sessions'] == 0; ok()"),
    case("llm_close_twice", "threaded.close(); threaded.close()", None),
    case("llm_generate_after_close", "threaded.generate([1, 2], max_tokens=3)", "RuntimeError", "step thread",
         "closed"),
    case("llm_stream_after_close", "next(threaded.stream([1, 2], max_tokens=3))", "RuntimeError", "step thread",
         "closed"),
    case("llm_stats_after_close", "threaded.stats()", "RuntimeError", "step thread", "closed"),
    case("llm_session_after_close", "threaded.session().send('hi')", "RuntimeError", "step thread", "closed"),
    case("llm_inline_close_stops_nothing", "llm.close(); llm.close()", None,
         good="ok()  # inline mode has no thread to stop: documented as still usable"),
))

# ---------------------------------------------------------------- bindings/cuda.cpp (+ devices) without a GPU
CUDA = Area("cuda", """
from lowbit.model_loading import core_config
from test_models_loader import _tiny_config

CFG = core_config(_tiny_config())
f16, u8, i32 = torch.float16, torch.uint8, torch.int32
q = torch.randint(0, 256, (16, 64), dtype=u8)  # [n, k/2]: two u4 per byte, k = 128, group 64
scales = torch.rand(16, 2, dtype=f16) + 0.5
zeros = torch.rand(16, 2, dtype=f16) * 8

def ok():
    data, s, z = C.pack_w4_sm80(q, scales, zeros, 64)
    q2, s2, z2 = C.unpack_w4_sm80(data, s, z, 16, 128, 64)
    assert torch.equal(torch.from_dlpack(q2), q)
""", (
    case("pack_w4_sm80_int8_q", "C.pack_w4_sm80(q.to(torch.int8), scales, zeros, 64)", "TypeError", "'q'", "u8",
         "s8"),
    case("pack_w4_sm80_1d_q", "C.pack_w4_sm80(q.flatten(), scales, zeros, 64)", "ValueError", "pack_w4_sm80",
         "'q'", "2-D"),
    case("unpack_w4_sm80_data_shape", "C.unpack_w4_sm80(torch.zeros(4, dtype=u8), scales, zeros, 16, 128, 64)",
         "ValueError", "'data'", "[4]"),
    case("cuda_device_info", "C.cuda_device_info(0)", ("NotImplementedError", "RuntimeError"), "cuda_device_info",
         "cuda:0", when="no_gpu"),
    case("dequantize_w4", "C.dequantize_w4(q, scales, zeros, 64, torch.empty(16, 128, dtype=f16))",
         "NotImplementedError", "dequantize_w4", "no CUDA support", when="cpu_build"),
    case("gemm_w4a16", "C.gemm_w4a16(torch.zeros(2, 128, dtype=f16), q, scales, zeros, 16, 128, 64, "
         "torch.empty(2, 16, dtype=f16))", "NotImplementedError", "gemm_w4a16", "no CUDA support", when="cpu_build"),
    case("gemm_w4a16_pick_split", "C.gemm_w4a16_pick_split(1, 16, 64)", "NotImplementedError",
         "gemm_w4a16_pick_split", "no CUDA support", when="cpu_build"),
    case("gemm_w4a16_sm90_plan", "C.gemm_w4a16_sm90_plan(256, 4096, 4096)", "NotImplementedError",
         "gemm_w4a16_sm90_plan", "no CUDA support", when="cpu_build"),
    case("gemm_w4a16_sm90_plan_rows", "C.gemm_w4a16_sm90_plan_rows(256, 4096, 4096)", "NotImplementedError",
         "gemm_w4a16_sm90_plan_rows", "no CUDA support", when="cpu_build"),
    case("gemm_w4a8_sm90_plan", "C.gemm_w4a8_sm90_plan(256, 4096, 4096)", "NotImplementedError",
         "gemm_w4a8_sm90_plan", "no CUDA support", when="cpu_build"),
    case("quantize_per_token_s8_gpu", "C.quantize_per_token_s8(torch.zeros(2, 64, dtype=f16), "
         "torch.empty(2, 64, dtype=torch.int8), torch.empty(2))", "NotImplementedError", "quantize_per_token_s8",
         "no CUDA support", when="cpu_build"),
    case("gemm_w8a8", "C.gemm_w8a8(torch.zeros(2, 64, dtype=torch.int8), None, torch.zeros(16, 64, dtype=torch.int8), "
         "None, torch.empty(2, 16, dtype=i32))", "NotImplementedError", "gemm_w8a8", "no CUDA support",
         when="cpu_build"),
    case("gemm_w4a8", "C.gemm_w4a8(torch.zeros(2, 64, dtype=torch.int8), None, "
         "C.pack_weight(C.quantize_weight(torch.ones(16, 64), 'qoq', 64)), torch.empty(2, 16, dtype=i32))",
         "NotImplementedError", "gemm_w4a8", "no CUDA support", when="cpu_build"),
    case("gemm_w4a8_cpu_packed_weight", "C.gemm_w4a8(torch.zeros(2, 64, dtype=torch.int8, device='cuda'), None, "
         "C.pack_weight(C.quantize_weight(torch.ones(16, 64), 'qoq', 64)), torch.empty(2, 16, dtype=i32, "
         "device='cuda'))", "ValueError", "gemm_w4a8", "'w' must be a qoq or liquid weight packed for sm80",
         when="gpu"),
    case("quantize_per_token_e4m3", "C.quantize_per_token_e4m3(torch.zeros(2, 64, dtype=f16), "
         "torch.empty(2, 64, dtype=u8), torch.empty(2))", "NotImplementedError", "quantize_per_token_e4m3",
         "no CUDA support", when="cpu_build"),
    case("gemm_fp8", "C.gemm_fp8(torch.zeros(2, 64, dtype=u8), None, torch.zeros(16, 64, dtype=u8), None, "
         "torch.empty(2, 16))", "NotImplementedError", "gemm_fp8", "no CUDA support", when="cpu_build"),
    case("decode_attention", "C.decode_attention(torch.zeros(1, 1, 64, dtype=f16), torch.zeros(1, 1, 16, 64, dtype=f16), "
         "torch.zeros(1, 1, 16, 64, dtype=f16), None, None, torch.zeros(1, 1, dtype=i32), torch.ones(1, dtype=i32), 1, "
         "0.125, torch.empty(1, 1, 64, dtype=f16))", "NotImplementedError", "decode_attention", "no CUDA support",
         when="cpu_build"),
    case("sample_rows", "C.sample_rows(torch.zeros(2, 8), torch.zeros(2, 5, dtype=torch.int64), "
         "torch.empty(2, dtype=i32), torch.empty(2))", "NotImplementedError", "sample_rows", "CUDA build",
         when="cpu_build"),
    case("empty_on_cuda", "C.empty([2], 'f32', 'cuda')", ("NotImplementedError", "RuntimeError"), "cuda:0",
         when="no_gpu"),
    case("tensor_to_cuda", "C.empty([2]).to('cuda')", ("NotImplementedError", "RuntimeError"), "cuda:0",
         when="no_gpu"),
    case("allocator_stats_cuda", "C.allocator_stats('cuda')", ("NotImplementedError", "RuntimeError"), "cuda:0",
         when="no_gpu"),
    case("empty_cache_cuda", "C.empty_cache('cuda')", ("NotImplementedError", "RuntimeError"), "cuda:0",
         when="no_gpu"),
    case("kv_cache_on_cuda", "C.KVCache(1, 1, 64, 4, device='cuda')", ("NotImplementedError", "RuntimeError"),
         "cuda:0", when="no_gpu"),
    case("pack_weight_for_sm80_on_cuda", "C.pack_weight(C.quantize_weight(torch.randn(16, 64), 'w4', 64), 'sm80', 'cuda')",
         ("NotImplementedError", "RuntimeError"), "cuda:0", when="no_gpu"),
    # GPU tensors (host memory labelled CUDA) where the CPU kernels need host memory, and mixed placements.
    case("sample_token_cuda_logits", "C.sample_token(cuda_labelled(torch.randn(10)))", "NotImplementedError",
         "'logits'", "cuda:0", "CPU logits", when="no_gpu"),
    case("quantize_weight_cuda_tensor", "C.quantize_weight(cuda_labelled(torch.randn(16, 64)), 'w8')", "TypeError",
         "'w'", "on the CPU", "cuda:0", when="no_gpu"),
    case("quantize_fmpq_cuda_x", "C.quantize_fmpq(cuda_labelled(torch.randn(2, 128)), [8])",
         ("NotImplementedError", "RuntimeError"), "quantize_fmpq", "cuda:0", when="no_gpu"),
    case("rms_norm_mixed_devices", "C.rms_norm(cuda_labelled(torch.randn(2, 8)), torch.ones(8), out=torch.empty(2, 8))", "TypeError",
         "'weight' is on cpu", "'x' is on cuda:0", when="no_gpu"),
    case("rms_norm_cuda_inputs", "C.rms_norm(cuda_labelled(torch.randn(2, 8)), cuda_labelled(torch.ones(8)))",
         ("NotImplementedError", "RuntimeError"), "cuda:0", when="no_gpu"),
    case("paged_attention_cuda_q_cpu_cache",
         "C.paged_attention(cuda_labelled(torch.randn(2, 3, 64)), C.KVCache(1, 1, 64, 4), 0, C.AttentionMeta([0], [2], "
         "[2], block_tables=torch.tensor([[0]], dtype=i32)), 0.1, torch.empty(2, 3, 64))", "TypeError", "'out' is on cpu",
         "cuda:0", when="no_gpu"),
    case("kv_write_mixed_devices",
         "k = torch.randn(2, 1, 64); C.kv_write(C.KVCache(1, 1, 64, 4), 0, cuda_labelled(k), k, "
         "C.AttentionMeta([], [], [], slot_mapping=torch.tensor([0, 1], dtype=i32)))", "TypeError", "'v' is on cpu",
         "'k' is on cuda:0", when="no_gpu"),
    case("model_on_cuda", "C.Model(CFG, 'w16a16', 'cuda')", ("NotImplementedError", "RuntimeError"), "Model",
         "cuda:0", when="no_gpu"),
))

# ---------------------------------------------------------------- the GPU: unknown GPU recipes, out of memory, placements
GPU_AREA = Area("gpu", """
import os
from lowbit.model_loading import core_config
from test_models_loader import _tiny_config, make_gguf
from test_llm import tiny_tensors

f16, i32 = torch.float16, torch.int32
# head_dim 64 and 64-multiple widths: shapes every GPU kernel covers
cfg = _tiny_config(hidden_size=128, intermediate_size=128, num_heads=2, num_kv_heads=1, head_dim=64)
CFG = core_config(cfg)
PATH = str(make_gguf(os.path.join(WORKDIR, "gpu_tiny.gguf"), cfg, tiny_tensors(cfg)))
llm = lowbit.LLM(PATH, device="cuda", progress=False)
GiB = 1 << 30

def ok():
    out = llm.generate([3, 4, 5], max_tokens=4, ignore_eos=True)[0]
    assert len(out.token_ids) == 4
    x = torch.randn(2, 64, device="cuda", dtype=f16)
    y = torch.from_dlpack(C.rms_norm(x, torch.ones(64, device="cuda", dtype=f16)))  # out made on x's device
    torch.cuda.synchronize()
    ref = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)
    assert y.is_cuda and torch.allclose(y.float(), ref, atol=1e-2, rtol=1e-2)

def hog_gpu(leave):
    # torch takes all but `leave` bytes of the free GPU memory (plain cudaMalloc, no managed memory)
    torch.cuda.empty_cache()
    free = torch.cuda.mem_get_info()[0]
    return torch.empty(max(free - leave, 0), dtype=torch.uint8, device="cuda")

def big_model(vocab, hidden):
    # One large embedding (tied head): vocab * hidden f16 twice on the GPU, from zero-stride host views
    # (the model stages f32 copies: 4 * vocab * hidden bytes of host memory).
    c = C.ModelConfig()
    c.arch, c.vocab_size, c.hidden_size, c.intermediate_size = "llama", vocab, hidden, 64
    c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim = 1, 1, 1, 64
    c.rope_theta, c.rms_norm_eps, c.max_position_embeddings, c.tie_word_embeddings = 1e4, 1e-5, 64, True
    m = C.Model(c, "w16a16", "cuda", "f16")
    one = torch.full((1, 1), 0.02)
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "model.layers.0.input_layernorm.weight": (hidden,),
              "model.layers.0.post_attention_layernorm.weight": (hidden,),
              "model.layers.0.self_attn.q_proj.weight": (64, hidden), "model.layers.0.self_attn.k_proj.weight": (64, hidden),
              "model.layers.0.self_attn.v_proj.weight": (64, hidden), "model.layers.0.self_attn.o_proj.weight": (hidden, 64),
              "model.layers.0.mlp.gate_proj.weight": (64, hidden), "model.layers.0.mlp.up_proj.weight": (64, hidden),
              "model.layers.0.mlp.down_proj.weight": (hidden, 64)}
    for name, shape in shapes.items():
        m.set_weight(name, one.reshape((1,) * len(shape)).expand(shape))
    m.finalize()
    return m
""", (
    # w4a4 runs on the GPU, but only with the block maps `lowbit quantize --algo fmpq` writes; RTN weights say so
    case("llm_w4a4kv4_without_block_maps_on_gpu",
         "lowbit.LLM(PATH, recipe='w4a4kv4', device='cuda', progress=False).generate('Hi', max_tokens=2)",
         "NotImplementedError", "w4a4kv4", "block map", "lowbit quantize --algo fmpq", when="gpu"),
    case("model_w4a8g32_has_no_gpu_kernel", "C.Model(CFG, 'w4a8g32kv4', 'cuda', 'f16')", "NotImplementedError",
         "'w4a8g32kv4'", "group 32 has no W4A8 GPU kernel", when="gpu"),
    case("model_f32_on_gpu", "C.Model(CFG, 'w16a16', 'cuda', 'f32')", "NotImplementedError", "dtype f32", "f16",
         when="gpu"),
    case("model_on_missing_gpu", "C.Model(CFG, 'w16a16', 'cuda:99', 'f16')", "ValueError", "cuda:99",
         "does not exist", when="gpu"),
    case("empty_larger_than_gpu", "C.empty([1 << 45], 'u8', 'cuda')", "MemoryError", "out of memory", "cuda:0",
         good="assert C.empty([1 << 20], 'u8', 'cuda').device == 'cuda:0'; ok()", when="gpu"),
    case("kv_pool_larger_than_gpu",
         "C.Engine(llm.model, kv_cache_bytes=8 * torch.cuda.mem_get_info()[1])", "MemoryError", "out of memory",
         "cuda:0", when="gpu"),
    case("kv_pool_tiny_gpu_memory_fraction", "C.Engine(llm.model, gpu_memory_fraction=0.001)", "MemoryError",
         "no GPU memory left for the KV cache", "gpu_memory_fraction 0.001", when="gpu"),
    case("model_larger_than_free_gpu_memory",
         "hog = hog_gpu(256 << 20); big_model(131072, 2048)", "MemoryError", "out of memory", "cuda:0",
         good="del hog; torch.cuda.empty_cache(); assert big_model(4096, 256).info()['device'] == 'cuda:0'; ok()",
         when="gpu"),
    case("llm_load_with_no_free_gpu_memory",
         "hog = hog_gpu(64 << 20); lowbit.LLM(PATH, device='cuda', progress=False)", "MemoryError", "cuda:0",
         good="del hog; torch.cuda.empty_cache(); ok()", when="gpu"),
    case("rms_norm_cuda_x_cpu_weight", "C.rms_norm(torch.randn(2, 8, device='cuda'), torch.ones(8))", "TypeError",
         "'weight' is on cpu", "'x' is on cuda:0", when="gpu"),
    case("rms_norm_cpu_x_cuda_weight", "C.rms_norm(torch.randn(2, 8), torch.ones(8, device='cuda'))", "TypeError",
         "'weight' is on cuda:0", "'x' is on cpu", when="gpu"),
    case("linear_cpu_x_gpu_weight",
         "C.linear(torch.zeros(2, 128, dtype=f16), C.pack_weight(C.quantize_weight(torch.randn(64, 128), 'w4', 64), "
         "'sm80', 'cuda'))", "TypeError", "'w.data' is on cuda:0", "'x' is on cpu", when="gpu"),
    case("sample_token_cuda_logits", "C.sample_token(torch.randn(10, device='cuda'))", "NotImplementedError",
         "'logits'", "cuda:0", when="gpu"),
    case("sample_rows_cpu_logits", "C.sample_rows(torch.zeros(2, 8), torch.zeros(2, 5, dtype=torch.int64), "
         "torch.empty(2, dtype=i32), torch.empty(2))", "TypeError", "sample_rows", "'logits'", when="gpu"),
    case("gemm_w4a16_cpu_x",
         "parts = C.pack_w4_sm80(torch.zeros(16, 32, dtype=torch.uint8), torch.ones(16, 1, dtype=f16), "
         "torch.zeros(16, 1, dtype=f16), 64); C.gemm_w4a16(torch.zeros(2, 64, dtype=f16), "
         "*[torch.from_dlpack(t).cuda() for t in parts], 16, 64, 64, torch.empty(2, 16, dtype=f16, device='cuda'))",
         "TypeError", "gemm_w4a16", "'x'", "cpu", when="gpu"),
    case("paged_attention_cuda_q_cpu_cache",
         "q = torch.zeros(1, 1, 64, dtype=f16, device='cuda'); C.paged_attention(q, C.KVCache(1, 1, 64, 2, 16, 'f16', "
         "'f16', 'cpu'), 0, C.AttentionMeta([0], [1], [1], torch.zeros(1, 1, dtype=i32, device='cuda'), "
         "torch.zeros(1, dtype=i32, device='cuda')), 0.1, torch.empty_like(q))", "TypeError", "KV cache is on cpu",
         "cuda:0", when="gpu"),
    case("kv_write_cpu_k_gpu_cache",
         "k = torch.randn(2, 1, 64); C.kv_write(C.KVCache(1, 1, 64, 4, 16, 'f16', 'f16', 'cuda'), 0, k, k, "
         "C.AttentionMeta([], [], [], slot_mapping=torch.tensor([0, 1], dtype=i32)))", "TypeError", "cuda:0", "cpu",
         when="gpu"),
    case("quantize_weight_gpu_tensor", "C.quantize_weight(torch.randn(16, 64, device='cuda'), 'w8')", "TypeError",
         "'w'", "on the CPU", "cuda:0", when="gpu"),
    case("quantized_weight_gpu_q",
         "C.QuantizedWeight('w8', torch.zeros(4, 64, dtype=torch.int8, device='cuda'), torch.ones(4))", "TypeError",
         "'q'", "on the CPU", "cuda:0", when="gpu"),
    case("quantize_per_token_s8_gpu_tensor", "C.quantize_per_token_s8(torch.randn(2, 64, device='cuda'))",
         "TypeError", "'x'", "on the CPU", "cuda:0", when="gpu"),
    case("engine_bad_request_on_gpu", "e = C.Engine(llm.model); e.add_request(1, [1] * 250, max_tokens=10)",
         "ValueError", "max_position_embeddings", good="e.add_request(2, [1, 2], temperature=0.0, max_tokens=2); "
         "assert sum(ev.token >= 0 for ev in e.step() + e.step()) == 2; ok()", when="gpu"),
))

AREAS = (CORE, QUANT, KV, OPS, ATTENTION, ENGINE, LLM, CUDA, GPU_AREA)
