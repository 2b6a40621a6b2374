// Causal paged prefill attention for Hopper (sm_90a) on wgmma: f16 queries and outputs, head_dim 64 or 128,
// K and V each f16, u8, u4 or u2 with per-token (scale, zero) f32 parameters (include/lowbit/kv/kv_cache.h), or K
// per channel (u4c / u2c: one (scale, zero) per channel per block, the newest keys in an f16 window; below).
//
// A CTA owns 128 query rows of one (sequence, query head) and walks key tiles of 128 up to the last key its last
// row sees; with an integer per-token cache the launch may pack the query heads of one kv head into it (kPack: 128 /
// G positions x G heads). Three warpgroups (FlashAttention-3's split of work, written for the paged cache):
//   - warpgroup 0, the producer: thread p looks up the page of key row p of a tile (any block size); each warp
//     then reads its 32 rows together, whole rows per instruction. f16 rows go straight into the tile by
//     cp.async (where a 16-row run is one page's, one row lookup per run: copy_f16_rows); u8/u4/u2 rows are loaded
//     into registers, dequantized (u4/u2 in f32, code * scale + zero rounded once to f16: the same values as the
//     mma.sync kernel's; u8 as f16 pairs: store_u8_codes_f16) and stored. Tiles go through kStages stages, the producer
//     running ahead as far as the stages allow. It publishes a tile on the stage's `full` barrier without waiting:
//     cp.async completion arrives there by itself, and the dequantized stores arrive after a proxy fence (so
//     wgmma's async reads see them).
//   - warpgroups 1 and 2, the consumers, 64 query rows each (one wgmma m64):
//       S[64, 128] = Q · Kᵀ     wgmma m64n128k16, Q and K from shared memory (K-major, 128-byte swizzle)
//       online softmax per row in f32, log2 domain; the causal mask only where a tile reaches past a row
//       O[64, D] += P · V       wgmma with P from registers (the S accumulators rounded to f16: the A
//                               fragment layout is the accumulator's) and V from shared memory read
//                               MN-major (the transpose bit), so K and V tiles share one layout; at
//                               head_dim 128 one m64n128k16 per 16 keys spans both column blocks
//     and release the stage on its `empty` barrier. Each round of a warpgroup issues Q·Kᵀ of this tile and P·V of
//     the previous one, runs this tile's softmax while that P·V runs, and releases the previous tile; the two
//     warpgroups take turns issuing (named barriers), so one's softmax also overlaps the other's MMAs
//     (FlashAttention-3's ping-pong).
// Per-channel K (u4c / u2c; the format and the window rule as in prefill_attention_tc_sm80.cuh): a query at
// position pos sees keys [0, codes_end(pos)) as codes (dequantized with the per-channel scale and zero of their
// block) and [codes_end(pos), pos] (its own, unsealed block) as f16 window rows. A key tile that some row of the
// CTA sees in each view (near the diagonal) goes through the pipeline twice, as two "views" of the tile: the same
// V tile with K as dequantized codes, then with K as window rows, and the consumers mask each view to the keys
// their rows see in it (complementary, so the online softmax sums every key once). The other tiles pass once, as
// codes. The plan of views (ChannelPlan) is the CTA's: producer and consumers walk the same list of stages.
// Every tile in shared memory is [rows][D] f16 as D/64 column blocks of [rows][64] (128 bytes per row, 16-byte
// chunks XOR-swizzled by row % 8): the canonical 128B-swizzle layout wgmma's descriptors read, for Q and K along
// K (head_dim) and for V along N (head_dim again).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/sm80/attention_math.cuh"
#include "kernels/sm80/kv_type.cuh"
#include "kernels/sm80/prefill_attention_tc_launch.h"  // PrefillTcArgs: the same arguments as the mma.sync kernel
#include "kernels/sm90/prefill_split_plan.h"
#include "kernels/sm90/sm90_common.cuh"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda {
namespace prefill_sm90 {

constexpr int kRows = 128;    // query rows per CTA
constexpr int kKeys = 128;    // keys per tile
constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
constexpr int kStages = 3;
// Registers per thread after setmaxnreg. The launch gives every thread 168 (65536 / 384, rounded down to 8); the
// warpgroups may only trade them: a larger total would block setmaxnreg.inc forever.
constexpr int kProducerRegs = 88, kConsumerRegs = 208;
static_assert(kProducerRegs + 2 * kConsumerRegs <= 3 * (65536 / kThreads / 8 * 8), "more registers than launched");
constexpr float kNoScore = -1e30f;  // finite "minus infinity": exp2(kNoScore - m) underflows to 0

template <int D>
struct Layout {
  static constexpr int kBlocks = D / 64;               // 128-byte column blocks of a row
  static constexpr int kQBlockBytes = kRows * 128;      // one column block of the Q tile
  static constexpr int kTileBlockBytes = kKeys * 128;   // one column block of a K or V tile
  static constexpr int kQBytes = kBlocks * kQBlockBytes;
  static constexpr int kTileBytes = kBlocks * kTileBlockBytes;
  static constexpr int kStageBytes = 2 * kTileBytes;  // K then V
  static constexpr int kBarrierOffset = kQBytes + kStages * kStageBytes;
  static constexpr int kSmemBytes = 1024 + kBarrierOffset + (1 + 2 * kStages) * 8;  // + 1024: alignment slack
  static constexpr int kPlanBytes = 32;  // the ChannelPlan's words after the barriers; 6: its views' end, 7: t_begin
};

// Byte offset of 16-byte chunk c (8 halves of the row) of row r in a [rows][D] tile of column blocks.
template <int kBlockBytes>
__device__ __forceinline__ uint32_t chunk_offset(int r, int c) {
  return (c >> 3) * kBlockBytes + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

#ifdef LOWBIT_SM90_DEVICE
using namespace sm90;

using attn_math::code_f32;
using attn_math::pack_half2;

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {  // zeros when !valid
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async16_all(uint32_t dst, const void* src) {  // the whole 16 bytes, no zero-fill
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
// Generic-proxy writes of this thread (st.shared, landed cp.async) made visible to wgmma's async-proxy reads.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Arrives on `bar` once every cp.async this thread issued so far has landed (the thread does not wait): the
// producer publishes a tile without holding it back until the next one is in flight.
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// Descriptor of a 128B-swizzled operand: 8-row groups 1024 bytes apart. For K-major operands (Q, K) the
// leading offset is unused; for V read MN-major it is the distance between 64-wide column blocks: a wgmma of
// n = 64 reads one column block, so that offset is unused too and set to the 8-row group stride like the rest;
// the n = 128 P·V at head_dim 128 sets it to the column block's size (pv128_lo).
// The high word (the stride, bits 32-45, and the swizzle mode, bits 62-63) is the same for every operand, and the
// low word is address / 16 (bits 0-13) plus the leading offset (bits 16-29): a descriptor of base + offset is the
// base's low word + offset / 16 (shared addresses stay below 2^18), so each wgmma's descriptor costs one add rather
// than being rebuilt from its address (that was about 8 instructions per wgmma, 24 wgmmas a tile).
constexpr uint32_t kDescHi = (1024 >> 4) | (1u << 30);
__device__ __forceinline__ uint32_t desc_lo(uint32_t addr) { return ((addr & 0x3FFFF) >> 4) | ((1024 >> 4) << 16); }
__device__ __forceinline__ uint64_t desc_at(uint32_t lo, uint32_t byte_offset) {
  return (static_cast<uint64_t>(kDescHi) << 32) | (lo + (byte_offset >> 4));
}
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) { return desc_at(desc_lo(addr), 0); }

// S += Q · Kᵀ for one k16 step (64 rows x 128 keys), both operands from shared memory.
__device__ __forceinline__ void wgmma_qk(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " LOWBIT_REGS64 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : LOWBIT_ACC64("+f", d)
      : "l"(da), "l"(db), "r"(accumulate));
}
// O[:, 64-column block] += P · V for one k16 step (16 keys): P from registers, V MN-major (transpose bit set).
__device__ __forceinline__ void wgmma_pv(float (&d)[32], const uint32_t* a, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " LOWBIT_REGS32 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : LOWBIT_ACC32("+f", d, 0)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
// O[:, 0:128] += P · V for one k16 step at head_dim 128: both 64-column blocks of V in one wgmma. Read MN-major,
// V's 64-wide swizzle atoms along N are a column block (kTileBlockBytes) apart: the descriptor's leading offset
// (bits 16-29) says so, the stride stays the 8-key group's 1024 bytes (pv128_lo). The accumulators are the two
// n64 ones' side by side (4j + e is column 8j + 2 (lane % 4) + e % 2 either way).
__device__ __forceinline__ void wgmma_pv128(float (&d)[64], const uint32_t* a, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " LOWBIT_REGS64 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : LOWBIT_ACC64("+f", d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
template <int kBlockBytes>
__device__ __forceinline__ uint32_t pv128_lo(uint32_t lo) {  // desc_lo's leading offset 1024 -> kBlockBytes
  return lo + (((kBlockBytes >> 4) - (1024 >> 4)) << 16);
}

using sm90::fence_regs;

// The consumer warpgroups' turns (named barriers 2 and 3 over their 256 threads; 0 is __syncthreads').
__device__ __forceinline__ void named_sync(int id) { asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory"); }
__device__ __forceinline__ void named_arrive(int id) { asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory"); }

// ---- producer -------------------------------------------------------------------------------------------

// Cache row (page looked up) of key `pos` of kv head kvh.
__device__ __forceinline__ int64_t cache_row(const PrefillTcArgs& a, const int32_t* pages, int kvh, int pos) {
  return (static_cast<int64_t>(pages[pos / a.block_size]) * a.hkv + kvh) * a.block_size + pos % a.block_size;
}

// The f16 sides of a tile (K if kK, V if kV). Thread p of the producer owns tile row p, whose cache row it looked
// up (`row`, -1 past kv_len). A warp's 32 rows are copied by the warp together, each cp.async instruction covering
// whole rows (lane l takes 16-byte chunk l % (D / 8) of row l / (D / 8) of the group, its cache row by shuffle),
// so every instruction reads full 32-byte sectors; one row per thread read a half sector of each of 32 rows per
// instruction and fetched every sector from L2 twice.
//
// Runs (`runs16`: the block size is a multiple of 16, so every 16-row run of a tile, which starts 16-aligned, lies in
// one page as consecutive cache rows): where all 32 rows of the warp are in the cache, a lane looks up two rows (the
// first of each run it copies from) and every further copy is that address plus a constant, the destination's
// swizzle a constant XOR: about 1 instruction per cp.async instead of 6-7 (the shuffle, the 64-bit address, the
// zero-fill size and the swizzle per row), which the producer's warps had spent beside the consumers' on each
// scheduler. Rows past kv_len (the last tile) and other block sizes take the general path.
template <int D, bool kK, bool kV, typename Row>
__device__ __forceinline__ void copy_f16_rows(const uint8_t* k, const uint8_t* v, uint32_t k_tile, uint32_t v_tile,
                                              int p, Row row, bool runs16) {
  constexpr int kChunks = D / 8, kRowsPerCopy = 32 / kChunks;
  using L = Layout<D>;
  const int lane = p & 31, c = lane % kChunks, warp_row0 = p & ~31;
  if (runs16 && __all_sync(0xffffffffu, row >= 0)) {
    const int rr = lane / kChunks;  // rows rr + i of each run, i a multiple of kRowsPerCopy (so rr + i = rr | i)
    const uint32_t dst0 = (c >> 3) * L::kTileBlockBytes + (warp_row0 + rr) * 128;
    const uint32_t x = (c & 7) ^ rr;  // the swizzle of row rr; row rr + i's is x ^ (i & 7)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t src_row = __shfl_sync(0xffffffffu, row, 16 * h + rr);
      const int64_t offset = src_row * (D * 2) + 16 * c;
#pragma unroll
      for (int i = 0; i < 16; i += kRowsPerCopy) {
        const uint32_t dst = dst0 + (16 * h + i) * 128 + ((x ^ (i & 7)) << 4);
        if constexpr (kK) cp_async16_all(k_tile + dst, k + offset + i * (D * 2));
        if constexpr (kV) cp_async16_all(v_tile + dst, v + offset + i * (D * 2));
      }
    }
    return;
  }
#pragma unroll 4
  for (int i = 0; i < 32; i += kRowsPerCopy) {
    const int rr = i + lane / kChunks;  // the group's row this lane copies a chunk of
    const int64_t src_row = __shfl_sync(0xffffffffu, row, rr);
    const bool valid = src_row >= 0;
    const int64_t offset = (valid ? src_row : 0) * (D * 2) + 16 * c;
    const uint32_t dst = chunk_offset<L::kTileBlockBytes>(warp_row0 + rr, c);
    if constexpr (kK) cp_async16(k_tile + dst, k + offset, valid);
    if constexpr (kV) cp_async16(v_tile + dst, v + offset, valid);
  }
}

// The codes of one integer side (K or V) of a tile, read the same way as copy_f16_rows: each load instruction of a
// warp covers whole rows of codes (lane l takes 16-byte vector l % kVecs of row l / kVecs of the group), the row's
// cache index by shuffle from the thread that owns it. They are loaded into registers (load_codes) ahead of the
// stage they go to, then dequantized into it (store_codes).
template <int D, KvType T>
struct TileCodes {
  static constexpr int kBits = kv_bits<T>(), kRowBytes = D * kBits / 8, kVecs = kRowBytes / 16;
  static constexpr int kRowsPerLoad = 32 / kVecs, kChunksPerVec = 16 / kBits;  // a vector holds 128 / kBits dims
  static_assert(kRowBytes % 16 == 0 && 32 % kVecs == 0, "rows of codes are read as 16-byte vectors");
  uint4 w[kVecs];  // load i: this lane's vector of the group's row i * kRowsPerLoad + lane / kVecs
  float2 own;      // scale and zero of this thread's own row (0, 0 past kv_len)
};

template <int D, KvType T>
__device__ __forceinline__ void load_codes(TileCodes<D, T>& codes, const uint8_t* data, const float* params, int p,
                                           int64_t row) {
  using C = TileCodes<D, T>;
  const int lane = p & 31, vec = lane % C::kVecs;
  codes.own = row >= 0 ? __ldg(reinterpret_cast<const float2*>(params) + row) : make_float2(0.f, 0.f);
#pragma unroll  // every load in flight at once
  for (int i = 0; i < C::kVecs; ++i) {
    const int64_t src_row = __shfl_sync(0xffffffffu, row, i * C::kRowsPerLoad + lane / C::kVecs);
    codes.w[i] = src_row >= 0 ? __ldg(reinterpret_cast<const uint4*>(data + src_row * C::kRowBytes) + vec)
                              : make_uint4(0, 0, 0, 0);
  }
}

// u8 codes as f16 pairs: a byte permute onto 0x64 makes two codes the halves 1024 + c, one f16x2 subtract of
// 1152 makes them exact centered halves c - 128, and one f16x2 FMA by the row's scale and its zero moved to the
// middle of the row's range (zero + 128 scale; both rounded to f16) rounds each value once: 1.5 instructions per
// value against ~4.5 in f32. Rounding the scale and zero adds at most ~2^-12 (|zero'| + range / 2) to a value's
// error, ~8x below a code's own half step (range / 510); every u8 case of the tests passed on the device. The same
// scheme for u4 / u2 (a mask-or per pair, with or without carrying the scale's and zero's rounding residues) failed
// 2-3 cases of the tests' tolerance (max abs 0.0023-0.0049 against 0.002; their codes sit far from the middle more
// often) and was dropped: docs/gpu_notes.md, "Prefill over a quantized cache: the producer's dequantization per value".
__device__ __forceinline__ uint32_t prmt(uint32_t x, uint32_t y, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(y), "r"(sel));
  return r;
}
// u4 / u2 codes in f32 without shifts: a field masked in place under the 2^23 bias is the float 2^23 + c 2^k
// exactly (fields within bits 0-22), one subtraction leaves c 2^k, and the scale is pre-multiplied by 2^-k
// (store_codes_f32). lop3 (w & mask) | magic is one instruction with the magic in a register; opaque_u32 keeps ptxas
// from folding it into a second immediate (a LOP3 takes one, so the folded form costs two instructions a code).
__device__ __forceinline__ uint32_t opaque_u32(uint32_t x) {
  asm volatile("mov.b32 %0, %0;" : "+r"(x));
  return x;
}
__device__ __forceinline__ float placed_code(uint32_t w, uint32_t mask, uint32_t magic) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(w), "r"(mask), "r"(magic));  // (a & b) | c
  return __uint_as_float(r) - 8388608.f;
}
__device__ __forceinline__ uint32_t u8_pair(uint32_t word, uint32_t sel, uint32_t s2, uint32_t z2) {
  const uint32_t biased = prmt(word, 0x64646464u, sel);  // sel 0x4140: bytes 0, 1; 0x4342: bytes 2, 3
  uint32_t r;
  asm("{\n.reg .b32 c;\nsub.f16x2 c, %1, %4;\nfma.rn.f16x2 %0, c, %2, %3;\n}"
      : "=r"(r) : "r"(biased), "r"(s2), "r"(z2), "r"(0x64806480u));  // 0x6480: the half 1152
  return r;
}

// Dequantizes loaded u8 codes into 16-byte chunks of the tile at `tile` (shared address) as f16 pairs (u8_pair),
// the row's scale and centered zero by shuffle.
template <int D>
__device__ __forceinline__ void store_u8_codes_f16(const TileCodes<D, KvType::u8>& codes, uint32_t tile, int p) {
  using C = TileCodes<D, KvType::u8>;
  using L = Layout<D>;
  const int lane = p & 31, vec = lane % C::kVecs, warp_row0 = p & ~31;
  const float zc = fmaf(128.f, codes.own.x, codes.own.y);
  const uint32_t own_s = pack_half2(codes.own.x, codes.own.x), own_z = pack_half2(zc, zc);
#pragma unroll
  for (int i = 0; i < C::kVecs; ++i) {
    const int rr = i * C::kRowsPerLoad + lane / C::kVecs;  // the group's row of this lane's vector
    const uint32_t s2 = __shfl_sync(0xffffffffu, own_s, rr), z2 = __shfl_sync(0xffffffffu, own_z, rr);
    const uint32_t words[4] = {codes.w[i].x, codes.w[i].y, codes.w[i].z, codes.w[i].w};
#pragma unroll
    for (int cc = 0; cc < C::kChunksPerVec; ++cc) {  // chunk vec * kChunksPerVec + cc: 8 dims, two words
      const uint32_t w0 = words[2 * cc], w1 = words[2 * cc + 1];
      const uint32_t dst = tile + chunk_offset<L::kTileBlockBytes>(warp_row0 + rr, vec * C::kChunksPerVec + cc);
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(u8_pair(w0, 0x4140, s2, z2)),
                   "r"(u8_pair(w0, 0x4342, s2, z2)), "r"(u8_pair(w1, 0x4140, s2, z2)), "r"(u8_pair(w1, 0x4342, s2, z2))
                   : "memory");
    }
  }
}

// Dequantizes the loaded u4 / u2 codes in f32 (code * scale + zero, rounded once to f16: the same values as the
// mma.sync kernel's, the row's scale and zero by shuffle) into 16-byte chunks of the tile at `tile` (shared address).
// kRef: each code shifted down and masked before the 2^23 bias (the kernel until the u4 / u2 rework; 2-3 integer
// instructions a code, the producer's bottleneck). Kept for the A/B and bit-identity tests (prefill_ref_dequant).
template <int D, KvType T, bool kRef = false>
__device__ __forceinline__ void store_codes_f32(const TileCodes<D, T>& codes, uint32_t tile, int p) {
  using C = TileCodes<D, T>;
  using L = Layout<D>;
  constexpr int kBits = C::kBits;
  const int lane = p & 31, vec = lane % C::kVecs, warp_row0 = p & ~31;
  const uint32_t magic = opaque_u32(0x4B000000u);
#pragma unroll
  for (int i = 0; i < C::kVecs; ++i) {
    const int rr = i * C::kRowsPerLoad + lane / C::kVecs;  // the group's row of this lane's vector
    const float s = __shfl_sync(0xffffffffu, codes.own.x, rr), z = __shfl_sync(0xffffffffu, codes.own.y, rr);
    // Scales by the field's place: a code masked in place is c 2^(kBits f) (field f), so s 2^(-kBits f) makes the
    // product c s exactly (a power-of-two scaling, exact while s 2^(-kBits f) stays normal: s >= 2^-110 for u4,
    // 2^-120 for u2; the quantizer's scales of f16 / bf16 rows are far above that, or 0).
    // u2: four places (two at head_dim 64, where four spilled beside an f16 side)
    constexpr int kPlaces = kBits == 4 ? 5 : D == 64 ? 2 : 4;
    float sp[kPlaces];
#pragma unroll
    for (int f = 0; f < kPlaces; ++f) sp[f] = s * (1.f / static_cast<float>(1 << (kBits * f)));
    const uint32_t words[4] = {codes.w[i].x, codes.w[i].y, codes.w[i].z, codes.w[i].w};
#pragma unroll
    for (int cc = 0; cc < C::kChunksPerVec; ++cc) {  // chunk vec * kChunksPerVec + cc: 8 dims
      float x[8];
      if constexpr (kBits == 8) {  // byte i = dim i
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = fmaf(code_f32((words[2 * cc + e / 4] >> (8 * (e % 4))) & 0xFFu), s, z);
      } else if constexpr (kRef && kBits == 4) {  // dim i in nibble i of the little-endian words
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = fmaf(code_f32((words[cc] >> (4 * e)) & 0xFu), s, z);
      } else if constexpr (kRef) {  // 2 bits: dim i in bits 2 (i % 4) of byte i / 4; 8 dims = 16 bits
        const uint32_t h = (words[cc / 2] >> (16 * (cc % 2))) & 0xFFFFu;
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = fmaf(code_f32((h >> (2 * e)) & 0x3u), s, z);
      } else if constexpr (kBits == 4) {  // nibbles 0-4 in place (bits 0-19), 5-7 from bits 8-19 of w >> 12
        const uint32_t w = words[cc], hi = w >> 12;
#pragma unroll
        for (int e = 0; e < 5; ++e) x[e] = fmaf(placed_code(w, 0xFu << (4 * e), magic), sp[e], z);
#pragma unroll
        for (int e = 5; e < 8; ++e) x[e] = fmaf(placed_code(hi, 0xFu << (4 * (e - 3)), magic), sp[e - 3], z);
      } else {  // 2 bits: the chunk's 16 bits in kPlaces-field parts, each shifted down to the bottom
        const uint32_t w = words[cc / 2] >> (16 * (cc % 2));
#pragma unroll
        for (int j = 0; j < 8 / kPlaces; ++j) {
#pragma unroll
          for (int e = 0; e < kPlaces; ++e)
            x[kPlaces * j + e] = fmaf(placed_code(w >> (2 * kPlaces * j), 0x3u << (2 * e), magic), sp[e], z);
        }
      }
      const uint32_t dst = tile + chunk_offset<L::kTileBlockBytes>(warp_row0 + rr, vec * C::kChunksPerVec + cc);
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(pack_half2(x[0], x[1])),
                   "r"(pack_half2(x[2], x[3])), "r"(pack_half2(x[4], x[5])), "r"(pack_half2(x[6], x[7]))
                   : "memory");
    }
  }
}

template <int D, KvType T, bool kRef = false>
__device__ __forceinline__ void store_codes(const TileCodes<D, T>& codes, uint32_t tile, int p) {
  if constexpr (T == KvType::u8)
    store_u8_codes_f16<D>(codes, tile, p);
  else
    store_codes_f32<D, T, kRef>(codes, tile, p);
}

// ---- per-channel K (u4c / u2c) ----------------------------------------------------------------------------

// Keys [0, codes_end) a query at position pos sees as codes: the blocks that end at or before pos + 1.
__device__ __forceinline__ int codes_end(int pos, int bs) { return (pos + 1) / bs * bs; }

// The CTA's walk over its key tiles with per-channel K, one pipeline stage per view. Tiles before w0 are seen as
// codes only; from w0 on, every tile holds window keys of some row (superset: keys [codes_end(p0), p1]), and the
// first nb of them codes too (keys below codes_end(p1)), those as codes then window. View v of the walk is tile
// tile(v); window(v) says which K it reads. The plan lives in shared memory and is read at each use: both
// warpgroups are short of registers, and these few loads are not on their critical path.
struct ChannelPlan {
  static constexpr int kWords = 5;
  const volatile int* f;  // w0, nb, views, codes_end(p0), p1
  __device__ __forceinline__ int views() const { return f[2]; }
  __device__ __forceinline__ int ce0() const { return f[3]; }
  __device__ __forceinline__ int p1() const { return f[4]; }
  __device__ __forceinline__ int tile(int v) const {
    const int w0 = f[0], nb = f[1], j = v - w0;
    return j < 0 ? v : j < 2 * nb ? w0 + (j >> 1) : w0 + j - nb;
  }
  __device__ __forceinline__ bool window(int v) const {
    const int w0 = f[0], nb = f[1], j = v - w0;
    return j >= 0 && (j >= 2 * nb || (j & 1));
  }
  __device__ __forceinline__ int views_through(int t) const {  // views of tiles 0..t
    const int w0 = f[0], nb = f[1];
    if (t < w0) return t + 1;
    const int k = t - w0 + 1;
    return w0 + k + min(k, nb);
  }
  // p0, p1: the cache positions of the CTA's first and last stored query rows; num_tiles covers keys [0, p1].
  __device__ __forceinline__ void write(volatile int* out, int bs, int p0, int p1, int num_tiles) const {
    const int ce0 = codes_end(p0, bs), ce1 = codes_end(p1, bs);
    const int w0 = ce0 <= p1 ? ce0 / kKeys : num_tiles;  // no window key at all: one row at a block's last key
    const int nb = max(0, (ce1 + kKeys - 1) / kKeys - w0);
    out[0] = w0, out[1] = nb, out[2] = num_tiles + nb, out[3] = ce0, out[4] = p1;
  }
};

// The codes of a per-channel K tile, loaded as load_codes does (the parameters are the block's, not the row's).
template <int D, KvType T>
__device__ __forceinline__ void load_channel_codes(TileCodes<D, T>& codes, const uint8_t* data, int p, int64_t row) {
  using C = TileCodes<D, T>;
  const int lane = p & 31, vec = lane % C::kVecs;
#pragma unroll
  for (int i = 0; i < C::kVecs; ++i) {
    const int64_t src_row = __shfl_sync(0xffffffffu, row, i * C::kRowsPerLoad + lane / C::kVecs);
    codes.w[i] = src_row >= 0 ? __ldg(reinterpret_cast<const uint4*>(data + src_row * C::kRowBytes) + vec)
                              : make_uint4(0, 0, 0, 0);
  }
}

// Dequantizes per-channel K codes into the tile: code * scale[dim] + zero[dim] of the row's block in f32, rounded
// once to f16 (the mma.sync kernel's values). own_block: the (block, kv head) row of k_params [blocks, Hkv, 2, D]
// of this thread's tile row (-1 past kv_len). Chunk by chunk (8 dims: 8 scales and 8 zeros in registers, read
// through L1), the lane's rows one load after the other; the parameters are read again only where the block of
// the lane's row changes (at most once in a warp's 32 rows for block sizes of 32 and up).
// Codes as in store_codes_f32: each field masked in place under the 2^23 bias (placed_code), the dim's scale
// pre-multiplied by 2^-(its field's bit place) where it is loaded, so the FFMA makes the same exact product c s and
// the same bits. u4: nibbles 0-4 of a chunk's word in place, 5-7 from w >> 12 (places 2-4); u2: the chunk's 16 bits
// shifted to the bottom, dims at places 0, 2, ..., 14. kRef: each code shifted and masked first (the A/B and the
// bit-identity tests, prefill_ref_dequant).
template <int Bits>
__device__ __forceinline__ float channel_place_scale(int e) {  // 2^-(bit place of dim e's field), e = 0..7
  return Bits == 4 ? 1.f / static_cast<float>(1 << (4 * (e < 5 ? e : e - 3))) : 1.f / static_cast<float>(1 << (2 * e));
}
template <int D, KvType T, bool kRef = false>
__device__ __forceinline__ void store_channel_codes(const TileCodes<D, T>& codes, uint32_t tile, int p, int own_block,
                                                    const float* params) {
  using C = TileCodes<D, T>;
  using L = Layout<D>;
  constexpr int kBits = C::kBits;
  static_assert(kBits == 4 || kBits == 2, "u4c / u2c");
  const int lane = p & 31, vec = lane % C::kVecs, warp_row0 = p & ~31;
  const uint32_t magic = opaque_u32(0x4B000000u);
#pragma unroll
  for (int cc = 0; cc < C::kChunksPerVec; ++cc) {
    const int chunk = vec * C::kChunksPerVec + cc;
    float sc[8], zr[8];
    int cur = -2;
#pragma unroll
    for (int i = 0; i < C::kVecs; ++i) {
      const int block = __shfl_sync(0xffffffffu, own_block, i * C::kRowsPerLoad + lane / C::kVecs);
      if (block != cur) {
        cur = block;
        float4 s0 = make_float4(0.f, 0.f, 0.f, 0.f), s1 = s0, z0 = s0, z1 = s0;
        if (cur >= 0) {
          const float4* pp = reinterpret_cast<const float4*>(params + static_cast<int64_t>(cur) * (2 * D) + 8 * chunk);
          s0 = __ldg(pp), s1 = __ldg(pp + 1), z0 = __ldg(pp + D / 4), z1 = __ldg(pp + D / 4 + 1);
        }
        sc[0] = s0.x, sc[1] = s0.y, sc[2] = s0.z, sc[3] = s0.w, sc[4] = s1.x, sc[5] = s1.y, sc[6] = s1.z, sc[7] = s1.w;
        zr[0] = z0.x, zr[1] = z0.y, zr[2] = z0.z, zr[3] = z0.w, zr[4] = z1.x, zr[5] = z1.y, zr[6] = z1.z, zr[7] = z1.w;
        if constexpr (!kRef) {
#pragma unroll
          for (int e = 0; e < 8; ++e) sc[e] *= channel_place_scale<kBits>(e);  // exact: a power of two
        }
      }
      const int rr = i * C::kRowsPerLoad + lane / C::kVecs;
      const uint32_t words[4] = {codes.w[i].x, codes.w[i].y, codes.w[i].z, codes.w[i].w};
      float x[8];
      if constexpr (kRef && kBits == 4) {
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = fmaf(code_f32((words[cc] >> (4 * e)) & 0xFu), sc[e], zr[e]);
      } else if constexpr (kRef) {
        const uint32_t h = (words[cc / 2] >> (16 * (cc % 2))) & 0xFFFFu;
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = fmaf(code_f32((h >> (2 * e)) & 0x3u), sc[e], zr[e]);
      } else if constexpr (kBits == 4) {
        const uint32_t w = words[cc], hi = w >> 12;
#pragma unroll
        for (int e = 0; e < 5; ++e) x[e] = fmaf(placed_code(w, 0xFu << (4 * e), magic), sc[e], zr[e]);
#pragma unroll
        for (int e = 5; e < 8; ++e) x[e] = fmaf(placed_code(hi, 0xFu << (4 * (e - 3)), magic), sc[e], zr[e]);
      } else {
        const uint32_t w = words[cc / 2] >> (16 * (cc % 2));
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = fmaf(placed_code(w, 0x3u << (2 * e), magic), sc[e], zr[e]);
      }
      const uint32_t dst = tile + chunk_offset<L::kTileBlockBytes>(warp_row0 + rr, chunk);
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(pack_half2(x[0], x[1])),
                   "r"(pack_half2(x[2], x[3])), "r"(pack_half2(x[4], x[5])), "r"(pack_half2(x[6], x[7]))
                   : "memory");
    }
  }
}

// Which integer sides the producer loads one tile ahead (under the dequantization of the current tile; the other
// integer sides load once their stage is free, one after the other): the codes live at once, two tiles of each side
// loaded ahead plus the other side, must fit about 48 of its registers (kProducerRegs) beside the addressing, or it
// spills (the bounds below are what ptxas showed without spills). K is preferred.
template <int D, KvType T>
constexpr int code_regs() {
  return T == KvType::f16 ? 0 : 4 * TileCodes<D, T>::kVecs;
}
template <int D, KvType KT, KvType VT>
constexpr bool prefetch_k() {
  return KT != KvType::f16 && 2 * code_regs<D, KT>() + code_regs<D, VT>() <= 48;
}
template <int D, KvType KT, KvType VT>
constexpr bool prefetch_v() {
  constexpr bool k_ahead = prefetch_k<D, KT, VT>();
  // Both sides ahead keep four tiles' worth of codes live through the dequantization: a tighter bound.
  return VT != KvType::f16 && (k_ahead ? 2 * (code_regs<D, VT>() + code_regs<D, KT>()) <= 32
                                       : 2 * code_regs<D, VT>() + code_regs<D, KT>() <= 48);
}

// A tile's `full` barrier counts one arrival per producer thread for its f16 sides (by cp.async completion)
// and one for its dequantized sides (stored with st.shared, then fenced for wgmma's async-proxy reads).
template <KvType KT, KvType VT>
constexpr int kFullArrivals = 128 * ((KT == KvType::f16 || VT == KvType::f16) + (KT != KvType::f16 || VT != KvType::f16));
// Per-channel K: a stage's K is copied (window rows) or dequantized (codes) by view, so every view arrives both ways.
template <KvType KT, KvType VT>
constexpr int full_arrivals() {
  return kv_per_channel<KT>() ? 256 : kFullArrivals<KT, VT>;
}

template <KvType KT, KvType VT>
__device__ __forceinline__ void publish_rows(uint64_t* full) {
  if constexpr (KT == KvType::f16 || VT == KvType::f16) cp_async_arrive(full);
  if constexpr (KT != KvType::f16 || VT != KvType::f16) {
    fence_proxy_async();
    mbar_arrive(full);
  }
}

// The producer's walk with per-channel K: for each view of the plan, K as codes (dequantized with the block's
// per-channel parameters) or as the window rows of keys [max(key0, codes_end(p0)), min(key0 + kKeys, p1 + 1)) (the
// rest zero-filled), and V as for per-token K. Codes load one view ahead where prefetch_k / prefetch_v allow it
// (the K codes only for a codes view).
template <int D, KvType KT, KvType VT, bool kRef = false>
__device__ __forceinline__ void produce_channel_views(const PrefillTcArgs& a, const ChannelPlan plan,
                                                      const int32_t* pages, int kvh, int kv_len, uint32_t k_tile0,
                                                      uint64_t* full, uint64_t* empty, int p, bool runs16,
                                                      const volatile int* range) {
  using L = Layout<D>;
  constexpr bool kF16V = VT == KvType::f16;
  // The per-token rules, but K not ahead beside f16 V (the per-channel scales and zeros take 16 more registers
  // while K is dequantized; that one spilled).
  constexpr bool kAheadK = prefetch_k<D, KT, VT>() && VT != KvType::f16, kAheadV = prefetch_v<D, KT, VT>();
  const int bs = a.block_size;
  // This thread's key of view v: its page (-1 past kv_len) and cache row.
  auto page_of = [&](int v) {
    const int pos = plan.tile(v) * kKeys + p;
    return pos < kv_len ? pages[pos / bs] : -1;
  };
  // Cache rows in 32 bits (a pool below 2^31 token-heads: 512 GB of f16 K at head_dim 128) hold fewer registers;
  // with u8 V and with f16 V at head_dim 64, 64 bits are what ptxas allocated without spills.
  using Row = std::conditional_t<VT == KvType::u8 || (D == 64 && VT == KvType::f16), int64_t, int>;
  auto row_of = [&](int v, int page) {
    return page >= 0 ? (static_cast<Row>(page) * a.hkv + kvh) * bs + (plan.tile(v) * kKeys + p) % bs : Row{-1};
  };
  // Views [v_begin, v_end) = [range[0], range[-1]) of the plan (all of them without a key split), the stages counted
  // from v_begin; both read from shared memory at each use, as the plan's words (held in registers, they spilled).
  const volatile int* v_end = range - 1;
  const int v_begin = *range;
  if (v_begin >= *v_end) return;
  TileCodes<D, KT> kc;
  TileCodes<D, VT> vc;
  int next_page = page_of(v_begin);
  Row next_row = row_of(v_begin, next_page);
  if constexpr (kAheadK) {
    if (!plan.window(v_begin)) load_channel_codes<D, KT>(kc, a.k, p, next_row);
  }
  if constexpr (kAheadV) load_codes<D, VT>(vc, a.v, a.v_params, p, next_row);
  for (int v = v_begin; v < *v_end; ++v) {
    const int rnd = v - *range;
    const int stage = rnd % kStages;
    const uint32_t k_tile = k_tile0 + stage * L::kStageBytes, v_tile = k_tile + L::kTileBytes;
    const int page = next_page;
    const Row row = next_row;
    const bool window = plan.window(v);
    if (v + 1 < *v_end) next_page = page_of(v + 1), next_row = row_of(v + 1, next_page);
    TileCodes<D, KT> kcur;
    TileCodes<D, VT> vcur;
    if constexpr (kAheadK) kcur = kc;
    if constexpr (kAheadV) vcur = vc;
    if (v + 1 < *v_end) {
      if constexpr (kAheadK) {
        if (!plan.window(v + 1)) load_channel_codes<D, KT>(kc, a.k, p, next_row);
      }
      if constexpr (kAheadV) load_codes<D, VT>(vc, a.v, a.v_params, p, next_row);
    }
    mbar_wait(&empty[stage], ((rnd / kStages) & 1) ^ 1);
    if (window) {  // CTA-uniform: copy_f16_rows shuffles across the warp
      const int key0 = plan.tile(v) * kKeys, key = key0 + p;
      int64_t wrow = -1;
      if (key >= plan.ce0() && key <= plan.p1() && page >= 0) {
        const int slot = a.window_map[page];
        if (slot >= 0) wrow = (static_cast<int64_t>(slot) * a.hkv + kvh) * bs + key % bs;
      }
      copy_f16_rows<D, true, false>(reinterpret_cast<const uint8_t*>(a.k_window), nullptr, k_tile, 0, p, wrow, runs16);
    }
    if constexpr (kF16V) copy_f16_rows<D, false, true>(nullptr, a.v, 0, v_tile, p, row, runs16);
    if (!window) {
      if constexpr (!kAheadK) load_channel_codes<D, KT>(kcur, a.k, p, row);
      // Beside u8 V the placed fields' two more registers spilled (20 bytes at head_dim 128): the shifts there.
      constexpr bool kRefK = kRef || VT == KvType::u8;
      store_channel_codes<D, KT, kRefK>(kcur, k_tile, p, page >= 0 ? page * a.hkv + kvh : -1, a.k_params);
    }
    if constexpr (!kF16V) {
      if constexpr (!kAheadV) load_codes<D, VT>(vcur, a.v, a.v_params, p, row);
      store_codes<D, VT, kRef>(vcur, v_tile, p);
    }
    cp_async_arrive(&full[stage]);  // full_arrivals: both ways for every view
    fence_proxy_async();
    mbar_arrive(&full[stage]);
  }
}

// ---- consumer -------------------------------------------------------------------------------------------

// Scores of one consumer thread's two rows (g and g + 8 of its warp) for one tile: the wgmma accumulator layout,
// s[4j + e] = row (e < 2 ? g : g + 8), key 8j + 2 (lane % 4) + e % 2.
struct RowState {
  float m_lo, m_hi, l_lo, l_hi;  // running max (log2 domain, scaled) and this lane's partial row sums
};

// 2^x with denormal results flushed to zero (the MUFU instruction alone; a probability below 2^-126 is 0 here).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A row's maximum is raised only when a tile's scores pass it by more than kMaxSlack (log2 domain): below that the
// old maximum stays, P = 2^(score - max) is at most 2^kMaxSlack (f16 holds such values as precisely as those below
// 1; O and l accumulate in f32 and share the maximum, so O / l is unchanged), and O needs no rescale. Once a row has
// seen a few tiles its maximum rarely moves by that much, so most tiles of a warp skip the rescale of O entirely.
constexpr float kMaxSlack = 8.f;

// Turns one tile's raw scores s into unnormalized probabilities P (f32, in place) and updates the row max and
// sums; returns in alpha the factors that rescale O (applied by the caller once the previous tile's P·V has
// landed, so that P·V runs under this softmax; 1 where the row kept its maximum). kMask: keys past each row's
// position are masked (only tiles that reach past the warpgroup's first row need it; the others skip the compares).
// kPositiveScale: the scale is folded into the exponent's FMA (max over raw scores, then 2^(s·c - m)), which
// needs c > 0; otherwise the scores are scaled first. kLower (per-channel K's window view): keys below first_lo /
// first_hi are masked too, and pos_lo / pos_hi are the last keys the rows see rather than their positions.
template <bool kPositiveScale, bool kMask, bool kLower = false>
__device__ __forceinline__ void softmax_scores(float (&s)[64], RowState& st, float& alpha_lo, float& alpha_hi,
                                               int key0, int pos_lo, int pos_hi, float scale_log2, int first_lo = 0,
                                               int first_hi = 0) {
  const int t = threadIdx.x & 3;
  float mx_lo = kNoScore, mx_hi = kNoScore;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = kPositiveScale ? s[4 * j + e] : s[4 * j + e] * scale_log2;
      if (kMask) {
        const int key = key0 + 8 * j + 2 * t + (e & 1);
        if (key > (e < 2 ? pos_lo : pos_hi) || (kLower && key < (e < 2 ? first_lo : first_hi))) x = kNoScore;
      }
      s[4 * j + e] = x;
    }
    mx_lo = fmaxf(mx_lo, fmaxf(s[4 * j], s[4 * j + 1]));
    mx_hi = fmaxf(mx_hi, fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
  // The 4 lanes of a quad hold a row's 128 scores.
  mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
  mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
  mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
  mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
  // A row's first tile always holds an unmasked key (key 0), so its max is a real score from then on (and the
  // first tile always raises it: kNoScore + kMaxSlack is kNoScore).
  if (kPositiveScale) mx_lo *= scale_log2, mx_hi *= scale_log2;
  alpha_lo = alpha_hi = 1.f;
  if (mx_lo > st.m_lo + kMaxSlack) alpha_lo = exp2_ftz(st.m_lo - mx_lo), st.m_lo = mx_lo;
  if (mx_hi > st.m_hi + kMaxSlack) alpha_hi = exp2_ftz(st.m_hi - mx_hi), st.m_hi = mx_hi;
  const float c = kPositiveScale ? scale_log2 : 1.f;
  const float m_lo = st.m_lo, m_hi = st.m_hi;
  float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    s[4 * j] = exp2_ftz(fmaf(s[4 * j], c, -m_lo));
    s[4 * j + 1] = exp2_ftz(fmaf(s[4 * j + 1], c, -m_lo));
    s[4 * j + 2] = exp2_ftz(fmaf(s[4 * j + 2], c, -m_hi));
    s[4 * j + 3] = exp2_ftz(fmaf(s[4 * j + 3], c, -m_hi));
    sum_lo += s[4 * j] + s[4 * j + 1];
    sum_hi += s[4 * j + 2] + s[4 * j + 3];
  }
  st.l_lo = st.l_lo * alpha_lo + sum_lo;
  st.l_hi = st.l_hi * alpha_hi + sum_hi;
}

template <int kO>
__device__ __forceinline__ void rescale_rows(float (&o)[kO], float alpha_lo, float alpha_hi) {
#pragma unroll
  for (int i = 0; i < kO; i += 4) {
    o[i] *= alpha_lo;
    o[i + 1] *= alpha_lo;
    o[i + 2] *= alpha_hi;
    o[i + 3] *= alpha_hi;
  }
}

template <int D, KvType KT, KvType VT, bool kRefDequant = false>
__global__ void __launch_bounds__(kThreads, 1) prefill_attention_sm90_kernel(const PrefillTcArgs a) {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(!kv_per_channel<VT>(), "V per token");
  constexpr bool kPerChannel = kv_per_channel<KT>();
  constexpr bool kPv128 = D == 128;  // P·V: one m64n128k16 per k16 step (D 64: one n64)
  // Packed query heads (integer per-token K or V): a CTA's 128 rows are kRows / pack positions x the pack query
  // heads of one kv head (row r: position r / pack, head r % pack), so each K/V tile the producer dequantizes
  // serves `pack` heads (pack_heads_sm90 below; the launch sets gridDim.x = hq / pack). f16 and per-channel K keep
  // one head per CTA (pack 1, the code as before).
  constexpr bool kPack = !kPerChannel && (KT != KvType::f16 || VT != KvType::f16);
  using L = Layout<D>;
  constexpr int kO = D / 2;  // O accumulators per thread: 64 rows x D over 128 threads
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t* q_full = reinterpret_cast<uint64_t*>(smem + L::kBarrierOffset);
  uint64_t* full = q_full + 1;
  uint64_t* empty = full + kStages;
  const uint32_t q_smem = smem_u32(smem);
  auto k_tile = [&](int stage) { return q_smem + L::kQBytes + stage * L::kStageBytes; };
  auto v_tile = [&](int stage) { return k_tile(stage) + L::kTileBytes; };

  const int pack = kPack ? a.hq / static_cast<int>(gridDim.x) : 1;  // query heads per CTA
  const int cta_pos = kPack ? kRows / pack : kRows;                // query positions per CTA
  const int live_rows = kPack ? cta_pos * pack : kRows;            // rows past it are never stored
  const int h = blockIdx.x * pack;                                 // the query head of row 0
  // Key split (prefill_split_plan.h): this launch's splits are [split_first, split_first + launched) of a.splits.
  const int launched = a.split_count > 0 ? a.split_count : a.splits;
  const int seq = blockIdx.z / launched, split = a.split_first + blockIdx.z % launched;
  const int q_tile = gridDim.y - 1 - blockIdx.y;  // the longest causal ranges start first
  const int ns = a.num_seqs;
  const int q_start = a.seq_info[seq], q_len = a.seq_info[ns + seq], kv_len = a.seq_info[2 * ns + seq];
  const int row0 = q_tile * cta_pos;  // the CTA's first query position
  if (row0 >= q_len) return;  // the whole CTA leaves before any barrier
  const int kvh = h / (a.hq / a.hkv);
  const int first_pos = kv_len - q_len;  // cache position of query row 0
  const int num_tiles = (first_pos + min(row0 + cta_pos, q_len) - 1) / kKeys + 1;
  // This CTA's key tiles [t_begin, t_end) (all of them without a split). Per-channel K: its views are
  // [t_begin, v_end) of the plan, v_end its views() for the last split (below); the tiles before the window views
  // are one view each, and every split but the last ends before them.
  int t_begin = 0, t_end = num_tiles;
  if (a.splits > 1) {
    // The tail split (the dequantized copy of per-channel K) cuts at the per-channel bound in every instance.
    const bool channel_bound = kPerChannel || a.split_tail;
    const int splittable = prefill_split::splittable_keys(first_pos, a.block_size, channel_bound) / kKeys;
    if (a.split_tail)
      prefill_split::tail_split_range(num_tiles, splittable, a.splits, split, t_begin, t_end);
    else
      prefill_split::split_range(num_tiles, splittable, a.splits, split, t_begin, t_end);
  }
  const bool last_split = split + 1 == a.splits;
  const int32_t* pages = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks;
  // Per-channel K: the views of the key tiles, one stage each (after the barriers).
  const ChannelPlan plan{reinterpret_cast<const volatile int*>(full + 2 * kStages)};
  // The key split's first tile, also kept in shared memory (word 7 of the plan's): the producer reads it there at
  // each tile (held in a register beside its loop bound, the producer of some instances spilled). Per-channel K:
  // word 6 is the end of its views, [t_begin, plan.views()) for the last split.
  volatile int* t_begin_smem = reinterpret_cast<volatile int*>(full + 2 * kStages) + 7;

  if (threadIdx.x == 0) {
    mbar_init(q_full, 128);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], full_arrivals<KT, VT>());  // every producer thread publishes its rows
      mbar_init(&empty[s], 256);                   // every consumer thread releases
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    *t_begin_smem = t_begin;
    if constexpr (kPerChannel) {
      plan.write(const_cast<volatile int*>(plan.f), a.block_size, first_pos + row0,
                 first_pos + min(row0 + kRows, q_len) - 1, num_tiles);
      t_begin_smem[-1] = last_split ? plan.views() : t_end;
    }
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    // Producer: thread p owns row p of the Q tile and of every K/V tile.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs) : "memory");
    const int p = threadIdx.x;
    const bool runs16 = a.block_size % 16 == 0;  // copy_f16_rows
    {
      const int pr = kPack ? p / pack : p;  // row p's position in the CTA (its head: h + p - pr * pack)
      const int r = row0 + pr;
      const bool valid = r < q_len && (!kPack || p < live_rows);
      const __half* src =
          a.q + (valid ? static_cast<int64_t>(q_start + r) * a.q_stride_t + (h + p - pr * pack) * a.q_stride_h : 0);
#pragma unroll
      for (int c = 0; c < D / 8; ++c)
        cp_async16(q_smem + chunk_offset<L::kQBlockBytes>(p, c), src + 8 * c, valid);
    }
    cp_async_arrive(q_full);
    if constexpr (kPerChannel) {
      produce_channel_views<D, KT, VT, kRefDequant>(a, plan, pages, kvh, kv_len, k_tile(0), full, empty, p, runs16,
                                                    t_begin_smem);
    } else {
      constexpr bool kF16K = KT == KvType::f16, kF16V = VT == KvType::f16;
      constexpr bool kAheadK = prefetch_k<D, KT, VT>(), kAheadV = prefetch_v<D, KT, VT>();
      auto row_of = [&](int t) { return t * kKeys + p < kv_len ? cache_row(a, pages, kvh, t * kKeys + p) : int64_t{-1}; };
      TileCodes<D, KT> kc;  // the next tile's codes of a side loaded ahead
      TileCodes<D, VT> vc;
      // Tiles [t_begin, t_end), stages counted from t_begin (0 without a split).
      int t = *t_begin_smem;
      int64_t next_row = row_of(t);
      if (t < t_end) {
        if constexpr (kAheadK) load_codes<D, KT>(kc, a.k, a.k_params, p, next_row);
        if constexpr (kAheadV) load_codes<D, VT>(vc, a.v, a.v_params, p, next_row);
      }
      for (; t < t_end; ++t) {
        const int rnd = t - *t_begin_smem;
        const int stage = rnd % kStages;
        const int64_t row = next_row;
        if (t + 1 < t_end) next_row = row_of(t + 1);
        TileCodes<D, KT> kcur;
        TileCodes<D, VT> vcur;
        if constexpr (kAheadK) kcur = kc;
        if constexpr (kAheadV) vcur = vc;
        if (t + 1 < t_end) {  // the next tile's codes load under this tile's dequantization
          if constexpr (kAheadK) load_codes<D, KT>(kc, a.k, a.k_params, p, next_row);
          if constexpr (kAheadV) load_codes<D, VT>(vc, a.v, a.v_params, p, next_row);
        }
        mbar_wait(&empty[stage], ((rnd / kStages) & 1) ^ 1);  // the first round passes at once
        if constexpr (kF16K || kF16V)
          copy_f16_rows<D, kF16K, kF16V>(a.k, a.v, k_tile(stage), v_tile(stage), p, row, runs16);
        if constexpr (!kF16K) {
          if constexpr (!kAheadK) load_codes<D, KT>(kcur, a.k, a.k_params, p, row);
          store_codes<D, KT, kRefDequant>(kcur, k_tile(stage), p);
        }
        if constexpr (!kF16V) {
          if constexpr (!kAheadV) load_codes<D, VT>(vcur, a.v, a.v_params, p, row);
          store_codes<D, VT, kRefDequant>(vcur, v_tile(stage), p);
        }
        publish_rows<KT, VT>(&full[stage]);
      }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");  // no copy outlives its thread
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs) : "memory");
    const int cw = threadIdx.x / 32 - 4 * wg;  // warp in its warpgroup
    const int lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int wg_r = 64 * (wg - 1);  // the warpgroup's first row in the CTA
    const int wg_row0 = row0 + (kPack ? wg_r / pack : wg_r);  // its first query position
    const bool wg_live = wg_row0 < q_len && (!kPack || wg_r < live_rows);
    const int wg_last = kPack ? row0 + min(wg_r + 63, live_rows - 1) / pack : wg_row0 + 63;
    const int wg_last_key = first_pos + min(wg_last, q_len - 1);  // the last key a stored row sees
    // This thread's rows lo and hi (8 apart in the CTA) as query positions.
    const int r_lo = kPack ? row0 + (wg_r + 16 * cw + g) / pack : wg_row0 + 16 * cw + g;
    const int r_hi = kPack ? row0 + (wg_r + 16 * cw + g + 8) / pack : r_lo + 8;
    const int pos_lo = first_pos + r_lo, pos_hi = kPack ? first_pos + r_hi : pos_lo + 8;
    const uint32_t q_wg = q_smem + (wg - 1) * 64 * 128;  // the warpgroup's 64 rows in each column block

    float o[kO];
#pragma unroll
    for (int i = 0; i < kO; ++i) o[i] = 0.f;
    RowState st{kNoScore, kNoScore, 0.f, 0.f};
    // Rounds r = 0..num_tiles. Round r issues Q·Kᵀ of tile r, then P·V of tile r - 1 (two commit groups), waits for
    // the first and turns tile r's scores into P while P·V runs, then waits for P·V, releases tile r - 1's stage
    // and rescales O by the new row maxima. The two warpgroups also take turns issuing (named barriers 2 and 3,
    // warpgroup 1 first), so one's MMAs run while the other does its softmax (FlashAttention-3's ping-pong and
    // intra-warpgroup overlap). A warpgroup's rows see a prefix of n tiles: round 0 (Q·Kᵀ only), rounds 1..n-1
    // (both) and round n (P·V only) are separate code, because ptxas serializes every wgmma when one may be in
    // flight across a branch; the rounds after n only keep the turns paired and release their stages. Warpgroup 2
    // passes no turn after its last round (nobody would take it).
    const int me = wg - 1;
    if (me == 1) named_arrive(2);
    // Rounds: one per pipeline stage the producer fills (per-channel K: one per view of a tile).
    // Key split: rounds r are the views (tiles) r0 + r of the CTA's range.
    const int r0 = t_begin;
    const int rounds = (kPerChannel && last_split ? plan.views() : t_end) - r0;
    const int n_end = !wg_live ? r0
                      : kPerChannel ? min(plan.views_through(wg_last_key / kKeys), r0 + rounds)
                                    : min(t_end, wg_last_key / kKeys + 1);
    const int n = max(0, n_end - r0);
    // A positive scale is folded into the exponent (softmax_scores); with per-channel K only if it is not so small
    // that the start of the row maxima below would come near real scores.
    const bool positive_scale = a.scale_log2 > (kPerChannel ? 1e-20f : 0.f);
    if constexpr (kPerChannel) {
      // Per token, every row's first tile holds an unmasked key (key 0). A per-channel view can mask all of a row's
      // keys (those it sees in the other view): its maximum starts at half of kNoScore (in the domain the maxima
      // are compared in), above every masked score, so their P is exp2(-huge) = 0, not exp2(0), and l and O stay 0
      // until the row's first real score replaces it (alpha = 0 then).
      st.m_lo = st.m_hi = 0.5f * kNoScore * (positive_scale ? a.scale_log2 : 1.f);
    }
    // Per-channel K: the codes of this thread's row lo end at ce_lo (its window rows follow up to pos_lo).
    int ce_lo = 0;
    if constexpr (kPerChannel) ce_lo = codes_end(pos_lo, a.block_size);
    float s[64];
    uint32_t pa[32];  // P of the previous tile as the A fragments of its 8 k16 steps
    float alpha_lo, alpha_hi;

    auto begin_round = [&](int r) {
      if (r < rounds) mbar_wait(&full[r % kStages], (r / kStages) & 1);
      named_sync(2 + me);
    };
    auto pass_turn = [&](int r) {
      if (!(me == 1 && r == rounds)) named_arrive(2 + (me ^ 1));
    };
    auto release_previous = [&](int r) {
      if (r > 0) mbar_arrive(&empty[(r - 1) % kStages]);
    };
    const uint32_t q_desc = desc_lo(q_wg), k_desc0 = desc_lo(k_tile(0));
    auto issue_qk = [&](int t) {  // t: the round (its stage)
      const uint32_t kt = k_desc0 + (t % kStages) * (L::kStageBytes >> 4);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t off = (kk >> 2) * L::kTileBlockBytes + ((kk & 3) << 5);  // k16 step within the 128-byte row
        static_assert(L::kQBlockBytes == L::kTileBlockBytes, "Q and K column blocks alike");
        wgmma_qk(s, desc_at(q_desc, off), desc_at(kt, off), kk > 0);
      }
      wgmma_commit();
    };
    auto issue_pv = [&](int t) {
      const uint32_t vt = k_desc0 + (t % kStages) * (L::kStageBytes >> 4) + (L::kTileBytes >> 4);
      wgmma_fence();
      if constexpr (kPv128) {
#pragma unroll
        for (int kk = 0; kk < 8; ++kk)
          wgmma_pv128(*reinterpret_cast<float(*)[64]>(o), pa + 4 * kk,
                      desc_at(pv128_lo<L::kTileBlockBytes>(vt), kk * 2048));
      } else {
#pragma unroll
        for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
          for (int b = 0; b < L::kBlocks; ++b)
            wgmma_pv(*reinterpret_cast<float(*)[32]>(o + 32 * b), pa + 4 * kk,
                     desc_at(vt, b * L::kTileBlockBytes + kk * 2048));
        }
      }
      wgmma_commit();
    };
    auto softmax_views = [&](int r) {  // per-channel K: the masks of view r
      const int key0 = plan.tile(r) * kKeys;
      // Row hi is 8 positions after row lo, and blocks are longer than that: its codes end at ce_lo or one block on
      // (derived here: one register less across the loop).
      const int ce_hi = pos_hi + 1 >= ce_lo + a.block_size ? ce_lo + a.block_size : ce_lo;
      if (plan.window(r)) {  // keys [ce, pos] of each row
        if (positive_scale)
          softmax_scores<true, true, true>(s, st, alpha_lo, alpha_hi, key0, pos_lo, pos_hi, a.scale_log2, ce_lo, ce_hi);
        else
          softmax_scores<false, true, true>(s, st, alpha_lo, alpha_hi, key0, pos_lo, pos_hi, a.scale_log2, ce_lo, ce_hi);
        return;
      }
      // Codes: keys [0, ce) of each row; no mask where the tile ends below the codes end of the warp's first row
      // (lane 0's row lo; a warp-uniform branch).
      const bool mask = key0 + kKeys > __shfl_sync(0xffffffffu, ce_lo, 0);
      if (positive_scale) {
        if (mask)
          softmax_scores<true, true>(s, st, alpha_lo, alpha_hi, key0, ce_lo - 1, ce_hi - 1, a.scale_log2);
        else
          softmax_scores<true, false>(s, st, alpha_lo, alpha_hi, key0, ce_lo - 1, ce_hi - 1, a.scale_log2);
      } else {
        if (mask)
          softmax_scores<false, true>(s, st, alpha_lo, alpha_hi, key0, ce_lo - 1, ce_hi - 1, a.scale_log2);
        else
          softmax_scores<false, false>(s, st, alpha_lo, alpha_hi, key0, ce_lo - 1, ce_hi - 1, a.scale_log2);
      }
    };
    auto softmax = [&](int t) {
      if constexpr (kPerChannel) return softmax_views(t);
      const int key0 = t * kKeys;
      // The mask only where the tile reaches past the warpgroup's first row (that covers keys past kv_len).
      const bool mask = key0 + kKeys - 1 > first_pos + wg_row0;
      if (positive_scale) {
        if (mask)
          softmax_scores<true, true>(s, st, alpha_lo, alpha_hi, key0, pos_lo, pos_hi, a.scale_log2);
        else
          softmax_scores<true, false>(s, st, alpha_lo, alpha_hi, key0, pos_lo, pos_hi, a.scale_log2);
      } else {
        if (mask)
          softmax_scores<false, true>(s, st, alpha_lo, alpha_hi, key0, pos_lo, pos_hi, a.scale_log2);
        else
          softmax_scores<false, false>(s, st, alpha_lo, alpha_hi, key0, pos_lo, pos_hi, a.scale_log2);
      }
    };
    auto rescale_and_pack_p = [&]() {
      // O is rescaled only where a row of this warp raised its maximum (a warp-uniform branch).
      if (__any_sync(0xffffffffu, alpha_lo != 1.f || alpha_hi != 1.f)) rescale_rows<kO>(o, alpha_lo, alpha_hi);
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        pa[4 * kk] = pack_half2(s[8 * kk], s[8 * kk + 1]);
        pa[4 * kk + 1] = pack_half2(s[8 * kk + 2], s[8 * kk + 3]);
        pa[4 * kk + 2] = pack_half2(s[8 * kk + 4], s[8 * kk + 5]);
        pa[4 * kk + 3] = pack_half2(s[8 * kk + 6], s[8 * kk + 7]);
      }
    };

    mbar_wait(q_full, 0);
    int r = 0;
    if (n > 0) {
      begin_round(0);
      issue_qk(0);
      pass_turn(0);
      wgmma_wait<0>();
      fence_regs(s);
      softmax(r0);
      rescale_and_pack_p();
      for (r = 1; r < n; ++r) {
        begin_round(r);
        issue_qk(r);
        issue_pv(r - 1);
        pass_turn(r);
        wgmma_wait<1>();  // Q·Kᵀ landed (groups complete in order); P·V may still run
        fence_regs(s);
        softmax(r0 + r);
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(pa);  // P's registers stay P's until the wgmmas that read them are done
        release_previous(r);
        rescale_and_pack_p();
      }
      begin_round(n);
      issue_pv(n - 1);
      pass_turn(n);
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pa);
      release_previous(n);
      r = n + 1;
    }
    for (; r <= rounds; ++r) {  // tiles past this warpgroup's rows
      begin_round(r);
      pass_turn(r);
      release_previous(r);
    }

    // O / l as f16; rows past q_len are not stored.
    int row_lo = r_lo;
    if constexpr (kPerChannel) {  // read again here: held across the loop, ptxas spilled it
      uint32_t tid, cta, ctas;
      asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
      asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(cta));
      asm volatile("mov.u32 %0, %%nctaid.y;" : "=r"(ctas));
      row_lo = (ctas - 1 - cta) * kRows + 64 * (tid / 128 - 1) + 16 * (tid / 32 % 4) + (tid % 32) / 4;
    }
    const int row_hi = kPerChannel ? row_lo + 8 : r_hi;
    // Packed heads: each row's own head, and rows past live_rows (their position is another row's) not stored.
    int h_lo = h, h_hi = h;
    bool live_lo = true, live_hi = true;
    if constexpr (kPack) {
      const int lr = wg_r + 16 * cw + g;
      h_lo = h + lr % pack, h_hi = h + (lr + 8) % pack;
      live_lo = lr < live_rows, live_hi = lr + 8 < live_rows;
    }
    const float l_lo = attn_math::quad_sum(st.l_lo), l_hi = attn_math::quad_sum(st.l_hi);
    if (a.splits > 1) {  // key split: this range's unnormalized O and (max, sum) per row, for the merge
      // The split from blockIdx again (not held across the loop).
      const int launched_splits = a.split_count > 0 ? a.split_count : a.splits;
      const int64_t base =
          static_cast<int64_t>(a.split_first + blockIdx.z % launched_splits) * a.split_tokens + q_start;
      auto store = [&](int row, int head, float m, float l, int e0) {
        const int64_t at = (base + row) * a.hq + head;
        float* dst = a.split_o + at * D + 2 * t4;
#pragma unroll
        for (int j = 0; j < kO / 4; ++j)
          *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[4 * j + e0], o[4 * j + e0 + 1]);
        if (t4 == 0) a.split_ml[at] = make_float2(m, l);
      };
      if (row_lo < q_len && live_lo) store(row_lo, h_lo, st.m_lo, l_lo, 0);
      if (row_hi < q_len && live_hi) store(row_hi, h_hi, st.m_hi, l_hi, 2);
      return;
    }
    const float inv_lo = 1.f / l_lo, inv_hi = 1.f / l_hi;  // l >= 1: the row max's own term is exp2(0)
    // Accumulator 4j + e of a 64-column block b: dim 64b + 8j + 2 t4 + e % 2 of row (e < 2 ? r_lo : r_hi).
    if (row_lo < q_len && live_lo) {
      __half* out = a.out + static_cast<int64_t>(q_start + row_lo) * a.out_stride_t + h_lo * a.out_stride_h + 2 * t4;
#pragma unroll
      for (int j = 0; j < kO / 4; ++j)
        *reinterpret_cast<uint32_t*>(out + 8 * j) = pack_half2(o[4 * j] * inv_lo, o[4 * j + 1] * inv_lo);
    }
    if (row_hi < q_len && live_hi) {
      __half* out = a.out + static_cast<int64_t>(q_start + row_hi) * a.out_stride_t + h_hi * a.out_stride_h + 2 * t4;
#pragma unroll
      for (int j = 0; j < kO / 4; ++j)
        *reinterpret_cast<uint32_t*>(out + 8 * j) = pack_half2(o[4 * j + 2] * inv_hi, o[4 * j + 3] * inv_hi);
    }
  }
}
#else
template <int D, KvType KT, KvType VT, bool kRefDequant = false>
__global__ void prefill_attention_sm90_kernel(const PrefillTcArgs) {}  // the sm_90a image is the only real one
#endif  // LOWBIT_SM90_DEVICE

}  // namespace prefill_sm90

// Launches the (head_dim, K, V) instance: grid (query heads, query tiles of 128, sequences).
template <int D, KvType KT, KvType VT, bool kRefDequant>
void launch_prefill_attention_sm90(const PrefillTcArgs& a, dim3 grid, cudaStream_t stream) {
  using namespace prefill_sm90;
  constexpr int bytes = Layout<D>::kSmemBytes + Layout<D>::kPlanBytes;  // the plan's words (t_begin: every K type)
  auto kernel = prefill_attention_sm90_kernel<D, KT, VT, kRefDequant>;
  LOWBIT_CUDA_CHECK("prefill_attention", cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                              bytes));
  kernel<<<grid, kThreads, bytes, stream>>>(a);
}

}  // namespace lowbit::cuda

// The explicit instances of head_dim D and K type K with every V type (one prefill_attention_sm90_d*_k*.cu each).
#define LOWBIT_PREFILL_SM90_INSTANCE(D, K, V) \
  template void launch_prefill_attention_sm90<D, KvType::K, KvType::V, false>(const PrefillTcArgs&, dim3, cudaStream_t);
#define LOWBIT_PREFILL_SM90_INSTANCES(D, K)  \
  namespace lowbit::cuda {                    \
  LOWBIT_PREFILL_SM90_INSTANCE(D, K, f16)     \
  LOWBIT_PREFILL_SM90_INSTANCE(D, K, u8)      \
  LOWBIT_PREFILL_SM90_INSTANCE(D, K, u4)      \
  LOWBIT_PREFILL_SM90_INSTANCE(D, K, u2)      \
  }
