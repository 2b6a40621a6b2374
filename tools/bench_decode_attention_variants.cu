// Experiment harness for the decode attention kernel (decode_attention_sm80.cuh): instantiates variants the build
// does not (resident blocks per SM, V loaded a tile ahead, tiles per softmax step, score mma chains) at head_dim 128, 32 q / 8 kv heads, block 16, and times
// one launch of each with CUDA events (median of 30 after 3 warm-ups) at several split sizes. The caches hold
// constant bytes (timing only; the tests check results): the accumulator rescale, the one value-dependent branch,
// runs less often than on real data, so the variants compare with each other, not with bench_gpu_kv2.py. The
// split merge is not timed. Build and run on the device from the repository root:
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I include -I cpp \
//     tools/bench_decode_attention_variants.cu -o /tmp/dv && /tmp/dv
#include <cstdio>
#include <vector>
#include <random>
#include <algorithm>
#include "kernels/sm80/decode_attention_sm80.cuh"
using namespace lowbit::cuda;

template <KvType KT, KvType VT, int MB, bool VA, int SUB, int CH = 2, bool VM = false>
float run(int B, int L, int hq, int hkv, int split_tokens, int reps) {
  constexpr int D = 128; const int bs = 16;
  const int per_seq = (L + bs - 1) / bs, blocks = B * per_seq;
  const size_t kb = (size_t)blocks * hkv * bs * D * kv_bits<KT>() / 8, vb = (size_t)blocks * hkv * bs * D * kv_bits<VT>() / 8;
  uint8_t *k, *v; float *kp, *vp; __half *q, *out; int *tables, *lens; float *po, *ps;
  cudaMalloc(&k, kb); cudaMalloc(&v, vb); cudaMemset(k, 0x5a, kb); cudaMemset(v, 0x3c, vb);
  cudaMalloc(&kp, (size_t)blocks * hkv * bs * 8); cudaMalloc(&vp, (size_t)blocks * hkv * bs * 8);
  cudaMemset(kp, 0, (size_t)blocks * hkv * bs * 8); cudaMemset(vp, 0, (size_t)blocks * hkv * bs * 8);
  cudaMalloc(&q, (size_t)B * hq * D * 2); cudaMemset(q, 0, (size_t)B * hq * D * 2);
  cudaMalloc(&out, (size_t)B * hq * D * 2);
  std::vector<int> tab(blocks); for (int i = 0; i < blocks; ++i) tab[i] = i;
  std::shuffle(tab.begin(), tab.end(), std::mt19937(1));
  cudaMalloc(&tables, blocks * 4); cudaMemcpy(tables, tab.data(), blocks * 4, cudaMemcpyHostToDevice);
  std::vector<int> ln(B, L); cudaMalloc(&lens, B * 4); cudaMemcpy(lens, ln.data(), B * 4, cudaMemcpyHostToDevice);
  const int splits = (L + split_tokens - 1) / split_tokens;
  cudaMalloc(&po, (size_t)B * hq * splits * D * 4); cudaMalloc(&ps, (size_t)B * hq * splits * 8);
  DecodeAttnArgs p{};
  p.q = q; p.k = k; p.v = v; p.k_params = kp; p.v_params = vp; p.block_tables = tables; p.seq_lens = lens; p.out = out;
  p.part_out = po; p.part_stats = ps; p.q_stride_b = hq * D; p.q_stride_h = D; p.out_stride_b = hq * D; p.out_stride_h = D;
  p.hq = hq; p.hkv = hkv; p.group = hq / hkv; p.block_size = bs; p.max_blocks = per_seq; p.split_tokens = split_tokens;
  p.num_splits = splits; p.slices = (p.group + 7) / 8; p.block_shift = 4; p.tile_in_one_page = true; p.scale = 0.088f;
  dim3 grid(B, hkv * p.slices, splits);
  auto kern = decode_attn::decode_attention_kernel<KT, VT, D, MB, VA, SUB, CH, VM>;
  for (int i = 0; i < 3; ++i) kern<<<grid, decode_attn::kThreads>>>(p);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<float> ts;
  for (int r = 0; r < reps; ++r) {
    cudaEventRecord(a); kern<<<grid, decode_attn::kThreads>>>(p); cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); ts.push_back(ms * 1000);
  }
  std::sort(ts.begin(), ts.end());
  cudaError_t e = cudaGetLastError(); if (e) printf("err %s\n", cudaGetErrorString(e));
  cudaFree(k); cudaFree(v); cudaFree(kp); cudaFree(vp); cudaFree(q); cudaFree(out); cudaFree(tables); cudaFree(lens); cudaFree(po); cudaFree(ps);
  return ts[ts.size() / 2];
}

int main() {
  struct Cfg { int B, L, split; };
  // The shipped per-token 4- and 2-bit builds (u4/u4 at 4 blocks; u2/u2 at 3 with V a tile ahead), each with the score
  // mma in two independent chains and in one (the default since measured here), at the split sizes decode_attention
  // picks; u4/u4 also with the next tile's V issued mid-tile (Vmid: spills 8 bytes at 4 blocks, one chain).
  for (Cfg c : {Cfg{64, 8192, 4096}, Cfg{1, 131072, 2048}, Cfg{16, 32768, 4096}, Cfg{256, 1536, 1536}}) {
    printf("B=%d L=%d split=%d\n", c.B, c.L, c.split);
    printf("  u4/u4  mb4 ch2       %8.1f us\n", run<KvType::u4, KvType::u4, 4, false, 1, 2>(c.B, c.L, 32, 8, c.split, 30));
    printf("  u4/u4  mb4 ch1       %8.1f us\n", run<KvType::u4, KvType::u4, 4, false, 1, 1>(c.B, c.L, 32, 8, c.split, 30));
    printf("  u4/u4  mb4 ch1 Vmid  %8.1f us\n", run<KvType::u4, KvType::u4, 4, false, 1, 1, true>(c.B, c.L, 32, 8, c.split, 30));
    printf("  u2/u2  mb3 Vahd ch2  %8.1f us\n", run<KvType::u2, KvType::u2, 3, true, 1, 2>(c.B, c.L, 32, 8, c.split, 30));
    printf("  u2/u2  mb3 Vahd ch1  %8.1f us\n", run<KvType::u2, KvType::u2, 3, true, 1, 1>(c.B, c.L, 32, 8, c.split, 30));
  }
}
