// Causal paged prefill attention on tensor cores: which operands the kernel covers, and the launch of
// the (head_dim, K, V) instance from the generated table (prefill_attention_tc_launch.h; the kernel and
// its design are in prefill_attention_tc_sm80.cuh). Everything else takes the warp kernel
// (prefill_attention_sm80.cu).
#include <cstdint>

#include "kernels/sm80/kv_type.cuh"
#include "kernels/sm80/prefill_attention_tc.h"
#include "kernels/sm80/prefill_attention_tc_launch.h"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda {
namespace {

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Rows of f16 read / written as 32-bit pairs: unit last stride, even row strides, 4-byte base.
bool pairs_aligned(const Tensor& x) {
  return x.dim() == 3 && x.stride(2) == 1 && x.stride(0) % 2 == 0 && x.stride(1) % 2 == 0 && aligned(x.data_ptr(), 4);
}

// Cache rows are copied in 16-byte pieces (cp.async).
bool cache_aligned(const Tensor& c) { return c.is_contiguous() && aligned(c.data_ptr(), 16); }

// The compiled instance for (head_dim, K, V), or null.
PrefillTcLaunch find_launch(int64_t d, KvType kt, KvType vt) {
  for (int i = 0; i < kPrefillTcTableSize; ++i) {
    const PrefillTcEntry& e = kPrefillTcTable[i];
    if (e.head_dim == d && e.k == kt && e.v == vt) return e.launch;
  }
  return nullptr;
}

}  // namespace

bool prefill_attention_tc_supported(const Tensor& q, const Tensor& k_data, const Tensor& v_data, const Tensor& out,
                                    const KWindow& window) {
  KvType kt, vt;
  if (q.dtype() != ScalarType::f16 || out.dtype() != ScalarType::f16) return false;
  if (!kv_type_of(k_data.dtype(), kt, window.defined()) || !kv_type_of(v_data.dtype(), vt)) return false;
  if (q.dim() != 3 || find_launch(q.size(2), kt, vt) == nullptr) return false;
  // u4c: a key tile may touch at most two K blocks, meeting on a multiple of 16 keys.
  if (kv_per_channel_type(kt) && !(k_data.dim() == 4 && k_data.size(2) >= 32 && k_data.size(2) % 16 == 0)) return false;
  return pairs_aligned(q) && pairs_aligned(out) && cache_aligned(k_data) && cache_aligned(v_data);
}

PrefillTcArgs prefill_tc_args(const Tensor& q, const Tensor& k_data, const Tensor& v_data, const Tensor& k_params,
                              const Tensor& v_params, const Tensor& block_tables, const Tensor& seq_info, float scale,
                              Tensor& out, const KWindow& window) {
  const char* op = "prefill_attention";
  const bool per_channel = window.defined();
  KvType kt = KvType::f16, vt = KvType::f16;
  kv_type_of(k_data.dtype(), kt, per_channel);
  kv_type_of(v_data.dtype(), vt);
  if (per_channel) {
    // Per-channel K (u4c): the scales and zeros of a block are copied in 16-byte pieces, and so are the
    // window rows (include/lowbit/cuda/k_window.h).
    const int64_t blocks = k_data.size(0), hkv = k_data.size(1), bs = k_data.size(2), d = q.size(2);
    check_same_device(k_params, k_data, op, "k_params");
    check_dtype(k_params, ScalarType::f32, op, "k_params");
    check_shape(k_params, {blocks, hkv, 2, d}, op, "k_params");
    check_contiguous(k_params, op, "k_params");
    LOWBIT_CHECK(aligned(k_params.data_ptr(), 16), op, ": argument 'k_params' must be 16-byte aligned (per-channel K)");
    check_same_device(window.rows, k_data, op, "window.rows");
    check_dtype(window.rows, ScalarType::f16, op, "window.rows");
    check_shape(window.rows, {-1, hkv, bs, d}, op, "window.rows");
    check_contiguous(window.rows, op, "window.rows");
    LOWBIT_CHECK(aligned(window.rows.data_ptr(), 16), op, ": argument 'window.rows' must be 16-byte aligned");
    check_same_device(window.map, k_data, op, "window.map");
    check_dtype(window.map, ScalarType::s32, op, "window.map");
    check_shape(window.map, {blocks}, op, "window.map");
    check_contiguous(window.map, op, "window.map");
  } else {
    // (scale, zero) pairs are copied in 8-byte pieces.
    LOWBIT_CHECK(kt == KvType::f16 || (k_params.defined() && k_params.is_contiguous() && aligned(k_params.data_ptr(), 8)),
                 op, ": integer K needs contiguous, 8-byte aligned k_params");
  }
  LOWBIT_CHECK(vt == KvType::f16 || (v_params.defined() && v_params.is_contiguous() && aligned(v_params.data_ptr(), 8)),
               op, ": integer V needs contiguous, 8-byte aligned v_params");
  const int hq = static_cast<int>(q.size(1)), hkv = static_cast<int>(k_data.size(1));
  LOWBIT_CHECK(hkv > 0 && hq % hkv == 0, op, ": q heads (", hq, ") must be a multiple of kv heads (", hkv, ")");
  PrefillTcArgs a{};
  a.q = static_cast<const __half*>(q.data_ptr());
  a.out = static_cast<__half*>(out.data_ptr());
  a.q_stride_t = q.stride(0);
  a.q_stride_h = q.stride(1);
  a.out_stride_t = out.stride(0);
  a.out_stride_h = out.stride(1);
  a.k = static_cast<const uint8_t*>(k_data.data_ptr());
  a.v = static_cast<const uint8_t*>(v_data.data_ptr());
  a.k_params = k_params.defined() ? k_params.data<float>() : nullptr;
  a.v_params = v_params.defined() ? v_params.data<float>() : nullptr;
  a.k_window = per_channel ? static_cast<const __half*>(window.rows.data_ptr()) : nullptr;
  a.window_map = per_channel ? window.map.data<int32_t>() : nullptr;
  a.block_tables = block_tables.data<int32_t>();
  a.seq_info = seq_info.data<int32_t>();
  a.num_seqs = static_cast<int>(block_tables.size(0));
  a.max_blocks = static_cast<int>(block_tables.size(1));
  a.hq = hq;
  a.hkv = hkv;
  a.block_size = static_cast<int>(k_data.size(2));
  a.scale_log2 = scale * prefill_tc::kLog2e;
  return a;
}

void prefill_attention_tc(const Tensor& q, const Tensor& k_data, const Tensor& v_data, const Tensor& k_params,
                          const Tensor& v_params, const Tensor& block_tables, const Tensor& seq_info, int max_q_len,
                          float scale, Tensor& out, cudaStream_t stream, const KWindow& window) {
  const char* op = "prefill_attention";
  const bool per_channel = window.defined();
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, prefill_attention_tc_supported(q, k_data, v_data, out, window), op,
                    ": the tensor-core kernel needs f16 q/out with aligned rows, a compiled (head_dim, K, V) "
                    "instance and f16/u8/u4/u2 contiguous caches",
                    per_channel ? "; per-channel K needs u4 or u2 k_data and a block size of at least 32, a multiple of 16"
                                : "");
  const PrefillTcArgs a =
      prefill_tc_args(q, k_data, v_data, k_params, v_params, block_tables, seq_info, scale, out, window);
  if (a.num_seqs == 0 || max_q_len <= 0) return;
  KvType kt = KvType::f16, vt = KvType::f16;
  kv_type_of(k_data.dtype(), kt, per_channel);
  kv_type_of(v_data.dtype(), vt);
  const dim3 grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.hq),
                  static_cast<unsigned>((max_q_len + prefill_tc::kQTile - 1) / prefill_tc::kQTile));
  find_launch(q.size(2), kt, vt)(a, grid, stream);
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

}  // namespace lowbit::cuda
