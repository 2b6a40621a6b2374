// The one-shot all-reduce fused with the residual add and the RMSNorm after a row-parallel linear
// (cuda/allreduce_oneshot.h: the protocol, and why each slot's step counter keeps it safe).
//
// One block per row. The row is staged in 16-byte packs into the row's slots (slot bytes = capacity / max_blocks;
// a row of 8192 f16 takes 2 slots of the default 512 KiB group), each slot signalled and awaited on its own flag words,
// then every thread sums its packs over the ranks in rank order (f32, rounded to the rows' dtype: the bytes
// oneshot_all_reduce writes), adds the residual (rounded again, as add_rms_norm does), and the block normalizes the
// row it holds in registers. Replaces all-reduce + add_rms_norm (two launches, the sum written and read back).
#include <algorithm>

#include "cuda/allreduce_oneshot.cuh"
#include "cuda/float_io.cuh"
#include "cuda/pdl.cuh"
#include "cuda/quantize_code.cuh"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kPacks = 8;  // 16-byte packs per thread: rows up to 2048 packs (16384 f16 / 8192 f32 columns)
enum class Out { rows, int8, e4m3 };

template <typename T, typename W, Out kOut>
__global__ void __launch_bounds__(kThreads) oneshot_norm_kernel(OneShotArgs a, OneShotNormRows n, int per_row,
                                                                int64_t slot_bytes) {
  // The GEMM that reads `out` may launch and prefetch its weights meanwhile, as after add_rms_norm. Safe with the
  // spin below: the trigger takes effect only once every block of this grid (<= kOneShotMaxBlocks) has issued it,
  // i.e. is resident, and the dependent waits for this grid to complete before it reads anything.
  pdl_allow_dependents();
  constexpr int kVec = Pack<T>::kVec;
  __shared__ uint32_t s_step[kOneShotMaxBlocks];
  const int64_t r = blockIdx.x;
  const int first = int(r) * per_row;  // this row's slots: first .. first + per_row - 1
  if (threadIdx.x < per_row) {         // only this block touches these counters in this kernel
    const uint32_t e = a.counters[first + threadIdx.x] + 1;
    a.counters[first + threadIdx.x] = e;
    s_step[threadIdx.x] = e;
  }
  __syncthreads();
  const int packs = int(n.cols / kVec);
  const uint4* in = reinterpret_cast<const uint4*>(static_cast<const T*>(n.partial) + r * n.ld_partial);
  T* res = static_cast<T*>(n.residual) + r * n.ld_residual;
  // where pack p of this row lives in rank q's staging (its slot's half by that slot's step parity)
  auto staged = [&](int q, int p) {
    const int64_t byte = int64_t(p) * 16, piece = byte / slot_bytes;
    return reinterpret_cast<uint4*>(static_cast<char*>(a.staging[q]) + (s_step[piece] & 1u) * a.capacity +
                                    (first + piece) * slot_bytes + (byte - piece * slot_bytes));
  };

  // 1. stage this rank's row; the residual's packs are loaded meanwhile (they do not depend on the peers)
  uint4 rv[kPacks];
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int p = threadIdx.x + j * kThreads;
    if (p < packs) {
      *staged(a.rank, p) = in[p];
      rv[j] = reinterpret_cast<const uint4*>(res)[p];
    }
  }
  __syncthreads();  // the whole row is staged before any thread signals

  // 2. per (slot, peer): signal the peer's flag word of that slot, then wait for the peer's signal in ours
  const int pairs = per_row * a.world;
  __threadfence_system();  // the block's staging stores (ordered before by the barrier) before the flags
  for (int t = threadIdx.x; t < pairs; t += kThreads) {
    const int piece = t / a.world, q = t % a.world;
    if (q != a.rank) store_release_sys(a.flags[q] + (first + piece) * kOneShotMaxWorld + a.rank, s_step[piece]);
  }
  for (int t = threadIdx.x; t < pairs; t += kThreads) {
    const int piece = t / a.world, q = t % a.world;
    if (q == a.rank) continue;
    const uint32_t* flag = a.flags[a.rank] + (first + piece) * kOneShotMaxWorld + q;
    const uint32_t step = s_step[piece];
    for (uint32_t spins = 1; int32_t(load_acquire_sys(flag) - step) < 0; ++spins)
      if ((spins & 1023u) == 0 && *a.abort) break;  // the group failed: leave garbage instead of hanging
  }
  __syncthreads();  // every peer's row is visible to the whole block

  // 3. sum over ranks in rank order (rounded as the all-reduce rounds), add the residual (rounded as add_rms_norm)
  float v[kPacks][kVec];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int p = threadIdx.x + j * kThreads;
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[j][i] = 0.f;
    if (p < packs) {
#pragma unroll
      for (int q = 0; q < kOneShotMaxWorld; ++q)
        if (q < a.world) Pack<T>::add(__ldcg(staged(q, p)), v[j]);
      float old[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) old[i] = 0.f;
      Pack<T>::add(rv[j], old);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        v[j][i] = round_to<T>(old[i] + round_to<T>(v[j][i]));
        ss += v[j][i] * v[j][i];
      }
      reinterpret_cast<uint4*>(res)[p] = Pack<T>::round(v[j]);  // exact: v holds T values
    }
  }
  const float total = block_reduce<kThreads, false>(ss);
  const float inv = static_cast<float>(1.0 / sqrt(static_cast<double>(total) / static_cast<double>(n.cols) + n.eps));
  const W* w = static_cast<const W*>(n.weight);
  if constexpr (kOut == Out::rows) {
    uint4* out = reinterpret_cast<uint4*>(static_cast<T*>(n.out) + r * n.ld_out);
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int p = threadIdx.x + j * kThreads;
      if (p < packs) {
#pragma unroll
        for (int i = 0; i < kVec; ++i) v[j][i] = v[j][i] * inv * load_f32(w + p * kVec + i);
        out[p] = Pack<T>::round(v[j]);
      }
    }
  } else {
    // as the norm that quantizes: the normed value rounded to T, a per-row scale max|x| / qmax, one code each
    constexpr bool kFp8 = kOut == Out::e4m3;
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int p = threadIdx.x + j * kThreads;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        v[j][i] = p < packs ? round_to<T>(v[j][i] * inv * load_f32(w + p * kVec + i)) : 0.f;
        amax = fmaxf(amax, fabsf(v[j][i]));
      }
    }
    amax = block_reduce<kThreads, true>(amax);
    const float s = row_scale<kFp8>(amax);
    if (threadIdx.x == 0) n.scales[r] = s;
    uint8_t* qrow = static_cast<uint8_t*>(n.q) + r * n.ldq;
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int p = threadIdx.x + j * kThreads;
      if (p < packs)
#pragma unroll
        for (int i = 0; i < kVec; ++i)
          qrow[p * kVec + i] = static_cast<uint8_t>(quantize_code<kFp8>(__fdiv_rn(v[j][i], s)));
    }
  }
}

int64_t slot_bytes_of(const OneShotArgs& a) { return a.capacity / a.max_blocks; }

}  // namespace

bool oneshot_add_rms_norm_fits(const OneShotArgs& a, const OneShotNormRows& n, const char** why) {
  const char* no = nullptr;
  const bool float_rows = n.dtype == ScalarType::f32 || n.dtype == ScalarType::f16 || n.dtype == ScalarType::bf16;
  const int elem = float_rows ? float_bytes(n.dtype) : 1;
  const int vec = 16 / elem;
  const int64_t slot = slot_bytes_of(a), row_bytes = n.cols * elem;
  if (!float_rows)
    no = "rows are not f32, f16 or bf16";
  else if (n.weight_dtype != n.dtype && n.weight_dtype != ScalarType::f32)
    no = "the norm weight is neither f32 nor the rows' dtype";
  else if (n.rows < 1 || n.cols < 1 || n.cols % vec != 0)
    no = "rows are not whole 16-byte packs";
  else if (n.cols / vec > int64_t(kPacks) * kThreads)
    no = "rows are wider than the kernel holds in registers";
  else if (n.ld_partial % vec || n.ld_residual % vec || (n.out && n.ld_out % vec))
    no = "row strides are not whole 16-byte packs";
  else if (n.rows * ((row_bytes + slot - 1) / slot) > a.max_blocks)
    no = "more row slots than the group has";
  else if (n.q && (n.dtype != ScalarType::f16 || (n.q_type != ScalarType::s8 && n.q_type != ScalarType::e4m3)))
    no = "codes need f16 rows and s8 or e4m3 codes";
  if (why) *why = no;
  return no == nullptr;
}

void oneshot_add_rms_norm(const OneShotArgs& a, const OneShotNormRows& n, cudaStream_t stream) {
  constexpr const char* op = "oneshot_add_rms_norm";
  const char* why = nullptr;
  LOWBIT_CHECK(a.world >= 2 && a.world <= kOneShotMaxWorld && a.rank >= 0 && a.rank < a.world, op,
               ": bad group (rank ", a.rank, " of ", a.world, ")");
  LOWBIT_CHECK(oneshot_add_rms_norm_fits(a, n, &why), op, ": ", why, " (", n.rows, " x ", n.cols, " ",
               name_of(n.dtype), ")");
  LOWBIT_CHECK((n.out != nullptr) != (n.q != nullptr) && (!n.q || n.scales), op, ": give either out or q and scales");
  for (const void* p : {n.partial, static_cast<const void*>(n.residual), static_cast<const void*>(n.out)})
    LOWBIT_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, op, ": rows must start 16-byte aligned");
  const int64_t slot = slot_bytes_of(a);
  const int per_row = int((n.cols * float_bytes(n.dtype) + slot - 1) / slot);
  const unsigned grid = unsigned(n.rows);
  const bool w32 = n.weight_dtype == ScalarType::f32;
  if (n.q) {  // f16 rows (checked by fits)
    const bool fp8 = n.q_type == ScalarType::e4m3;
    if (w32 && fp8) oneshot_norm_kernel<__half, float, Out::e4m3><<<grid, kThreads, 0, stream>>>(a, n, per_row, slot);
    else if (w32) oneshot_norm_kernel<__half, float, Out::int8><<<grid, kThreads, 0, stream>>>(a, n, per_row, slot);
    else if (fp8) oneshot_norm_kernel<__half, __half, Out::e4m3><<<grid, kThreads, 0, stream>>>(a, n, per_row, slot);
    else oneshot_norm_kernel<__half, __half, Out::int8><<<grid, kThreads, 0, stream>>>(a, n, per_row, slot);
  } else {
    dispatch_float(n.dtype, op, [&](auto tag) {
      using T = decltype(tag);
      if (w32)
        oneshot_norm_kernel<T, float, Out::rows><<<grid, kThreads, 0, stream>>>(a, n, per_row, slot);
      else
        oneshot_norm_kernel<T, T, Out::rows><<<grid, kThreads, 0, stream>>>(a, n, per_row, slot);
    });
  }
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

}  // namespace lowbit::cuda
