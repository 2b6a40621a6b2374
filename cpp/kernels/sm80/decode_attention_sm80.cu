// Decode attention over the paged KV cache (one query token per sequence), K/V in f16, u8, u4 or u2:
// argument checks, the split-KV plan, the launch of the (head_dim, K, V) instance from the generated
// table (decode_attention_launch.h; the kernel is in decode_attention_sm80.cuh) and the merge of the
// splits (flash-decoding; decode_merge_sm80.cuh).
#include <cuda_fp16.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "cuda/pdl.cuh"
#include "kernels/sm80/decode_attention_launch.h"
#include "kernels/sm80/decode_merge_sm80.cuh"
#include "kernels/sm80/instances/attention_instance_list.h"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/kernels.h"

namespace lowbit::cuda {
namespace {

using decode_attn::kTile;
constexpr int kMaxGroup = 16;  // query heads per kv head: slices of 8 (the mma's n)
constexpr int kMinSplitTokens = 512;  // the split-size heuristic's floor for long contexts (see decode_attention)

// Resident blocks per SM of an instance on `device`, asked once per (instance, device).
int blocks_per_sm(const DecodeAttnEntry& e, int device) {
  static std::mutex mu;
  static std::map<std::pair<const DecodeAttnEntry*, int>, int> known;
  std::lock_guard<std::mutex> lock(mu);
  auto it = known.find({&e, device});
  if (it == known.end()) it = known.emplace(std::make_pair(&e, device), e.blocks_per_sm ? e.blocks_per_sm() : 0).first;
  return it->second;
}

KvType kv_type_of(const Tensor& t, const char* op, const char* arg, bool per_channel = false) {
  KvType kt = KvType::f16;
  if (!lowbit::cuda::kv_type_of(t.dtype(), kt, per_channel))
    LOWBIT_NOT_SUPPORTED(op, ": argument '", arg, "' must be ", per_channel ? "u4 or u2 (per-channel K)" : "f16, u8, u4 or u2",
                         ", got ", name_of(t.dtype()));
  return kt;
}

// The compiled instance for (head_dim, K, V); a loud error when there is none or the build left it out.
const DecodeAttnEntry& find_instance(int d, KvType kt, KvType vt, ScalarType k_dtype, ScalarType v_dtype, const char* op) {
  for (int i = 0; i < kDecodeAttnTableSize; ++i) {
    const DecodeAttnEntry& e = kDecodeAttnTable[i];
    if (e.head_dim == d && e.k == kt && e.v == vt) return e;
  }
  const bool per_channel = kv_per_channel_type(kt);
  const InstanceState s = instance_state(kDecodeAttnInstances, d, k_dtype, v_dtype, per_channel);
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, s != InstanceState::not_built, op, ": the instance for head_dim ", d,
                    " k=", name_of(k_dtype), per_channel ? " (per channel)" : "", " v=", name_of(v_dtype),
                    " is not built (", kAttnAllInstancesHint, ")");
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, s != InstanceState::none || (k_dtype != ScalarType::u2 && v_dtype != ScalarType::u2),
                    op, ": 2-bit K/V (k=", name_of(k_dtype), per_channel ? " per channel" : "", " v=", name_of(v_dtype),
                    ") has instances for head_dim 64 and 128 only, got ", d);
  LOWBIT_NOT_SUPPORTED(op, ": head_dim ", d, " has no kernel (supported: ", head_dims_of(kDecodeAttnInstances), ")");
}

}  // namespace

void decode_attention(const Tensor& q, const Tensor& k_data, const Tensor& v_data, const Tensor& k_params,
                      const Tensor& v_params, const Tensor& block_tables, const Tensor& seq_lens, int max_seq_len,
                      float scale, Tensor& out, int split_tokens, cudaStream_t stream, const KWindow& window) {
  const char* op = "decode_attention";
  check_cuda_tensor(q, op, "q");
  check_dtype(q, ScalarType::f16, op, "q");
  check_dim(q, 3, op, "q");
  LOWBIT_CHECK(q.stride(2) == 1, op, ": argument 'q' needs unit stride in the last dim");
  const int64_t batch = q.size(0), hq = q.size(1), d = q.size(2);
  check_same_device(k_data, q, op, "k_data");
  check_same_device(v_data, q, op, "v_data");
  check_dim(k_data, 4, op, "k_data");
  const int64_t blocks = k_data.size(0), hkv = k_data.size(1), bs = k_data.size(2);
  check_shape(k_data, {blocks, hkv, bs, d}, op, "k_data");
  check_shape(v_data, {blocks, hkv, bs, d}, op, "v_data");
  check_contiguous(k_data, op, "k_data");
  check_contiguous(v_data, op, "v_data");
  const bool per_channel = window.defined();
  const KvType kt = kv_type_of(k_data, op, "k_data", per_channel), vt = kv_type_of(v_data, op, "v_data");
  const DecodeAttnEntry& instance = find_instance(static_cast<int>(d), kt, vt, k_data.dtype(), v_data.dtype(), op);
  if (per_channel) {
    check_same_device(k_params, q, op, "k_params");
    check_dtype(k_params, ScalarType::f32, op, "k_params");
    check_shape(k_params, {blocks, hkv, 2, d}, op, "k_params");
    check_contiguous(k_params, op, "k_params");
    check_same_device(window.rows, q, op, "window.rows");
    check_dtype(window.rows, ScalarType::f16, op, "window.rows");
    check_dim(window.rows, 4, op, "window.rows");
    check_shape(window.rows, {window.rows.size(0), hkv, bs, d}, op, "window.rows");
    check_contiguous(window.rows, op, "window.rows");
    check_same_device(window.map, q, op, "window.map");
    check_dtype(window.map, ScalarType::s32, op, "window.map");
    check_shape(window.map, {blocks}, op, "window.map");
    LOWBIT_CHECK(bs % kTile == 0, op, ": per-channel K needs a block size that is a multiple of ", kTile, ", got ", bs);
  } else if (kt != KvType::f16) {
    check_same_device(k_params, q, op, "k_params");
    check_dtype(k_params, ScalarType::f32, op, "k_params");
    check_shape(k_params, {blocks, hkv, bs, 2}, op, "k_params");
    check_contiguous(k_params, op, "k_params");
  }
  if (vt != KvType::f16) {
    check_same_device(v_params, q, op, "v_params");
    check_dtype(v_params, ScalarType::f32, op, "v_params");
    check_shape(v_params, {blocks, hkv, bs, 2}, op, "v_params");
    check_contiguous(v_params, op, "v_params");
  }
  LOWBIT_CHECK(hkv > 0 && hq % hkv == 0, op, ": q heads (", hq, ") must be a multiple of kv heads (", hkv, ")");
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, hq / hkv <= kMaxGroup, op, ": GQA group of ", hq / hkv,
                    " query heads per kv head has no kernel (at most ", kMaxGroup, ")");
  check_same_device(block_tables, q, op, "block_tables");
  check_dtype(block_tables, ScalarType::s32, op, "block_tables");
  check_dim(block_tables, 2, op, "block_tables");
  LOWBIT_CHECK(block_tables.size(0) == batch, op, ": argument 'block_tables' has ", block_tables.size(0),
               " rows, expected one per sequence (", batch, ")");
  check_contiguous(block_tables, op, "block_tables");
  check_same_device(seq_lens, q, op, "seq_lens");
  check_dtype(seq_lens, ScalarType::s32, op, "seq_lens");
  check_shape(seq_lens, {batch}, op, "seq_lens");
  const int64_t max_blocks = block_tables.size(1);
  LOWBIT_CHECK(max_seq_len >= 0 && max_seq_len <= max_blocks * bs, op, ": max_seq_len ", max_seq_len,
               " does not fit the block table (", max_blocks, " blocks of ", bs, " tokens)");
  check_same_device(out, q, op, "out");
  check_dtype(out, ScalarType::f16, op, "out");
  check_shape(out, {batch, hq, d}, op, "out");
  LOWBIT_CHECK(out.stride(2) == 1, op, ": argument 'out' needs unit stride in the last dim");
  LOWBIT_CHECK(split_tokens >= 0, op, ": split_tokens must be >= 0 (0: chosen here), got ", split_tokens);
  if (batch == 0) return;

  const int dev = q.device().index;
  LOWBIT_CUDA_CHECK(op, cudaSetDevice(dev));
  const int64_t sms = multiprocessor_count(dev);
  const int64_t slots = std::max(1, blocks_per_sm(instance, dev)) * sms;  // resident blocks of one wave
  if (split_tokens == 0) {
    // Splits long enough that a block's fixed costs (query and page loads, merging its warps, writing partials) stay
    // small: at least min(512, L/16) tokens (and 64). How many: when one split of every (sequence, kv head, slice)
    // fills at most half of the resident block slots (small batches), as many splits as make one whole wave of the
    // instance's resident blocks (the ceiling of 4 blocks per SM, the rule before, overshot into a second, mostly
    // empty wave: 16 x 32K ran 5 splits = 640 blocks on 528 slots); otherwise about one wave at 4 blocks per SM
    // (2 splits at B=64 L=8K, measured fastest on an H100 by tools/bench_gpu_attention.py --split-sweep; a short
    // context, L ~ 500 at batch 1, wants splits of 64).
    //
    // The ring instances of per-token u4 and u2 K and V at head_dim 128 differ (measured on an H200, kernel alone,
    // docs/gpu_notes.md "what bounds the 4-bit ring"): u4/u4 streams about as fast from 2 blocks per SM as from 4
    // (ncu: its loop waits on the memory side, not on its warps), u2/u2 needs the 4. So:
    // - u4/u4 at small batches takes half a wave (2 blocks per SM, each twice as long: half the per-block start-up
    //   and drain) where whole splits fill at least 90% of it: 1 x 128K 51.3 -> 47.8 us, 16 x 32K 161.7 -> 157.0,
    //   4 x 128K 161.6 -> 157.6. u2/u2 lost 3-11% that way (its loop is bound by its instructions): it keeps the
    //   whole wave.
    // - both take one split where one split's blocks fill at least 90% of a wave (64 x 8K: 512 blocks on 528 slots)
    //   instead of two: u4/u4 164.1 -> 163.0 us, u2/u2 118.5 -> 116.2, and no split merge (4.3 us).
    const int64_t blocks_per_split = batch * hkv * ((hq / hkv + 7) / 8);  // (sequence, kv head, slice)
    const bool ring = d == 128 && (kt == KvType::u4 || kt == KvType::u2) && vt == kt;
    const bool half_wave = d == 128 && kt == KvType::u4 && vt == KvType::u4;
    const int64_t half = slots / 2 / blocks_per_split;  // whole splits of (sequence, kv head, slice) in half a wave
    int64_t splits_wanted;
    if (half_wave && half >= 1 && 10 * half * blocks_per_split >= 9 * (slots / 2)) {
      splits_wanted = half;
    } else if (2 * blocks_per_split <= slots) {
      splits_wanted = std::max<int64_t>(1, slots / blocks_per_split - (per_channel ? 1 : 0));  // + the window split
    } else if (ring && 10 * blocks_per_split >= 9 * slots && blocks_per_split <= slots) {
      splits_wanted = 1;
    } else {
      splits_wanted = std::max<int64_t>(1, (4 * sms + blocks_per_split - 1) / blocks_per_split);
    }
    const int64_t floor_tokens = std::clamp<int64_t>((max_seq_len + 15) / 16, 64, kMinSplitTokens);
    const int64_t per_split = std::max<int64_t>((max_seq_len + splits_wanted - 1) / splits_wanted, floor_tokens);
    split_tokens = static_cast<int>((std::min<int64_t>(per_split, max_seq_len + kTile) + kTile - 1) / kTile * kTile);
  }
  // Per-channel K: splits start on block boundaries (each warp walks whole blocks).
  if (per_channel) split_tokens = static_cast<int>((split_tokens + bs - 1) / bs * bs);
  const int splits = std::max(1, (max_seq_len + split_tokens - 1) / split_tokens);
  const int total_splits = splits + (per_channel ? 1 : 0);  // + the window keys' split

  DecodeAttnArgs p{};
  p.q = q.data<__half>();
  p.k = static_cast<const uint8_t*>(k_data.data_ptr());
  p.v = static_cast<const uint8_t*>(v_data.data_ptr());
  p.k_params = kt == KvType::f16 ? nullptr : k_params.data<float>();
  p.num_splits = total_splits;
  if (per_channel) {
    p.k_window = static_cast<const __half*>(window.rows.data_ptr());
    p.window_map = window.map.data<int>();
  }
  p.v_params = vt == KvType::f16 ? nullptr : v_params.data<float>();
  p.block_tables = block_tables.data<int>();
  p.seq_lens = seq_lens.data<int>();
  p.out = out.data<__half>();
  p.q_stride_b = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.out_stride_b = out.stride(0);
  p.out_stride_h = out.stride(1);
  p.hq = static_cast<int>(hq);
  p.hkv = static_cast<int>(hkv);
  p.group = static_cast<int>(hq / hkv);
  p.slices = (p.group + 7) / 8;
  p.block_size = static_cast<int>(bs);
  p.block_shift = -1;
  for (int sh = 0; sh < 31; ++sh)
    if ((int64_t{1} << sh) == bs) p.block_shift = sh;
  p.max_blocks = static_cast<int>(max_blocks);
  p.split_tokens = split_tokens;
  p.tile_in_one_page = bs % kTile == 0 && split_tokens % kTile == 0;
  p.scale = scale;
  // u4/u4's ring fed by bulk copies (sm_90; decode_attention_sm80.cuh ring_bulk()) where the grid fills at least 90%
  // of a wave of resident blocks and at most two waves. Measured on an H200 against the lanes' copies, kernel alone,
  // same process (docs/gpu_notes.md "the ring fed by bulk copies"): one or two such waves 2-8% faster (64 x 8K one split
  // 162.5 -> 156.5 us, split 4096 165.2 -> 161.6; 1 x 128K split 2000 51.5 -> 47.6; 16 x 32K split 8192 163.2 ->
  // 157.3), four waves of short blocks (256 x 1.5K) 1.2% slower, half a wave (the plan's small-batch splits) 10-12%
  // slower: there the lanes' copies stay.
  const int64_t grid_blocks = batch * hkv * p.slices * total_splits;
  p.ring_bulk = d == 128 && kt == KvType::u4 && vt == KvType::u4 && 10 * grid_blocks >= 9 * slots &&
                grid_blocks <= 2 * slots;
  Tensor partials;  // one allocation: the splits' outputs [B, Hq, splits, D], then their (max, sum) [B, Hq, splits, 2]
  if (total_splits > 1) {
    const int64_t out_elems = batch * hq * total_splits * d;
    partials = Tensor::empty({out_elems + batch * hq * total_splits * 2}, ScalarType::f32, q.device());
    p.part_out = partials.data<float>();
    p.part_stats = p.part_out + out_elems;  // 16-byte aligned: d is a multiple of 16
  }
  const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(hkv * p.slices),
                  static_cast<unsigned>(total_splits));
  instance.launch(p, grid, stream);
  LOWBIT_CUDA_CHECK_LAUNCH(op);
  if (total_splits > 1) {
    // A plain launch (pdl false): the merge as a programmatic dependent is built but its gain is not measured yet
    // (tools/bench_decode_merge.cu times both in a graph).
    const int spread = decode_merge::merge_spread(batch * hq, static_cast<int>(d), multiprocessor_count(dev));
    const float2* stats = reinterpret_cast<const float2*>(p.part_stats);
    if (spread == 1) {
      decode_merge::combine_splits_kernel<<<dim3(batch, hq), decode_merge::kCombineThreads, 0, stream>>>(
          p.part_out, stats, total_splits, p.hq, static_cast<int>(d), p.out, p.out_stride_b, p.out_stride_h, false);
    } else {
      decode_merge::combine_splits_spread_kernel<<<dim3(batch, hq, spread), decode_merge::kMergeThreads, 0, stream>>>(
          p.part_out, stats, total_splits, p.hq, static_cast<int>(d), p.out, p.out_stride_b, p.out_stride_h, false);
    }
    LOWBIT_CUDA_CHECK_LAUNCH(op);
  }
}

}  // namespace lowbit::cuda
