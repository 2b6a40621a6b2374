// Token sampling on the GPU with the host sampler's exact semantics (cpp/kernels/cpu/sampling_cpu.cpp),
// so a decode step downloads 8 bytes per sequence instead of a row of vocabulary logits.
//
// Candidates are ordered by the 64-bit key (orderable bits of logit / temperature, then the inverted
// token id): larger key = better, ties go to the lower id, as on the host. top-k, top-p, min-p and the
// CDF walk each keep or pick a prefix of that order, so each is a threshold on the key, found by an
// MSB-first radix search over 4-bit digits: per pass, every thread histograms (count, probability
// mass) of the candidates that share the prefix found so far; the search stops as soon as the chosen
// bin holds one candidate. Masses are exp(s - top) summed in double, as on the host, in a fixed
// order (per-thread strided sums, then warps in order), so results do not vary from run to run.
#include <algorithm>
#include <cfloat>
#include <climits>
#include <cstdint>

#include <cooperative_groups.h>

#include "cuda/float_io.cuh"
#include "lowbit/cuda/check.h"
#include "lowbit/cuda/forward_kernels.h"

namespace lowbit::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256, kWarps = kThreads / 32, kBins = 16;

__device__ __forceinline__ uint64_t key_of(float s, int id) {
  uint32_t b = __float_as_uint(s);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);  // order-preserving map of floats to unsigned
  return (static_cast<uint64_t>(b) << 32) | static_cast<uint32_t>(0x7FFFFFFF - id);
}
__global__ void feed_sampled_kernel(int32_t* ids, const int32_t* feed, const int32_t* sampled, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    if (feed[i] >= 0) ids[i] = sampled[feed[i]];
}

__device__ __forceinline__ int id_of(uint64_t key) { return 0x7FFFFFFF - static_cast<int>(key & 0xFFFFFFFFu); }

struct RowView {
  const void* row;
  ScalarType dtype;
  int cols;
  float inv_t;       // 1 / temperature, as the host computes it
  float top;         // the best scaled logit
  uint64_t min_key;  // candidates below it are cut (top-k / top-p)
  double min_w;      // candidates with exp(s - top) below it are cut (min-p)
  __device__ float scaled(int i) const { return load_any(row, dtype, i) * inv_t; }
};

// Sum over the block of per-thread arrays; every thread gets the totals (fixed order: deterministic).
template <typename T>
__device__ void block_sum_bins(T (&v)[kBins], T (*scratch)[kBins]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int b = 0; b < kBins; ++b)
    for (int o = 16; o > 0; o >>= 1) v[b] += __shfl_xor_sync(0xffffffffu, v[b], o);
  __syncthreads();  // scratch may still be read by the previous call
  if (lane == 0)
#pragma unroll
    for (int b = 0; b < kBins; ++b) scratch[warp][b] = v[b];
  __syncthreads();
#pragma unroll
  for (int b = 0; b < kBins; ++b) {
    T t = 0;
    for (int w = 0; w < kWarps; ++w) t += scratch[w][b];
    v[b] = t;
  }
}

// The key of the candidate at which a prefix of the order (best first) reaches `target`:
// by count (by_mass false: the target-th best, target >= 1) or by mass (the first candidate whose
// running mass, itself included, is >= target, or > target when strict). When rounding leaves the
// target unreached, the last candidate is returned (the host's fallback).
__device__ uint64_t radix_select(const RowView& r, bool by_mass, double target, bool strict, double (*dscratch)[kBins],
                                 int (*iscratch)[kBins]) {
  uint64_t prefix = 0;
  double above = 0.0;  // count or mass of candidates better than the current prefix's range
  for (int shift = 60; shift >= 0; shift -= 4) {
    const uint64_t high_mask = shift == 60 ? 0 : ~((uint64_t(1) << (shift + 4)) - 1);
    double mass[kBins] = {};
    int count[kBins] = {};
    for (int i = threadIdx.x; i < r.cols; i += kThreads) {
      const float s = r.scaled(i);
      const uint64_t key = key_of(s, i);
      if (key < r.min_key || (key & high_mask) != prefix) continue;
      const double w = exp(static_cast<double>(s) - static_cast<double>(r.top));
      if (w < r.min_w) continue;
      const int d = static_cast<int>((key >> shift) & 0xF);
      mass[d] += w;
      count[d] += 1;
    }
    block_sum_bins(mass, dscratch);
    block_sum_bins(count, iscratch);
    int chosen = -1, last_nonempty = -1;
    for (int d = kBins - 1; d >= 0; --d) {
      if (count[d] == 0) continue;
      last_nonempty = d;
      const double amount = by_mass ? mass[d] : static_cast<double>(count[d]);
      const bool reached = strict ? above + amount > target : above + amount >= target;
      if (reached) {
        chosen = d;
        break;
      }
      above += amount;
    }
    if (chosen < 0) chosen = last_nonempty;  // rounding: the last candidate of the range
    prefix |= static_cast<uint64_t>(chosen) << shift;
    if (count[chosen] == 1 && shift > 0) {
      // One candidate left in the range: find it directly.
      const uint64_t mask = ~((uint64_t(1) << shift) - 1);
      __shared__ unsigned long long found;
      if (threadIdx.x == 0) found = 0;
      __syncthreads();
      for (int i = threadIdx.x; i < r.cols; i += kThreads) {
        const float s = r.scaled(i);
        const uint64_t key = key_of(s, i);
        if (key >= r.min_key && (key & mask) == prefix &&
            exp(static_cast<double>(s) - static_cast<double>(r.top)) >= r.min_w)
          found = key;  // exactly one thread writes
      }
      __syncthreads();
      const uint64_t k = found;
      __syncthreads();
      return k;
    }
  }
  return prefix;
}

// Whether (v, id) beats (best, best_id): a larger value, or an equal one at a lower index (the first index of the
// maximum, as on the host). The order of merging does not change the winner.
__device__ __forceinline__ bool beats(float v, int id, float best, int best_id) {
  return v > best || (v == best && id < best_id);
}

// The block's argmax over columns [begin, end) of the row (threads stride by kThreads); every thread gets it.
__device__ void block_argmax(const void* row, ScalarType dtype, int begin, int end, float& best, int& best_id,
                             float* fscratch, int* id_scratch) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  best = -FLT_MAX;
  best_id = INT_MAX;
  for (int i = begin + static_cast<int>(threadIdx.x); i < end; i += kThreads) {
    const float v = load_any(row, dtype, i);
    if (beats(v, i, best, best_id)) best = v, best_id = i;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, o);
    const int id = __shfl_xor_sync(0xffffffffu, best_id, o);
    if (beats(v, id, best, best_id)) best = v, best_id = id;
  }
  __syncthreads();  // the scratch may still be read by an earlier reduction
  if (lane == 0) fscratch[warp] = best, id_scratch[warp] = best_id;
  __syncthreads();
  best = fscratch[0];
  best_id = id_scratch[0];
  for (int w = 1; w < kWarps; ++w)
    if (beats(fscratch[w], id_scratch[w], best, best_id)) best = fscratch[w], best_id = id_scratch[w];
}

// The block's sum of exp(logit - best) over columns [begin, end) (per-thread strided sums, then warps in order);
// every thread gets it.
__device__ float block_sum_exp(const void* row, ScalarType dtype, int begin, int end, float best, float* fscratch) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float sum = 0.f;
  for (int i = begin + static_cast<int>(threadIdx.x); i < end; i += kThreads)
    sum += expf(load_any(row, dtype, i) - best);
  sum = warp_sum(sum);
  __syncthreads();
  if (lane == 0) fscratch[warp] = sum;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kWarps; ++w) total += fscratch[w];
  return total;
}

// The token of row r (greedy: best_id; otherwise the host sampler's top-k / top-p / min-p / CDF walk) and its
// logprob under the unmodified row, given the row's argmax and log-sum-exp. One block.
__device__ void sample_tail(const Rows& logits, const void* row, const double* params, int64_t r, float best,
                            int best_id, float log_total, int32_t* tokens, float* logprobs,
                            double (*dscratch)[kBins], int (*iscratch)[kBins]) {
  const int cols = static_cast<int>(logits.cols);
  const double* p = params + r * 5;
  const float temperature = static_cast<float>(p[0]);
  const int top_k = static_cast<int>(p[1]);
  const float top_p = static_cast<float>(p[2]), min_p = static_cast<float>(p[3]);
  const double uniform = p[4];
  int token = best_id;
  if (temperature != 0.f) {
    RowView v{row, logits.dtype, cols, 1.f / temperature, best * (1.f / temperature), 0, 0.0};
    // The best key: max scaled logit, lowest id. Scaling by a positive factor keeps the argmax.
    if (top_k > 0 && top_k < cols) v.min_key = radix_select(v, false, static_cast<double>(top_k), false, dscratch, iscratch);
    if (top_p < 1.f) {
      double kept = 0.0;  // mass of the top-k set
      double part[kBins] = {};
      for (int i = threadIdx.x; i < cols; i += kThreads) {
        const float s = v.scaled(i);
        if (key_of(s, i) >= v.min_key) part[0] += exp(static_cast<double>(s) - static_cast<double>(v.top));
      }
      block_sum_bins(part, dscratch);
      kept = part[0];
      v.min_key = radix_select(v, true, static_cast<double>(top_p) * kept, false, dscratch, iscratch);
    }
    if (min_p > 0.f) v.min_w = static_cast<double>(min_p);  // the best candidate (w = 1) always stays
    double part[kBins] = {};
    for (int i = threadIdx.x; i < cols; i += kThreads) {
      const float s = v.scaled(i);
      const double w = exp(static_cast<double>(s) - static_cast<double>(v.top));
      if (key_of(s, i) >= v.min_key && w >= v.min_w) part[0] += w;
    }
    block_sum_bins(part, dscratch);
    token = id_of(radix_select(v, true, uniform * part[0], true, dscratch, iscratch));
  }
  if (threadIdx.x == 0) {
    tokens[r] = token;
    logprobs[r] = load_any(row, logits.dtype, token) - best - log_total;
  }
}

// params per row: (temperature, top_k, top_p, min_p, uniform) as doubles holding the host's values.
__global__ void __launch_bounds__(kThreads)
    sample_kernel(Rows logits, const double* params, int32_t* tokens, float* logprobs) {
  __shared__ double dscratch[kWarps][kBins];
  __shared__ int iscratch[kWarps][kBins];
  __shared__ float fscratch[kWarps];
  __shared__ int id_scratch[kWarps];
  const int64_t r = blockIdx.x;
  const int cols = static_cast<int>(logits.cols);
  const void* row = static_cast<const char*>(logits.base) + r * logits.stride * float_bytes(logits.dtype);
  // Argmax of the raw logits (first index of the maximum) and the log-sum-exp, for greedy rows and
  // every row's logprob (of the unmodified logits).
  float best;
  int best_id;
  block_argmax(row, logits.dtype, 0, cols, best, best_id, fscratch, id_scratch);
  if (best_id == INT_MAX) best_id = 0;  // an all -inf / NaN row
  const float log_total = logf(block_sum_exp(row, logits.dtype, 0, cols, best, fscratch));
  sample_tail(logits, row, params, r, best, best_id, log_total, tokens, logprobs, dscratch, iscratch);
}

// sm_90, the same results with the row's scan spread over a cluster of kSampleCluster CTAs: one block scanning
// 128256 logits twice (argmax, then the sum of exp) took 81 us of a batch-1 8B step. CTA `rank` scans its
// contiguous chunk; the argmax is merged through distributed shared memory (the winner does not depend on the
// order: the same token for greedy rows), then every CTA sums exp(logit - best) over its chunk with the row's best,
// the per-element term of sample_kernel; rank 0 adds the chunk sums in rank order (a different summation order
// than one block's: the logprob may differ in its last bits) and finishes the row as sample_kernel does (sampled
// rows run their radix selects on rank 0 alone).
constexpr int kSampleCluster = 8;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
#endif

__global__ void __launch_bounds__(kThreads)
    sample_cluster_kernel(Rows logits, const double* params, int32_t* tokens, float* logprobs) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __shared__ double dscratch[kWarps][kBins];
  __shared__ int iscratch[kWarps][kBins];
  __shared__ float fscratch[kWarps];
  __shared__ int id_scratch[kWarps];
  __shared__ float cta_best, cta_sum;
  __shared__ int cta_id;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t r = blockIdx.x / kSampleCluster;
  const int cols = static_cast<int>(logits.cols);
  const void* row = static_cast<const char*>(logits.base) + r * logits.stride * float_bytes(logits.dtype);
  const int chunk = (cols + kSampleCluster - 1) / kSampleCluster;
  const int begin = min(cols, rank * chunk), end = min(cols, begin + chunk);
  float best;
  int best_id;
  block_argmax(row, logits.dtype, begin, end, best, best_id, fscratch, id_scratch);
  if (threadIdx.x == 0) cta_best = best, cta_id = best_id;
  cluster_sync_all();
  best = -FLT_MAX;
  best_id = INT_MAX;
  for (int k = 0; k < kSampleCluster; ++k) {
    const float v = *cluster.map_shared_rank(&cta_best, k);
    const int id = *cluster.map_shared_rank(&cta_id, k);
    if (beats(v, id, best, best_id)) best = v, best_id = id;
  }
  if (best_id == INT_MAX) best_id = 0;  // an all -inf / NaN row
  const float sum = block_sum_exp(row, logits.dtype, begin, end, best, fscratch);
  if (threadIdx.x == 0) cta_sum = sum;
  cluster_sync_all();  // every CTA's sum is published, and every CTA has read the argmaxes
  float total = 0.f;
  if (rank == 0)
    for (int k = 0; k < kSampleCluster; ++k) total += *cluster.map_shared_rank(&cta_sum, k);
  cluster_sync_all();  // rank 0 has read the sums: the other CTAs may leave
  if (rank != 0) return;
  sample_tail(logits, row, params, r, best, best_id, logf(total), tokens, logprobs, dscratch, iscratch);
#endif
}

// Row cluster mode (rows_cuda.cu's set_row_cluster_mode): 0 keeps one block per row.
bool use_sample_cluster(int64_t rows) {
  if (get_row_cluster_mode() == 0 || rows * kSampleCluster >= (int64_t(1) << 31)) return false;
  int device = 0;
  LOWBIT_CUDA_CHECK("sample_rows", cudaGetDevice(&device));
  return compute_capability_major(device) >= 9;
}

}  // namespace

void sample_rows(const Rows& logits, const double* params, int32_t* tokens, float* logprobs, cudaStream_t stream) {
  LOWBIT_CHECK(logits.cols > 0 && logits.cols < (int64_t(1) << 31) - 1, "sample_rows: vocabulary of ", logits.cols,
               " entries is outside 1..2^31-2");
  if (logits.rows == 0) return;
  LOWBIT_CHECK(logits.rows < (int64_t(1) << 31), "sample_rows: too many rows: ", logits.rows);
  if (use_sample_cluster(logits.rows)) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(logits.rows * kSampleCluster));
    cfg.blockDim = dim3(kThreads);
    cfg.stream = stream;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = kSampleCluster;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    LOWBIT_CUDA_CHECK("sample_rows", cudaLaunchKernelEx(&cfg, sample_cluster_kernel, logits, params, tokens, logprobs));
  } else {
    sample_kernel<<<static_cast<unsigned>(logits.rows), kThreads, 0, stream>>>(logits, params, tokens, logprobs);
  }
  LOWBIT_CUDA_CHECK_LAUNCH("sample_rows");
}

void feed_sampled_tokens(int32_t* ids, const int32_t* feed, const int32_t* sampled, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + threads - 1) / threads, 64));
  feed_sampled_kernel<<<blocks, threads, 0, stream>>>(ids, feed, sampled, n);
  LOWBIT_CUDA_CHECK_LAUNCH("feed_sampled_tokens");
}

}  // namespace lowbit::cuda
