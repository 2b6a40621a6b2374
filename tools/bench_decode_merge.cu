// Times the split merge of decode attention alone (decode_merge_sm80.cuh): the spread kernel against the per-head one
// (one block per (sequence, head), stats chunk, block max, then float4 columns), on random partials at
// the split counts decode_attention picks for Llama-3-8B heads (32 q heads, head_dim 128) on a 132-SM card, and checks
// that both give the same outputs. Then the op as a whole: the u4/u4 decode kernel (constant caches, as in
// tools/bench_decode_attention_variants.cu) at the split decode_attention picks, followed by the per-head merge, the
// spread one, and the spread one launched as a programmatic dependent (cuda/pdl.cuh: its launch and setup under the
// decode kernel's tail), and the decode kernel alone. Each timing: a CUDA graph of 100 launches (or 20 ops; no host
// launch cost between them), median of 7 replays, per launch: the kernels plus the gaps between graph nodes.
// Build and run on the device:
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I include -I cpp \
//     tools/bench_decode_merge.cu -o /tmp/dm && /tmp/dm
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/sm80/decode_attention_sm80.cuh"
#include "kernels/sm80/decode_merge_sm80.cuh"

using namespace lowbit::cuda;


template <typename Launch>
float time_us(Launch launch, int n = 100) {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  for (int i = 0; i < 3; ++i) launch(s);
  cudaGraph_t g;
  cudaGraphExec_t ge;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < n; ++i) launch(s);
  cudaError_t e = cudaStreamEndCapture(s, &g);
  if (e == cudaSuccess) e = cudaGraphInstantiate(&ge, g, 0);
  if (e != cudaSuccess) {
    printf("graph: %s\n", cudaGetErrorString(e));
    cudaGetLastError();
    cudaStreamDestroy(s);
    return -1.f;
  }
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ts;
  for (int r = 0; r < 8; ++r) {
    cudaEventRecord(a, s);
    cudaGraphLaunch(ge, s);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms;
    cudaEventElapsedTime(&ms, a, b);
    if (r) ts.push_back(ms * 1000.f / n);  // us per launch
  }
  std::sort(ts.begin(), ts.end());
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  return ts[ts.size() / 2];
}

// The op: the decode kernel (u4 K and V, head_dim 128, 32 q / 8 kv heads) and a merge, us per op.
void op(int B, int L, int split_tokens, int sms) {
  constexpr int D = 128, hq = 32, hkv = 8, bs = 16;
  const int per_seq = L / bs, blocks = B * per_seq, splits = (L + split_tokens - 1) / split_tokens;
  const size_t kvb = size_t(blocks) * hkv * bs * D / 2, pb = size_t(blocks) * hkv * bs * 8;
  uint8_t *k, *v;
  float *kp, *vp, *po, *ps;
  __half *q, *out;
  int *tables, *lens;
  cudaMalloc(&k, kvb); cudaMalloc(&v, kvb); cudaMemset(k, 0x5a, kvb); cudaMemset(v, 0x3c, kvb);
  cudaMalloc(&kp, pb); cudaMalloc(&vp, pb); cudaMemset(kp, 0, pb); cudaMemset(vp, 0, pb);
  cudaMalloc(&q, size_t(B) * hq * D * 2); cudaMemset(q, 0, size_t(B) * hq * D * 2);
  cudaMalloc(&out, size_t(B) * hq * D * 2);
  std::vector<int> tab(blocks);
  for (int i = 0; i < blocks; ++i) tab[i] = i;
  std::shuffle(tab.begin(), tab.end(), std::mt19937(1));
  cudaMalloc(&tables, blocks * 4); cudaMemcpy(tables, tab.data(), blocks * 4, cudaMemcpyHostToDevice);
  std::vector<int> ln(B, L);
  cudaMalloc(&lens, B * 4); cudaMemcpy(lens, ln.data(), B * 4, cudaMemcpyHostToDevice);
  cudaMalloc(&po, size_t(B) * hq * splits * D * 4); cudaMalloc(&ps, size_t(B) * hq * splits * 8);
  DecodeAttnArgs p{};
  p.q = q; p.k = k; p.v = v; p.k_params = kp; p.v_params = vp; p.block_tables = tables; p.seq_lens = lens; p.out = out;
  p.part_out = po; p.part_stats = ps; p.q_stride_b = hq * D; p.q_stride_h = D; p.out_stride_b = hq * D;
  p.out_stride_h = D; p.hq = hq; p.hkv = hkv; p.group = hq / hkv; p.block_size = bs; p.max_blocks = per_seq;
  p.split_tokens = split_tokens; p.num_splits = splits; p.slices = 1; p.block_shift = 4; p.tile_in_one_page = true;
  p.scale = 0.088f;
  const dim3 grid(B, hkv, splits);
  const int spread = decode_merge::merge_spread(int64_t(B) * hq, D, sms);
  const float2* st = reinterpret_cast<const float2*>(ps);
  auto decode = [&](cudaStream_t s) { launch_decode_attention<D, KvType::u4, KvType::u4>(p, grid, s); };
  auto merge_new = [&](cudaStream_t s, bool pdl) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(B, hq, spread);
    cfg.blockDim = dim3(decode_merge::kMergeThreads);
    cfg.stream = s;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = pdl ? 1 : 0;
    cudaLaunchKernelEx(&cfg, decode_merge::combine_splits_spread_kernel, static_cast<const float*>(po), st, splits, hq,
                       D, out, int64_t(hq) * D, int64_t(D), pdl);
  };
  const float t_alone = time_us(decode, 20);
  const float t_old = time_us([&](cudaStream_t s) {
    decode(s);
    decode_merge::combine_splits_kernel<<<dim3(B, hq), decode_merge::kCombineThreads, 0, s>>>(po, st, splits, hq, D, out,
                                                                                int64_t(hq) * D, int64_t(D), false);
  }, 20);
  const float t_new = time_us([&](cudaStream_t s) { decode(s); merge_new(s, false); }, 20);
  const float t_pdl = time_us([&](cudaStream_t s) { decode(s); merge_new(s, true); }, 20);
  const cudaError_t e = cudaGetLastError();
  printf("op B=%-3d L=%-6d splits=%-3d: decode alone %6.1f us; + per-head merge %6.1f (+%.1f), spread %6.1f (+%.1f), "
         "spread as PDL %6.1f (+%.1f)%s%s\n", B, L, splits, t_alone, t_old, t_old - t_alone, t_new, t_new - t_alone, t_pdl,
         t_pdl - t_alone, e ? " error: " : "", e ? cudaGetErrorString(e) : "");
  cudaFree(k); cudaFree(v); cudaFree(kp); cudaFree(vp); cudaFree(q); cudaFree(out); cudaFree(tables); cudaFree(lens);
  cudaFree(po); cudaFree(ps);
}

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);  // a crash or a timeout keeps what was printed
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  struct Cfg { int b, hq, splits, d; };
  // 1 x 128K (66 splits), 16 x 32K (4), 64 x 8K (2); then other small batches and head dims.
  for (Cfg c : {Cfg{1, 32, 66, 128}, Cfg{16, 32, 4, 128}, Cfg{64, 32, 2, 128}, Cfg{2, 32, 33, 128}, Cfg{4, 32, 17, 128},
                Cfg{1, 32, 66, 64}, Cfg{1, 16, 130, 256}}) {
    const size_t rows = size_t(c.b) * c.hq * c.splits;
    std::vector<float> po(rows * c.d), st(rows * 2);
    std::mt19937 rng(c.b * 7 + c.splits);
    std::normal_distribution<float> nd;
    for (auto& x : po) x = nd(rng);
    for (size_t r = 0; r < rows; ++r) {
      st[2 * r] = 3.f * nd(rng);
      st[2 * r + 1] = 1.f + std::fabs(nd(rng)) * 20.f;
    }
    float *dpo, *dst;
    __half *o_old, *o_new;
    cudaMalloc(&dpo, po.size() * 4);
    cudaMalloc(&dst, st.size() * 4);
    cudaMalloc(&o_old, size_t(c.b) * c.hq * c.d * 2);
    cudaMalloc(&o_new, size_t(c.b) * c.hq * c.d * 2);
    cudaMemcpy(dpo, po.data(), po.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dst, st.data(), st.size() * 4, cudaMemcpyHostToDevice);
    const int spread = decode_merge::merge_spread(int64_t(c.b) * c.hq, c.d, sms);
    const int64_t sb = int64_t(c.hq) * c.d, sh = c.d;
    auto run_old = [&](cudaStream_t s) {
      decode_merge::combine_splits_kernel<<<dim3(c.b, c.hq), decode_merge::kCombineThreads, 0, s>>>(
          dpo, reinterpret_cast<const float2*>(dst), c.splits, c.hq, c.d, o_old, sb, sh, false);
    };
    auto run_new = [&](cudaStream_t s) {
      decode_merge::combine_splits_spread_kernel<<<dim3(c.b, c.hq, spread), decode_merge::kMergeThreads, 0, s>>>(
          dpo, reinterpret_cast<const float2*>(dst), c.splits, c.hq, c.d, o_new, sb, sh, false);
    };
    const float t_old = time_us(run_old), t_new = time_us(run_new);
    std::vector<__half> a(size_t(c.b) * c.hq * c.d), b(a.size());
    cudaMemcpy(a.data(), o_old, a.size() * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(b.data(), o_new, b.size() * 2, cudaMemcpyDeviceToHost);
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double x = __half2float(a[i]), y = __half2float(b[i]);
      num += (x - y) * (x - y);
      den += x * x;
    }
    const cudaError_t e = cudaGetLastError();
    printf("B=%-3d hq=%d splits=%-3d d=%-3d spread %d: per head %6.2f us, spread kernel %6.2f us, rel diff %.1e%s%s\n", c.b,
           c.hq, c.splits, c.d, spread, t_old, t_new, std::sqrt(num / den), e ? " error: " : "",
           e ? cudaGetErrorString(e) : "");
    cudaFree(dpo); cudaFree(dst); cudaFree(o_old); cudaFree(o_new);
  }
  struct Op { int b, len, split; };  // decode_attention's plan on a 132-SM card: 66 / 4 / 2 splits
  for (Op c : {Op{1, 131072, 1996}, Op{16, 32768, 8192}, Op{64, 8192, 4096}}) op(c.b, c.len, c.split, sms);
  return 0;
}
