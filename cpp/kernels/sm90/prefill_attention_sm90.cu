// Causal paged prefill attention on Hopper: the operands prefill_attention_sm90 covers, and the launch of the
// (head_dim, K, V) instance (the kernel and its design: prefill_attention_sm90.cuh).
#include "kernels/sm90/prefill_attention_sm90.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "kernels/sm80/prefill_attention_tc.h"  // prefill_tc_args
#include "kernels/sm90/prefill_split_plan.h"
#include "kernels/sm90/stream_fork.h"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda {
namespace {

constexpr int kRows = 128;  // query rows per CTA (prefill_sm90::kRows)

using Launch = void (*)(const PrefillTcArgs&, dim3, cudaStream_t);
struct Entry {
  int head_dim;
  KvType k, v;
  Launch launch;
};
#define LOWBIT_SM90_ROW(D, K)                                                       \
  {D, KvType::K, KvType::f16, &launch_prefill_attention_sm90<D, KvType::K, KvType::f16>}, \
      {D, KvType::K, KvType::u8, &launch_prefill_attention_sm90<D, KvType::K, KvType::u8>}, \
      {D, KvType::K, KvType::u4, &launch_prefill_attention_sm90<D, KvType::K, KvType::u4>}, \
      {D, KvType::K, KvType::u2, &launch_prefill_attention_sm90<D, KvType::K, KvType::u2>}
const Entry kTable[] = {LOWBIT_SM90_ROW(64, f16),  LOWBIT_SM90_ROW(64, u8),  LOWBIT_SM90_ROW(64, u4),
                        LOWBIT_SM90_ROW(64, u2),   LOWBIT_SM90_ROW(64, u4c), LOWBIT_SM90_ROW(64, u2c),
                        LOWBIT_SM90_ROW(128, f16), LOWBIT_SM90_ROW(128, u8), LOWBIT_SM90_ROW(128, u4),
                        LOWBIT_SM90_ROW(128, u2),  LOWBIT_SM90_ROW(128, u4c), LOWBIT_SM90_ROW(128, u2c)};
#undef LOWBIT_SM90_ROW

// The previous u4 / u2 dequantization (options.ref_dequant; prefill_attention_sm90_ref.cu).
const Entry kRefTable[] = {
    {64, KvType::u4, KvType::u4, &launch_prefill_attention_sm90<64, KvType::u4, KvType::u4, true>},
    {64, KvType::u2, KvType::u2, &launch_prefill_attention_sm90<64, KvType::u2, KvType::u2, true>},
    {128, KvType::u4, KvType::u4, &launch_prefill_attention_sm90<128, KvType::u4, KvType::u4, true>},
    {128, KvType::u2, KvType::u2, &launch_prefill_attention_sm90<128, KvType::u2, KvType::u2, true>},
    // per-channel K the previous way (prefill_attention_sm90_ref_kc.cu)
    {128, KvType::u4c, KvType::u4, &launch_prefill_attention_sm90<128, KvType::u4c, KvType::u4, true>},
    {128, KvType::u2c, KvType::u2, &launch_prefill_attention_sm90<128, KvType::u2c, KvType::u2, true>}};

Launch find_launch(int64_t d, KvType kt, KvType vt, bool ref = false) {
  for (const Entry& e : kTable)
    if (!ref && e.head_dim == d && e.k == kt && e.v == vt) return e.launch;
  for (const Entry& e : kRefTable)
    if (ref && e.head_dim == d && e.k == kt && e.v == vt) return e.launch;
  return nullptr;
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// The sm_90a image runs on compute capability 9.0 exactly (asked once per device).
bool sm90_device(int device) {
  static std::atomic<int> cache[64] = {};
  if (device < 0 || device >= 64) return false;
  int v = cache[device].load();
  if (v == 0) {
    int major = 0, minor = 0;
    LOWBIT_CUDA_CHECK("prefill_attention", cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    LOWBIT_CUDA_CHECK("prefill_attention", cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    v = major == 9 && minor == 0 ? 1 : 2;
    cache[device].store(v);
  }
  return v == 1;
}

int sm_count(int device) {  // asked once per device
  static std::atomic<int> cache[64] = {};
  if (device < 0 || device >= 64) return 132;
  int v = cache[device].load();
  if (v == 0) {
    LOWBIT_CUDA_CHECK("prefill_attention", cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, device));
    cache[device].store(v);
  }
  return v;
}

// Query heads per CTA (the kernel reads it back as hq / gridDim.x). With an integer per-token K or V, the query
// heads of a kv head can share a CTA (its 128 rows: 128 / group positions x group heads): chunks of fewer than 128
// new tokens fill the CTA's rows instead of leaving most of them empty, so group times fewer CTAs visit the
// prefix's tiles (each dequantized once per kv head rather than once per query head). That pays only where the
// CTAs of one head per CTA would queue for the SMs: under one wave they all run at once, and a packed CTA with
// twice the live rows keeps both consumer warpgroups busy where one of them had nothing to do (one 64-token chunk
// over 8K, u8: 171 us packed against 150). Measured (docs/benchmarks_gpu.md, "Prefill over a quantized cache"):
// 16 x 64-token chunks 1.7-1.8x faster packed, 64 x 16 3.5-3.6x, fresh prompts the same either way. f16 and
// per-channel K keep one head per CTA (the kernel compiles them as before).
// With a key split (below) the CTAs no longer queue, and a chunk shorter than kRows leaves rows of an unpacked CTA
// empty: packed, group times fewer CTAs dequantize each prefix tile, and the split restores the CTA count.
// options.pack_heads: 0 this rule, 1 never pack, 2 pack wherever the cache allows (tests and measurements).
int heads_per_cta(KvType kt, KvType vt, int group, int64_t unpacked_ctas, int sms, bool splits_short_chunk,
                  const PrefillSm90Options& options) {
  const bool packable = !kv_per_channel_type(kt) && (kt != KvType::f16 || vt != KvType::f16) && group >= 1 &&
                        group <= kRows;
  if (!packable || options.pack_heads == 1) return 1;
  return options.pack_heads == 2 || unpacked_ctas > sms || splits_short_chunk ? group : 1;
}

// The dequantized copy (prefill_dequant_copy.cu). The fused launch dequantizes a kv head's prefix tile once per CTA
// that visits it: `visits` CTAs per kv head and sequence (G / heads per CTA x query tiles). Its producer is the
// integer caches' bound: a u4 tile costs ~3.0 us against the f16 cache's ~1.7 (H200, 256-token chunks over 8K and
// 32K, docs/benchmarks_gpu.md "Prefill over a long cached prefix: dequantize once"), so with enough visits one pass
// over the keys and the f16 instance cost less. Measured (H200, Llama-3-8B heads, one chunk; the copy kernel with
// one 16-byte output chunk per lane, 12e615b): the copy alone costs 11-15 us at 8K and 42-54 us at 32K (u2 least,
// u8 most), and from 8 visits on (256-token chunks) it wins for every format: u8 / u4 / u2 82 / 80 / 78 us against
// the fused 96 / 98 / 91 over 8K, 282 / 275 / 266 against 372 / 401 / 315 over 32K. At 2 visits (a packed 64-token
// chunk) it loses: 41-44 us against 32-35 over 8K, 132-143 against 89-113 over 32K. Hence 4 visits for every format
// (4 itself, a packed 128-token chunk, not measured). The copy lives for the launch only;
// kMaxCopyBytes bounds it (the engine keeps 512 MiB out of the KV pool for a step's scratch), and a failed
// allocation falls back to the fused launch. options.dequant_copy: 0 this rule, 1 never, 2 wherever it reads the cache.
// The rule stays out of launches whose packing or split is forced (tests and measurements of the fused kernel).
constexpr int kCopyMinVisits = 4;
constexpr int64_t kMaxCopyBytes = int64_t(256) << 20;
bool wants_copy(int head_dim, KvType kt, KvType vt, int64_t visits, int64_t bytes, const PrefillSm90Options& options) {
  if (kv_per_channel_type(kt) || options.ref_dequant || options.dequant_copy == 1 ||
      !prefill_dequant_copy_covers(head_dim, kt, vt))
    return false;  // per-channel K: wants_channel_copy
  if (options.dequant_copy == 2) return true;
  return options.pack_heads == 0 && options.key_splits == 0 && visits >= kCopyMinVisits && bytes <= kMaxCopyBytes;
}

// The copy's buffers are asked in size classes, powers of two: the caching allocator keeps a freed block for a
// request of its exact (512-byte rounded) size only, and a chunked prefill with a growing prefix asks a new size at
// each step. A power of two serves every launch up to it (each layer's, the next steps' and the next prompt's), and
// what the cache keeps of the copies stays below twice the largest (at most 512 MiB at the 256 MiB cap). The rule
// still weighs the copy's exact bytes.
int64_t size_class(int64_t n) {
  int64_t c = 1;
  while (c < n) c <<= 1;
  return c;
}

// Per-channel K (u4c / u2c): a block that seals inside the chunk is codes for its later queries and window rows for
// the earlier ones, so no single copy serves the whole launch. The keys below the tail split's bound (whole key tiles
// below min(first_pos, codes_end(first_pos)): sealed before the chunk, codes for every query) are the same for every
// query: the copy dequantizes those (per-channel K, per-token V), the f16 instance runs over them as the first
// splits of a key split, the per-channel instance over the rest (the chunk's own blocks, the window, the diagonal)
// as its last split, and the merge combines them (split_tail in PrefillTcArgs). The fused kernel dequantizes every
// sealed tile once per CTA visiting it (G x query tiles; per-channel K is never packed) at 0.30-0.63x SDPA
// (docs/benchmarks_gpu.md, "Per-channel K prefill: the sealed prefix dequantized once"). Measured (H200, Llama-3-8B
// heads, G 16, one chunk): 1.35-3.7x faster than the fused launch at 64 / 256 / 1024 tokens (4 / 8 / 32 visits) over
// 8K and 32K, kc4 and kc2. The rule: 4 visits as the per-token copy's (below 4 not measured), and only where some
// sequence can have 4 sealed key tiles (the table's width less the chunk: a fresh prompt has none, and the split
// would only add the merge). The tail launch runs on a second stream beside the copy and the head (launch_channel_copy).
constexpr int kChannelMinSealedTiles = 4;
bool wants_channel_copy(int head_dim, KvType kt, KvType vt, int64_t visits, int64_t bytes, int64_t sealed_bound,
                        const PrefillSm90Options& options) {
  if (!kv_per_channel_type(kt) || options.ref_dequant || options.dequant_copy == 1 ||
      !prefill_dequant_copy_covers(head_dim, kt, vt))
    return false;
  if (options.dequant_copy == 2) return true;
  return options.pack_heads == 0 && options.key_splits == 0 && visits >= kCopyMinVisits && bytes <= kMaxCopyBytes &&
         sealed_bound >= kChannelMinSealedTiles * kRows;
}

// The launches of the per-channel copy (above): false (nothing launched) where its buffers cannot be allocated.
bool launch_channel_copy(const PrefillTcArgs& a, const Tensor& q, int max_q_len, KvType kt, KvType vt, int sms,
                         const PrefillSm90Options& options, cudaStream_t stream) {
  const char* op = "prefill_attention";
  const int64_t head_dim = q.size(2);
  const int64_t tiles = (max_q_len + kRows - 1) / kRows;
  const int64_t prefix_bound = static_cast<int64_t>(a.max_blocks) * a.block_size - 1;
  // The f16 instance's splits: the key split's plan for its launch (a forced split count includes the tail's).
  int head_splits = options.key_splits > 1 ? options.key_splits - 1
                                           : prefill_split::plan_splits(a.hq * tiles * a.num_seqs, sms, prefix_bound);
  head_splits = std::max(1, std::min(head_splits, prefill_split::kMaxSplits - 1));
  const int64_t pages = static_cast<int64_t>(a.num_seqs) * a.max_blocks;
  const int64_t halves = pages * a.hkv * a.block_size * head_dim;  // one side
  PrefillTcArgs f = a;
  f.splits = head_splits + 1;
  f.split_tail = 1;
  f.split_tokens = static_cast<int>(q.size(0));
  const int64_t rows = static_cast<int64_t>(f.splits) * f.split_tokens * a.hq;
  Tensor copy, copy_table, partials;
  try {
    copy = Tensor::empty({size_class(2 * halves)}, ScalarType::f16, q.device());
    copy_table = Tensor::empty({size_class(pages)}, ScalarType::s32, q.device());
    partials = Tensor::empty({rows * (head_dim + 2)}, ScalarType::f32, q.device());
  } catch (const std::exception&) {  // no room: the fused launch
    return false;
  }
  f.split_o = partials.data<float>();
  f.split_ml = reinterpret_cast<float2*>(f.split_o + rows * head_dim);
  // The tail reads only the cache and writes only its own split's partials: on the side stream (options.side_stream)
  // it runs beside the copy and the head, and only the merge waits for both. The same launches either way. The
  // buffers go back to the caching allocator on return, which hands a block to the next launch on `stream` at once
  // (one stream's order): the join puts the tail before the merge, so before anything queued after it, and a later
  // fork waits on all of that before its tail starts.
  std::optional<StreamFork> fork;
  if (options.side_stream != 1) fork.emplace(stream, q.device().index, op);  // before the copy: the tail skips it
  PrefillTcArgs tail = f;  // the rest: the per-channel instance on the cache, the last split
  tail.split_first = head_splits, tail.split_count = 1;
  const auto launch_tail = [&](cudaStream_t s) {
    find_launch(head_dim, kt, vt)(
        tail, dim3(static_cast<unsigned>(a.hq), static_cast<unsigned>(tiles), static_cast<unsigned>(a.num_seqs)), s);
    LOWBIT_CUDA_CHECK_LAUNCH(op);
  };
  __half* k16 = reinterpret_cast<__half*>(copy.data_ptr());
  prefill_dequant_copy(a, static_cast<int>(head_dim), kt, vt, k16, k16 + halves, copy_table.data<int32_t>(), stream);
  LOWBIT_CUDA_CHECK_LAUNCH(op);
  // The copy is launched before the tail: with the tail first, its high-priority CTAs took the SMs ahead of the copy
  // (on the critical path) and stretched it 16 -> 94 us at 1024 tokens over 8K, and eagerly the copy started a host
  // launch late. Copy first, the fork measured no slower than one stream at 64-1024 tokens (H200, 9add64c: 1024 over
  // 32K 1075 vs 1116 us eagerly, 1084 vs 1164 in a graph); a graph holds the same nodes either way.
  if (fork) launch_tail(fork->side());
  PrefillTcArgs head = f;  // the sealed keys: the f16 instance over the copy, splits [0, head_splits)
  head.k = reinterpret_cast<const uint8_t*>(k16);
  head.v = reinterpret_cast<const uint8_t*>(k16 + halves);
  head.k_params = head.v_params = nullptr;
  head.k_window = nullptr;
  head.window_map = nullptr;
  head.block_tables = copy_table.data<int32_t>();
  head.split_first = 0, head.split_count = head_splits;
  find_launch(head_dim, KvType::f16, KvType::f16)(
      head, dim3(static_cast<unsigned>(a.hq), static_cast<unsigned>(tiles), static_cast<unsigned>(a.num_seqs * head_splits)),
      stream);
  LOWBIT_CUDA_CHECK_LAUNCH(op);
  if (fork)
    fork->join();
  else
    launch_tail(stream);
  prefill_attention_split_merge(f, static_cast<int>(head_dim), max_q_len, stream);
  LOWBIT_CUDA_CHECK_LAUNCH(op);
  return true;
}

bool no(std::string* why, const char* reason) {
  if (why) *why = reason;
  return false;
}

}  // namespace

bool prefill_attention_sm90_supported(const Tensor& q, const Tensor& k_data, const Tensor& v_data, const Tensor& out,
                                      const KWindow& window, std::string* why) {
  if (!q.device().is_cuda() || !sm90_device(q.device().index)) return no(why, "needs an sm_90 GPU");
  if (q.dtype() != ScalarType::f16 || out.dtype() != ScalarType::f16) return no(why, "needs f16 q and out");
  KvType kt, vt;
  if (!kv_type_of(k_data.dtype(), kt, window.defined()) || !kv_type_of(v_data.dtype(), vt))
    return no(why, window.defined() ? "reads per-channel K of u4 or u2 (V f16, u8, u4 or u2)"
                                    : "reads f16, u8, u4 or u2 K and V");
  if (q.dim() != 3 || find_launch(q.size(2), kt, vt) == nullptr) return no(why, "has head_dim 64 and 128");
  if (window.defined() && !(k_data.dim() == 4 && k_data.size(2) % 16 == 0))
    return no(why, "reads per-channel K in blocks of a multiple of 16 tokens (the GPU cache's rule)");
  // q rows are copied in 16-byte pieces; out is written as f16 pairs.
  if (!(q.stride(2) == 1 && q.stride(0) % 8 == 0 && q.stride(1) % 8 == 0 && aligned(q.data_ptr(), 16)))
    return no(why, "needs q rows 16-byte aligned");
  if (!(out.dim() == 3 && out.stride(2) == 1 && out.stride(0) % 2 == 0 && out.stride(1) % 2 == 0 &&
        aligned(out.data_ptr(), 4)))
    return no(why, "needs out rows 4-byte aligned");
  if (!(k_data.is_contiguous() && v_data.is_contiguous() && aligned(k_data.data_ptr(), 16) &&
        aligned(v_data.data_ptr(), 16)))
    return no(why, "needs contiguous, 16-byte aligned caches");
  return true;
}

void prefill_attention_sm90(const Tensor& q, const Tensor& k_data, const Tensor& v_data, const Tensor& k_params,
                            const Tensor& v_params, const Tensor& block_tables, const Tensor& seq_info, int max_q_len,
                            float scale, Tensor& out, cudaStream_t stream, const KWindow& window,
                            const PrefillSm90Options& options) {
  const char* op = "prefill_attention";
  std::string why;
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, prefill_attention_sm90_supported(q, k_data, v_data, out, window, &why),
                    op, ": the Hopper kernel ", why);
  const PrefillTcArgs a =
      prefill_tc_args(q, k_data, v_data, k_params, v_params, block_tables, seq_info, scale, out, window);
  if (a.num_seqs == 0 || max_q_len <= 0) return;
  KvType kt = KvType::f16, vt = KvType::f16;
  kv_type_of(k_data.dtype(), kt, window.defined());
  kv_type_of(v_data.dtype(), vt);
  const int sms = sm_count(q.device().index), forced = options.key_splits;
  const int64_t head_dim = q.size(2);
  // Keys before a sequence's first query: at most its table's width in keys (the host does not know kv_len).
  const int64_t prefix_bound = static_cast<int64_t>(a.max_blocks) * a.block_size - 1;
  const int64_t unpacked_ctas = static_cast<int64_t>(a.hq) * ((max_q_len + kRows - 1) / kRows) * a.num_seqs;
  const bool split_short =
      max_q_len < kRows && prefill_split::plan_splits(unpacked_ctas, sms, prefix_bound, forced) > 1;
  int pack = heads_per_cta(kt, vt, a.hq / a.hkv, unpacked_ctas, sms, split_short, options);
  if (kv_per_channel_type(kt)) {  // per-channel K: the copy of the sealed keys (one head per CTA)
    const int64_t visits = static_cast<int64_t>(a.hq / a.hkv) * ((max_q_len + kRows - 1) / kRows);
    const int64_t halves = static_cast<int64_t>(a.num_seqs) * a.max_blocks * a.hkv * a.block_size * head_dim;
    const int64_t sealed_bound = static_cast<int64_t>(a.max_blocks) * a.block_size - max_q_len;
    if (wants_channel_copy(static_cast<int>(head_dim), kt, vt, visits, 4 * halves, sealed_bound, options) &&
        launch_channel_copy(a, q, max_q_len, kt, vt, sms, options, stream))
      return;
  }
  PrefillTcArgs args = a;
  Tensor copy, copy_table;  // the dequantized copy and its block table, for this launch
  {
    const int per_cta = kRows / pack;  // query positions
    const int64_t visits = static_cast<int64_t>(a.hq / pack / a.hkv) * ((max_q_len + per_cta - 1) / per_cta);
    const int64_t pages = static_cast<int64_t>(a.num_seqs) * a.max_blocks;
    const int64_t halves = pages * a.hkv * a.block_size * head_dim;  // one side
    if (wants_copy(static_cast<int>(head_dim), kt, vt, visits, 4 * halves, options)) {
      try {
        copy = Tensor::empty({size_class(2 * halves)}, ScalarType::f16, q.device());
        copy_table = Tensor::empty({size_class(pages)}, ScalarType::s32, q.device());
      } catch (const std::exception&) {  // no room for the copy: the fused launch needs none
        copy = Tensor(), copy_table = Tensor();
      }
    }
    if (copy.defined()) {
      __half* k16 = reinterpret_cast<__half*>(copy.data_ptr());
      prefill_dequant_copy(a, static_cast<int>(head_dim), kt, vt, k16, k16 + halves, copy_table.data<int32_t>(),
                           stream);
      LOWBIT_CUDA_CHECK_LAUNCH(op);
      args.k = reinterpret_cast<const uint8_t*>(k16);
      args.v = reinterpret_cast<const uint8_t*>(k16 + halves);
      args.k_params = args.v_params = nullptr;
      args.block_tables = copy_table.data<int32_t>();
      kt = vt = KvType::f16;
      pack = 1;  // f16 keeps one head per CTA
    }
  }
  const int positions = kRows / pack;  // query positions per CTA
  const int64_t tiles = (max_q_len + positions - 1) / positions;
  args.splits = prefill_split::plan_splits((a.hq / pack) * tiles * a.num_seqs, sms, prefix_bound, forced);
  Tensor partials;  // the splits' O [splits, tokens, hq, D], then their (max, sum) [splits, tokens, hq, 2]
  if (args.splits > 1) {
    args.split_tokens = static_cast<int>(q.size(0));
    const int64_t rows = static_cast<int64_t>(args.splits) * args.split_tokens * a.hq;
    partials = Tensor::empty({rows * (q.size(2) + 2)}, ScalarType::f32, q.device());
    args.split_o = partials.data<float>();
    args.split_ml = reinterpret_cast<float2*>(args.split_o + rows * q.size(2));  // 8-byte aligned: D is even
  }
  const dim3 grid(static_cast<unsigned>(a.hq / pack), static_cast<unsigned>(tiles),
                  static_cast<unsigned>(a.num_seqs * args.splits));
  const Launch launch = find_launch(head_dim, kt, vt, options.ref_dequant);
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, launch != nullptr, op, ": the reference dequantization covers K and V ",
                    "both u4 or both u2, and u4c / u2c K with u4 / u2 V at head_dim 128");
  launch(args, grid, stream);
  LOWBIT_CUDA_CHECK_LAUNCH(op);
  if (args.splits > 1) {
    prefill_attention_split_merge(args, static_cast<int>(q.size(2)), max_q_len, stream);
    LOWBIT_CUDA_CHECK_LAUNCH(op);
  }
}

}  // namespace lowbit::cuda
