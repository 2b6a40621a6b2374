// Quantize-on-write into the paged KV cache on the GPU (layout in include/lowbit/kv/kv_cache.h).
// Integer K/V: per token per head, dynamic asymmetric (QServe §4.1): zero = min, scale =
// (max - min) / (2^bits - 1), q = clamp(rint((x - zero) / scale)), a constant row stores scale 0 and
// q 0. The arithmetic (IEEE f32 division, round half to even) is that of the CPU cache, so the two
// hold identical bytes. One warp per (token, head).
// rope_kv_write fuses the RoPE of q and k with this write: one launch instead of two per layer.
// Per-channel K (a KWindow): K rows go in f16 to the window slot of their block; a second launch
// quantizes each block whose last slot was written (the CPU rule of quantize_k_block_per_channel, on the
// same f16 rows, so the bytes match the CPU cache's).
#include <algorithm>
#include <type_traits>

#include "cuda/float_io.cuh"
#include "cuda/rope_turn.cuh"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/forward_kernels.h"

namespace lowbit::cuda {
namespace {

struct Side {  // one of K or V
  const void* src;
  ScalarType src_type;
  int64_t src_stride_t, src_stride_h;
  void* data;
  ScalarType cache_type;
  float* params;
  const int32_t* window_map;  // per-channel K: data is the f16 window, rows at the block's window slot
};

// The row a token's K/V goes to: its cache row, or for a windowed K the same row of its block's window
// slot (-1: the block has no slot; nothing is written).
__device__ inline int64_t side_row(const Side& s, int32_t slot, int h, int hkv, int block_size) {
  int64_t block = slot / block_size;
  if (s.window_map) {
    block = s.window_map[block];
    if (block < 0) return -1;
  }
  return (block * hkv + h) * block_size + slot % block_size;
}

__device__ void write_row(const Side& s, int64_t t, int h, int64_t row, int d) {
  const int lane = threadIdx.x % 32;
  const char* x = static_cast<const char*>(s.src) + (t * s.src_stride_t + h * s.src_stride_h) * float_bytes(s.src_type);
  if (s.cache_type == ScalarType::f32 || s.cache_type == ScalarType::f16 || s.cache_type == ScalarType::bf16) {
    void* out = static_cast<char*>(s.data) + row * d * float_bytes(s.cache_type);
    for (int i = lane; i < d; i += 32) store_any(out, s.cache_type, i, load_any(x, s.src_type, i));
    return;
  }
  float lo = INFINITY, hi = -INFINITY;
  for (int i = lane; i < d; i += 32) {
    const float v = load_any(x, s.src_type, i);
    lo = fminf(lo, v);
    hi = fmaxf(hi, v);
  }
  lo = -warp_max(-lo);
  hi = warp_max(hi);
  const int bits = s.cache_type == ScalarType::u8 ? 8 : s.cache_type == ScalarType::u4 ? 4 : 2;
  const float qmax = static_cast<float>((1 << bits) - 1);
  const float scale = __fdiv_rn(hi - lo, qmax);
  auto code = [&](int i) -> unsigned {
    const float q = scale > 0.f ? rintf(__fdiv_rn(load_any(x, s.src_type, i) - lo, scale)) : 0.f;
    return static_cast<unsigned>(fminf(fmaxf(q, 0.f), qmax));
  };
  if (lane == 0) {
    s.params[row * 2] = scale;
    s.params[row * 2 + 1] = lo;
  }
  uint8_t* out = static_cast<uint8_t*>(s.data);
  if (bits == 8) {
    for (int i = lane; i < d; i += 32) out[row * d + i] = static_cast<uint8_t>(code(i));
  } else if (bits == 4) {  // element 2i in the low nibble of byte i
    const int bytes = (d + 1) / 2;
    for (int b = lane; b < bytes; b += 32) {
      const unsigned hi_nibble = 2 * b + 1 < d ? code(2 * b + 1) : 0u;
      out[row * bytes + b] = static_cast<uint8_t>(code(2 * b) | (hi_nibble << 4));
    }
  } else {  // element 4i + j in bits 2j..2j+1 of byte i
    const int bytes = (d + 3) / 4;
    for (int b = lane; b < bytes; b += 32) {
      unsigned byte = 0;
      for (int j = 0; j < 4 && 4 * b + j < d; ++j) byte |= code(4 * b + j) << (2 * j);
      out[row * bytes + b] = static_cast<uint8_t>(byte);
    }
  }
}

__global__ void kv_write_kernel(Side k, Side v, const int32_t* slots, int64_t tokens, int64_t num_slots, int hkv,
                                int block_size, int d) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (warp >= tokens * hkv) return;
  const int64_t t = warp / hkv;
  const int h = static_cast<int>(warp % hkv);
  const int32_t slot = slots[t];
  if (slot < 0 || slot >= num_slots) return;  // padding; a slot past the cache is never written
  const int64_t k_row = side_row(k, slot, h, hkv, block_size);
  if (k_row >= 0) write_row(k, t, h, k_row, d);
  write_row(v, t, h, side_row(v, slot, h, hkv, block_size), d);
}

// Per-channel K: one block per (token, kv head); a token in the last slot of its block seals the block:
// per channel over the block's bs window rows, zero = min, scale = (max - min) / (2^bits - 1), codes
// rint((x - zero) / scale) clamped to [0, 2^bits - 1] (IEEE division, as the CPU), 8 / bits channels per
// byte (little-end first). A thread owns the channels of one byte.
template <int kBits>
__global__ void seal_k_blocks_kernel(const __half* window, const int32_t* window_map, const int32_t* slots,
                                     int64_t num_slots, uint8_t* codes, float* params, int hkv, int block_size,
                                     int d) {
  constexpr int kPer = 8 / kBits;
  constexpr float kQmax = static_cast<float>((1 << kBits) - 1);
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const int32_t slot = slots[t];
  if (slot < 0 || slot >= num_slots || slot % block_size != block_size - 1) return;
  const int64_t block = slot / block_size;
  const int32_t wslot = window_map[block];
  if (wslot < 0) return;
  const __half* x = window + (static_cast<int64_t>(wslot) * hkv + h) * block_size * d;
  float* scales = params + (block * hkv + h) * 2 * d;
  float* zeros = scales + d;
  const int row_bytes = d / kPer;
  uint8_t* out = codes + (block * hkv + h) * block_size * row_bytes;
  for (int c = threadIdx.x; c < row_bytes; c += blockDim.x) {  // channels kPer c .. kPer c + kPer - 1
    float lo[kPer], hi[kPer], sc[kPer];
    for (int e = 0; e < kPer; ++e) {
      const int ch = kPer * c + e;
      lo[e] = hi[e] = __half2float(x[ch]);
      for (int r = 1; r < block_size; ++r) {
        const float v = __half2float(x[static_cast<int64_t>(r) * d + ch]);
        lo[e] = fminf(lo[e], v);
        hi[e] = fmaxf(hi[e], v);
      }
      sc[e] = __fdiv_rn(hi[e] - lo[e], kQmax);
      scales[ch] = sc[e];
      zeros[ch] = lo[e];
    }
    for (int r = 0; r < block_size; ++r) {
      unsigned byte = 0;
      for (int e = 0; e < kPer; ++e) {
        const float v = __half2float(x[static_cast<int64_t>(r) * d + kPer * c + e]);
        const float q = sc[e] > 0.f ? rintf(__fdiv_rn(v - lo[e], sc[e])) : 0.f;
        byte |= static_cast<unsigned>(fminf(fmaxf(q, 0.f), kQmax)) << (kBits * e);
      }
      out[static_cast<int64_t>(r) * row_bytes + c] = static_cast<uint8_t>(byte);
    }
  }
}

// The K side of a write: the cache pool, or the f16 window of per-channel K.
void seal_k_blocks(const KWindow& window, const Tensor& slot_mapping, int64_t tokens, Tensor& k_data, Tensor& k_params,
                   cudaStream_t stream, const char* op) {
  const int hkv = static_cast<int>(k_data.size(1)), block_size = static_cast<int>(k_data.size(2));
  const int d = static_cast<int>(window.rows.size(3));
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, k_data.dtype() == ScalarType::u4 || k_data.dtype() == ScalarType::u2,
                    op, ": per-channel K needs a u4 or u2 cache, got ", name_of(k_data.dtype()));
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(hkv));
  auto kernel = k_data.dtype() == ScalarType::u4 ? seal_k_blocks_kernel<4> : seal_k_blocks_kernel<2>;
  kernel<<<grid, 64, 0, stream>>>(static_cast<const __half*>(window.rows.data_ptr()), window.map.data<int32_t>(),
                                  slot_mapping.data<int32_t>(), k_data.size(0) * block_size,
                                  static_cast<uint8_t*>(k_data.data_ptr()), k_params.data<float>(), hkv, block_size, d);
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

Side side_of(const Tensor& x, Tensor& data, Tensor& params, const KWindow& window = {}) {
  Side s{};
  s.src = x.data_ptr();
  s.src_type = x.dtype();
  s.src_stride_t = x.stride(0);
  s.src_stride_h = x.stride(1);
  if (window.defined()) {  // per-channel K: rows go to the f16 window first (sealed later)
    s.data = window.rows.data_ptr();
    s.cache_type = ScalarType::f16;
    s.window_map = window.map.data<int32_t>();
    return s;
  }
  s.data = data.data_ptr();
  s.cache_type = data.dtype();
  s.params = params.defined() ? params.data<float>() : nullptr;
  return s;
}

// RoPE of q and k (in place) and the cache write of the rotated k and of v. One block per token, one warp per row of
// it at a time: rows [0, hq) are q heads, [hq, hq + hkv) k heads, then hkv v heads. The token's cosines and sines
// are computed once into shared memory (double-precision sincos per row and pair ran a prefill's RoPE + KV write at
// ~0.7 TB/s); every row turns by the same f32 values as the rope kernel computes per pair, so the bits match it.
struct RopeKvArgs {
  void* q;
  ScalarType q_type;
  int64_t q_stride_t, q_stride_h;
  Side k, v;  // k.src is rotated in place, then read back by write_row
  const int32_t* positions;
  const int32_t* slots;
  int64_t tokens, num_slots;
  int hq, hkv, block_size, d, half;
  bool neox;
  double inv_freq[kMaxRopeHalf];
};

__global__ void rope_kv_write_kernel(RopeKvArgs a) {
  __shared__ float turn[2][kMaxRopeHalf];  // this token's cosines and sines
  const int64_t t = blockIdx.x;
  const int rows = a.hq + 2 * a.hkv, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const double pos = static_cast<double>(a.positions[t]);
  for (int i = threadIdx.x; i < a.half; i += blockDim.x) rope_angle(pos, a.inv_freq[i], turn[0][i], turn[1][i]);
  __syncthreads();
  const int32_t slot = a.slots[t];
  const bool write = slot >= 0 && slot < a.num_slots;  // padding; a slot past the cache is never written
  for (int r = static_cast<int>(threadIdx.x) / 32; r < rows; r += warps) {  // warp-uniform: whole warps loop
    if (r < a.hq + a.hkv) {
      const bool is_q = r < a.hq;
      const ScalarType type = is_q ? a.q_type : a.k.src_type;
      char* row = is_q ? static_cast<char*>(a.q) + (t * a.q_stride_t + r * a.q_stride_h) * float_bytes(type)
                       : static_cast<char*>(const_cast<void*>(a.k.src)) +
                             (t * a.k.src_stride_t + (r - a.hq) * a.k.src_stride_h) * float_bytes(type);
      for (int i = lane; i < a.half; i += 32) rope_turn_pair(row, type, turn[0][i], turn[1][i], i, a.half, a.neox);
      if (is_q) continue;
      // write_row re-reads the rotated k row, rounded to k's dtype as rope then kv_write would see it;
      // lanes read elements other lanes wrote, so order the warp's global stores first.
      __syncwarp();
    }
    if (!write) continue;
    const bool is_k = r < a.hq + a.hkv;
    const int h = is_k ? r - a.hq : r - a.hq - a.hkv;
    const Side& side = is_k ? a.k : a.v;
    const int64_t row = side_row(side, slot, h, a.hkv, a.block_size);
    if (row >= 0) write_row(side, t, h, row, a.d);
  }
}

// The fast path of rope_kv_write: f16 or bf16 rows of d = 64, 128 or 256 columns, rotated over the whole row, on
// 16-byte boundaries. A row is read once in 16-byte pieces by d / 8 lanes (two to four rows per warp at once), turned
// in registers (the neox partner piece sits in the lane d / 16 away), written back, and a k or v row is quantized from
// the same registers. The kernel above (any dtype, any rotary_dim) turns 2-byte pairs one row after another and
// re-reads the rotated k row from memory: it moves a prefill's rows at ~0.7 TB/s. Same bits as that kernel: the same
// cosines, the same turn (rope_turn_values), the k row rounded to its dtype before it is quantized, write_row's rule.
template <typename T>
constexpr ScalarType scalar_type_of() {
  return std::is_same_v<T, __half> ? ScalarType::f16 : ScalarType::bf16;
}

// Writes columns 8 piece .. 8 piece + 7 of cache row `row` from x; lo and hi are the whole row's min and max.
template <typename T, int kD>
__device__ void write_piece(const Side& s, int64_t row, int piece, const float* x, float lo, float hi) {
  if (s.cache_type == scalar_type_of<T>()) {
    uint4 raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) store_f32(e + i, x[i]);
    reinterpret_cast<uint4*>(static_cast<T*>(s.data) + row * kD)[piece] = raw;
    return;
  }
  if (s.cache_type == ScalarType::f32 || s.cache_type == ScalarType::f16 || s.cache_type == ScalarType::bf16) {
    void* out = static_cast<char*>(s.data) + row * kD * float_bytes(s.cache_type);
    for (int i = 0; i < 8; ++i) store_any(out, s.cache_type, 8 * piece + i, x[i]);
    return;
  }
  const int bits = s.cache_type == ScalarType::u8 ? 8 : s.cache_type == ScalarType::u4 ? 4 : 2;
  const float qmax = static_cast<float>((1 << bits) - 1);
  const float scale = __fdiv_rn(hi - lo, qmax);
  unsigned c[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float q = scale > 0.f ? rintf(__fdiv_rn(x[i] - lo, scale)) : 0.f;
    c[i] = static_cast<unsigned>(fminf(fmaxf(q, 0.f), qmax));
  }
  if (piece == 0) {
    s.params[row * 2] = scale;
    s.params[row * 2 + 1] = lo;
  }
  uint8_t* out = static_cast<uint8_t*>(s.data);
  if (bits == 8) {
    uint2 w;
    w.x = c[0] | c[1] << 8 | c[2] << 16 | c[3] << 24;
    w.y = c[4] | c[5] << 8 | c[6] << 16 | c[7] << 24;
    reinterpret_cast<uint2*>(out + row * kD)[piece] = w;
  } else if (bits == 4) {  // element 2i in the low nibble of byte i
    uint32_t w = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) w |= c[i] << (4 * i);
    reinterpret_cast<uint32_t*>(out + row * (kD / 2))[piece] = w;
  } else {  // element 4i + j in bits 2j..2j+1 of byte i
    uint32_t w = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) w |= c[i] << (2 * i);
    reinterpret_cast<uint16_t*>(out + row * (kD / 4))[piece] = static_cast<uint16_t>(w);
  }
}

template <typename T, int kLanes>  // kLanes = d / 8 lanes per row
__global__ void __launch_bounds__(256) rope_kv_write_rows16_kernel(RopeKvArgs a) {
  constexpr int kD = 8 * kLanes, kHalfLanes = kLanes / 2;
  __shared__ float turn[2][kD / 2];  // this token's cosines and sines
  const int64_t t = blockIdx.x;
  const double pos = static_cast<double>(a.positions[t]);
  for (int i = threadIdx.x; i < kD / 2; i += blockDim.x) rope_angle(pos, a.inv_freq[i], turn[0][i], turn[1][i]);
  __syncthreads();
  const int32_t slot = a.slots[t];
  const bool write = slot >= 0 && slot < a.num_slots;  // padding; a slot past the cache is never written
  const int piece = static_cast<int>(threadIdx.x) % kLanes, rows = a.hq + 2 * a.hkv;
  const int rows_per_pass = static_cast<int>(blockDim.x) / kLanes;
  for (int base = 0; base < rows; base += rows_per_pass) {  // the same trip count for every lane: shuffles below
    const int r = base + static_cast<int>(threadIdx.x) / kLanes;
    const bool live = r < rows, is_q = r < a.hq, is_k = !is_q && r < a.hq + a.hkv;
    const int h = is_q ? r : is_k ? r - a.hq : r - a.hq - a.hkv;
    const Side& side = is_k ? a.k : a.v;
    T* row = is_q ? static_cast<T*>(a.q) + t * a.q_stride_t + h * a.q_stride_h
                  : static_cast<T*>(const_cast<void*>(side.src)) + t * side.src_stride_t + h * side.src_stride_h;
    uint4 raw = live ? reinterpret_cast<const uint4*>(row)[piece] : make_uint4(0u, 0u, 0u, 0u);
    float x[8];
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = load_f32(e + i);
    float y[8];
    if (a.neox) {  // pairs (i, i + d/2): this piece and the one kHalfLanes lanes away
      uint4 other;
      other.x = __shfl_xor_sync(0xffffffffu, raw.x, kHalfLanes);
      other.y = __shfl_xor_sync(0xffffffffu, raw.y, kHalfLanes);
      other.z = __shfl_xor_sync(0xffffffffu, raw.z, kHalfLanes);
      other.w = __shfl_xor_sync(0xffffffffu, raw.w, kHalfLanes);
      const T* o = reinterpret_cast<const T*>(&other);
      const bool first = piece < kHalfLanes;
      const int c0 = 8 * (piece % kHalfLanes);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float p = load_f32(o + i);
        float y0, y1;
        rope_turn_values(first ? x[i] : p, first ? p : x[i], turn[0][c0 + i], turn[1][c0 + i], y0, y1);
        y[i] = first ? y0 : y1;
      }
    } else {  // GPT-J pairs (2i, 2i + 1) inside the piece: pair indices 4 piece .. 4 piece + 3
#pragma unroll
      for (int j = 0; j < 4; ++j)
        rope_turn_values(x[2 * j], x[2 * j + 1], turn[0][4 * piece + j], turn[1][4 * piece + j], y[2 * j], y[2 * j + 1]);
    }
    if (live && (is_q || is_k)) {
      uint4 out;
      T* oe = reinterpret_cast<T*>(&out);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        store_f32(oe + i, y[i]);
        x[i] = load_f32(oe + i);  // the k row is quantized as stored, rounded to T
      }
      reinterpret_cast<uint4*>(row)[piece] = out;
    }
    float lo = x[0], hi = x[0];
#pragma unroll
    for (int i = 1; i < 8; ++i) {
      lo = fminf(lo, x[i]);
      hi = fmaxf(hi, x[i]);
    }
#pragma unroll
    for (int o = kHalfLanes; o > 0; o >>= 1) {  // over the row's kLanes lanes only
      lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o));
      hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
    }
    if (live && !is_q && write) {
      const int64_t out_row = side_row(side, slot, h, a.hkv, a.block_size);
      if (out_row >= 0) write_piece<T, kD>(side, out_row, piece, x, lo, hi);
    }
  }
}

// Whether rope_kv_write can take the 16-byte kernel: one half-precision dtype for q, k and v, d = 64 / 128 / 256
// rotated whole, every row on a 16-byte boundary, the cache rows too.
bool rows16_fits(const RopeKvArgs& a, int64_t k_stride_last, int64_t v_stride_last, int64_t q_stride_last) {
  const ScalarType t = a.k.src_type;
  if ((t != ScalarType::f16 && t != ScalarType::bf16) || a.v.src_type != t || (a.q && a.q_type != t)) return false;
  if ((a.d != 64 && a.d != 128 && a.d != 256) || 2 * a.half != a.d) return false;
  const auto aligned = [](const void* p, int64_t st, int64_t sh, int64_t last) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 && st % 8 == 0 && sh % 8 == 0 && last == 1;
  };
  if (a.q && !aligned(a.q, a.q_stride_t, a.q_stride_h, q_stride_last)) return false;
  return aligned(a.k.src, a.k.src_stride_t, a.k.src_stride_h, k_stride_last) &&
         aligned(a.v.src, a.v.src_stride_t, a.v.src_stride_h, v_stride_last) &&
         reinterpret_cast<uintptr_t>(a.k.data) % 16 == 0 && reinterpret_cast<uintptr_t>(a.v.data) % 16 == 0;
}

void launch_rows16(const RopeKvArgs& a, cudaStream_t stream) {
  const int lanes = a.d / 8, rows = a.hq + 2 * a.hkv;
  const int warps = std::min(8, (rows * lanes + 31) / 32);  // Llama-3-8B: 48 rows of 16 lanes, 8 warps, 3 passes
  const dim3 grid(static_cast<unsigned>(a.tokens)), block(32 * warps);
  const bool half = a.k.src_type == ScalarType::f16;
  if (lanes == 8) {
    if (half) rope_kv_write_rows16_kernel<__half, 8><<<grid, block, 0, stream>>>(a);
    else rope_kv_write_rows16_kernel<__nv_bfloat16, 8><<<grid, block, 0, stream>>>(a);
  } else if (lanes == 16) {
    if (half) rope_kv_write_rows16_kernel<__half, 16><<<grid, block, 0, stream>>>(a);
    else rope_kv_write_rows16_kernel<__nv_bfloat16, 16><<<grid, block, 0, stream>>>(a);
  } else {
    if (half) rope_kv_write_rows16_kernel<__half, 32><<<grid, block, 0, stream>>>(a);
    else rope_kv_write_rows16_kernel<__nv_bfloat16, 32><<<grid, block, 0, stream>>>(a);
  }
}

}  // namespace

void rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor& positions, const std::vector<double>& inv_freq,
                   bool neox, Tensor& k_data, Tensor& v_data, Tensor& k_params, Tensor& v_params,
                   const Tensor& slot_mapping, cudaStream_t stream, const KWindow& window) {
  constexpr const char* op = "rope_kv_write";
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, !inv_freq.empty() && inv_freq.size() <= size_t(kMaxRopeHalf), op,
                    ": rotary_dim ", 2 * inv_freq.size(), " has no GPU kernel (supported: 2..", 2 * kMaxRopeHalf, ")");
  const int64_t tokens = k.size(0);
  const int hq = q.defined() ? static_cast<int>(q.size(1)) : 0;
  const int hkv = static_cast<int>(k_data.size(1)), block_size = static_cast<int>(k_data.size(2));
  if (tokens == 0) return;
  LOWBIT_CHECK(tokens < (1LL << 31), op, ": too many tokens (", tokens, ")");
  // Up to 16 warps per token, each turning and writing about 3 of Llama's 48 rows (32 q, 8 k, 8 v heads).
  const int rows = hq + 2 * hkv, warps = std::min(16, (rows + 2) / 3);
  RopeKvArgs a{};
  if (q.defined()) {
    a.q = q.data_ptr();
    a.q_type = q.dtype();
    a.q_stride_t = q.stride(0);
    a.q_stride_h = q.stride(1);
  }
  a.k = side_of(k, k_data, k_params, window);
  a.v = side_of(v, v_data, v_params);
  a.positions = positions.data<int32_t>();
  a.slots = slot_mapping.data<int32_t>();
  a.tokens = tokens;
  a.num_slots = k_data.size(0) * block_size;
  a.hq = hq;
  a.hkv = hkv;
  a.block_size = block_size;
  a.d = static_cast<int>(k.size(2));
  a.half = static_cast<int>(inv_freq.size());
  a.neox = neox;
  for (size_t i = 0; i < inv_freq.size(); ++i) a.inv_freq[i] = inv_freq[i];
  if (rows16_fits(a, k.stride(2), v.stride(2), q.defined() ? q.stride(2) : 1))
    launch_rows16(a, stream);
  else
    rope_kv_write_kernel<<<static_cast<unsigned>(tokens), 32 * warps, 0, stream>>>(a);
  LOWBIT_CUDA_CHECK_LAUNCH(op);
  if (window.defined()) seal_k_blocks(window, slot_mapping, tokens, k_data, k_params, stream, op);
}

void kv_write(const Tensor& k, const Tensor& v, Tensor& k_data, Tensor& v_data, Tensor& k_params, Tensor& v_params,
              const Tensor& slot_mapping, cudaStream_t stream, const KWindow& window) {
  const int64_t tokens = k.size(0);
  const int hkv = static_cast<int>(k_data.size(1)), block_size = static_cast<int>(k_data.size(2));
  const int d = static_cast<int>(k.size(2));
  if (tokens == 0) return;
  const int64_t threads = tokens * hkv * 32;
  constexpr int kThreads = 128;
  kv_write_kernel<<<static_cast<unsigned>((threads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      side_of(k, k_data, k_params, window), side_of(v, v_data, v_params), slot_mapping.data<int32_t>(), tokens,
      k_data.size(0) * block_size, hkv, block_size, d);
  LOWBIT_CUDA_CHECK_LAUNCH("kv_write");
  if (window.defined()) seal_k_blocks(window, slot_mapping, tokens, k_data, k_params, stream, "kv_write");
}

}  // namespace lowbit::cuda
