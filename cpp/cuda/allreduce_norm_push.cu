// The all-reduce fused with the residual add and the RMSNorm after a row-parallel linear, over peer pushes
// (cuda/allreduce_norm_push.h: the protocol, and why the step and the inbox halves keep it safe).
//
// One block per row. Each thread loads its 16-byte packs of this rank's partial row, stores them into every peer's
// inbox as LL lines (two 16-byte lines per pack: data, step, data, step), then polls its own inbox until every peer's
// lines of those packs carry the step, sums the ranks in rank order (f32, rounded to the rows' dtype: the bytes an
// all-reduce writes), adds the residual (rounded again, as add_rms_norm does), and the block normalizes the row it
// holds in registers.
#include <algorithm>

#include "cuda/allreduce_norm_push.h"
#include "cuda/allreduce_oneshot.cuh"
#include "cuda/float_io.cuh"
#include "cuda/pdl.cuh"
#include "cuda/quantize_code.cuh"
#include "lowbit/cuda/check.h"

namespace lowbit::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kPacks = 4;     // 16-byte packs per thread: rows up to 2048 packs (16384 f16 / 8192 f32 columns)
constexpr int kMaxRows = 64;  // one block per row, each waiting for its peers' blocks: keep the grid resident
enum class Out { rows, int8, e4m3 };

// One LL line: data words d0, d1, each beside the step (an aligned 8-byte half lands whole over NVLink).
__device__ __forceinline__ void store_line(uint4* p, uint32_t d0, uint32_t d1, uint32_t step) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d0), "r"(step), "r"(d1), "r"(step)
               : "memory");
}
__device__ __forceinline__ uint4 load_line(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

template <typename T, typename W, Out kOut>
__global__ void __launch_bounds__(kThreads) push_norm_kernel(PushNormArgs a, ReduceNormRows n) {
  // The GEMM that reads `out` may launch and prefetch its weights meanwhile, as after add_rms_norm. Safe with the
  // waits below: the trigger takes effect only once every block of this grid (<= kMaxRows) has issued it, i.e. is
  // resident, and the dependent waits for this grid to complete before it reads anything.
  pdl_allow_dependents();
  constexpr int kVec = Pack<T>::kVec;
  __shared__ uint32_t s_step;
  if (threadIdx.x == 0) {
    const uint32_t step = a.counters[0] + 1;  // the same for every block: it advances only once all have read it
    s_step = step;
    if (atomicAdd(&a.counters[1], 1u) + 1 == gridDim.x) {  // the last block to read it: the next call's step
      a.counters[1] = 0;
      a.counters[0] = step;
    }
  }
  __syncthreads();
  const uint32_t step = s_step;
  const int64_t r = blockIdx.x;
  const int packs = int(n.cols / kVec);
  char* own = static_cast<char*>(a.own_inbox);
  // pack p of this row from `sender` in an inbox: the first of its two lines
  // (captured by value: a reference to the kernel's parameters would copy them all to local memory)
  const int64_t from_bytes = 2 * a.capacity, half = int64_t(step & 1u) * from_bytes * a.world;
  auto line = [=](char* inbox, int sender, int p) {
    return reinterpret_cast<uint4*>(inbox + half + sender * from_bytes) + 2 * (r * packs + p);
  };
  const uint4* in = reinterpret_cast<const uint4*>(static_cast<const T*>(n.partial) + r * n.ld_partial);
  T* res = static_cast<T*>(n.residual) + r * n.ld_residual;

  // 1. this rank's packs pushed to every peer; the residual's packs (they do not depend on the peers) are loaded
  // meanwhile and parked in shared memory, so that the registers hold only the sum while the block waits
  __shared__ uint4 s_res[kPacks * kThreads];
  uint4 mine[kPacks], rv[kPacks];
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int p = threadIdx.x + j * kThreads;
    if (p < packs) {
      mine[j] = in[p];
      rv[j] = reinterpret_cast<const uint4*>(res)[p];
    }
  }
#pragma unroll
  for (int q = 0; q < kOneShotMaxWorld; ++q) {  // static indices, as above
    if (q >= a.world || q == a.rank) continue;
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      const int p = threadIdx.x + j * kThreads;
      if (p < packs) {
        uint4* dst = line(static_cast<char*>(a.inbox[q]), a.rank, p);
        store_line(dst, mine[j].x, mine[j].y, step);
        store_line(dst + 1, mine[j].z, mine[j].w, step);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kPacks; ++j)
    if (threadIdx.x + j * kThreads < packs) s_res[threadIdx.x + j * kThreads] = rv[j];  // each thread its own packs

  // 2. sum over ranks in rank order, each peer's packs once its lines carry the step
  float v[kPacks][kVec];
#pragma unroll
  for (int j = 0; j < kPacks; ++j)
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[j][i] = 0.f;
#pragma unroll
  for (int q = 0; q < kOneShotMaxWorld; ++q) {
    if (q >= a.world) continue;
    uint4 got[kPacks];
    if (q == a.rank) {
#pragma unroll
      for (int j = 0; j < kPacks; ++j) got[j] = mine[j];
    } else {
      for (uint32_t spins = 1;; ++spins) {
        bool all = true;
#pragma unroll
        for (int j = 0; j < kPacks; ++j) {
          const int p = threadIdx.x + j * kThreads;
          if (p < packs) {
            const uint4* src = line(own, q, p);
            const uint4 l0 = load_line(src), l1 = load_line(src + 1);
            all = all && l0.y == step && l0.w == step && l1.y == step && l1.w == step;
            got[j] = make_uint4(l0.x, l0.z, l1.x, l1.z);
          }
        }
        if (all || ((spins & 1023u) == 0 && *a.abort)) break;  // the group failed: leave garbage, do not hang
      }
    }
#pragma unroll
    for (int j = 0; j < kPacks; ++j)
      if (threadIdx.x + j * kThreads < packs) Pack<T>::add(got[j], v[j]);
  }

  // 3. add the residual (rounded as add_rms_norm), then the norm
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kPacks; ++j) {
    const int p = threadIdx.x + j * kThreads;
    if (p < packs) {
      float old[kVec];
#pragma unroll
      for (int i = 0; i < kVec; ++i) old[i] = 0.f;
      Pack<T>::add(s_res[p], old);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        v[j][i] = round_to<T>(old[i] + round_to<T>(v[j][i]));
        ss += v[j][i] * v[j][i];
      }
      reinterpret_cast<uint4*>(res)[p] = Pack<T>::round(v[j]);  // exact: v holds T values
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) v[j][i] = 0.f;
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

}  // namespace

int64_t push_norm_inbox_bytes(int world, int64_t capacity) { return 2 * int64_t(world) * 2 * capacity; }

bool push_add_rms_norm_fits(const PushNormArgs& a, const ReduceNormRows& n, const char** why) {
  const char* no = nullptr;
  const bool float_rows = n.dtype == ScalarType::f32 || n.dtype == ScalarType::f16 || n.dtype == ScalarType::bf16;
  const int elem = float_rows ? float_bytes(n.dtype) : 1;
  const int vec = 16 / elem;
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
  else if (n.rows > kMaxRows)
    no = "more rows than the kernel runs at once";
  else if (n.rows * n.cols * elem > a.capacity)
    no = "the rows exceed the group's inbox";
  else if (n.q && (n.dtype != ScalarType::f16 || (n.q_type != ScalarType::s8 && n.q_type != ScalarType::e4m3)))
    no = "codes need f16 rows and s8 or e4m3 codes";
  if (why) *why = no;
  return no == nullptr;
}

void push_add_rms_norm(const PushNormArgs& a, const ReduceNormRows& n, cudaStream_t stream) {
  constexpr const char* op = "push_add_rms_norm";
  const char* why = nullptr;
  LOWBIT_CHECK(a.world >= 2 && a.world <= kOneShotMaxWorld && a.rank >= 0 && a.rank < a.world, op,
               ": bad group (rank ", a.rank, " of ", a.world, ")");
  LOWBIT_CHECK(push_add_rms_norm_fits(a, n, &why), op, ": ", why, " (", n.rows, " x ", n.cols, " ",
               name_of(n.dtype), ")");
  LOWBIT_CHECK((n.out != nullptr) != (n.q != nullptr) && (!n.q || n.scales), op, ": give either out or q and scales");
  for (const void* p : {n.partial, static_cast<const void*>(n.residual), static_cast<const void*>(n.out)})
    LOWBIT_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, op, ": rows must start 16-byte aligned");
  const unsigned grid = unsigned(n.rows);
  const bool w32 = n.weight_dtype == ScalarType::f32;
  if (n.q) {  // f16 rows (checked by fits)
    const bool fp8 = n.q_type == ScalarType::e4m3;
    if (w32 && fp8) push_norm_kernel<__half, float, Out::e4m3><<<grid, kThreads, 0, stream>>>(a, n);
    else if (w32) push_norm_kernel<__half, float, Out::int8><<<grid, kThreads, 0, stream>>>(a, n);
    else if (fp8) push_norm_kernel<__half, __half, Out::e4m3><<<grid, kThreads, 0, stream>>>(a, n);
    else push_norm_kernel<__half, __half, Out::int8><<<grid, kThreads, 0, stream>>>(a, n);
  } else {
    dispatch_float(n.dtype, op, [&](auto tag) {
      using T = decltype(tag);
      if (w32)
        push_norm_kernel<T, float, Out::rows><<<grid, kThreads, 0, stream>>>(a, n);
      else
        push_norm_kernel<T, T, Out::rows><<<grid, kThreads, 0, stream>>>(a, n);
    });
  }
  LOWBIT_CUDA_CHECK_LAUNCH(op);
}

}  // namespace lowbit::cuda
