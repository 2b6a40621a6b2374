// Times (or runs once, for a profiler) the shipped per-token decode attention instances (u4/u4 and u2/u2 as
// launch_decode_attention builds them: the shared-memory ring where ring_stages() gives one; -DRING_VARIANTS: ring
// variants) at head_dim 128, 32 q / 8 kv heads, block 16, over caches of random codes
// and per-token (scale, zero) of realistic size (so the running max moves as on real data). The split merge is not
// run. Median of 30 launches (CUDA events) after 3 warm-ups; the 30 (event, launch, event) triples are queued before
// the first is waited on, so a busy host CPU cannot open gaps between an event and its launch. Built against
// whichever decode_attention_sm80.cuh the include path finds first (one that has ring_stages() and the bulk flag), so
// one source times two versions of it in one device call:
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I include -I cpp \
//     tools/bench_decode_attention_shipped.cu -o /tmp/ds && /tmp/ds [time|once]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/sm80/decode_attention_sm80.cuh"
using namespace lowbit::cuda;

__global__ void fill_bytes(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15; x *= 2246822519u; x ^= x >> 13;
    p[i] = static_cast<uint8_t>(x);
  }
}
// (scale, zero) per token: scale in [0.01, 0.03), zero in [-0.5, 0.5) (what kv_write produces for unit-size K/V).
__global__ void fill_params(float2* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15; x *= 2246822519u; x ^= x >> 13;
    p[i] = make_float2(0.01f + 0.02f * (x & 0xffff) / 65536.f, (x >> 16) / 65536.f - 0.5f);
  }
}
__global__ void fill_half(__half* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15; x *= 2246822519u; x ^= x >> 13;
    p[i] = __float2half(2.f * (x & 0xffff) / 65536.f - 1.f);
  }
}

bool g_pages_in_order = false;  // sweep: page i of the table is cache block i (else a fixed shuffle)

template <KvType KT, KvType VT, int MB, bool VA, int RING = 0, int CH = 1, int L2 = 0, bool BULK = false>
float run(int B, int L, int split_tokens, int reps) {
  constexpr int D = 128, hq = 32, hkv = 8, bs = 16;
  const int per_seq = (L + bs - 1) / bs, blocks = B * per_seq;
  const size_t rows = size_t(blocks) * hkv * bs;
  const size_t kb = rows * D * kv_bits<KT>() / 8, vb = rows * D * kv_bits<VT>() / 8;
  uint8_t *k, *v; float2 *kp, *vp; __half *q, *out; int *tables, *lens; float *po, *ps;
  cudaMalloc(&k, kb); cudaMalloc(&v, vb);
  cudaMalloc(&kp, rows * 8); cudaMalloc(&vp, rows * 8);
  cudaMalloc(&q, size_t(B) * hq * D * 2); cudaMalloc(&out, size_t(B) * hq * D * 2);
  fill_bytes<<<1024, 256>>>(k, kb, 1); fill_bytes<<<1024, 256>>>(v, vb, 2);
  fill_params<<<1024, 256>>>(kp, rows, 3); fill_params<<<1024, 256>>>(vp, rows, 4);
  fill_half<<<64, 256>>>(q, size_t(B) * hq * D, 5);
  std::vector<int> tab(blocks);
  for (int i = 0; i < blocks; ++i) tab[i] = g_pages_in_order ? i : (i * 7 + 3) % blocks;
  cudaMalloc(&tables, blocks * 4); cudaMemcpy(tables, tab.data(), blocks * 4, cudaMemcpyHostToDevice);
  std::vector<int> ln(B, L);
  cudaMalloc(&lens, B * 4); cudaMemcpy(lens, ln.data(), B * 4, cudaMemcpyHostToDevice);
  const int splits = (L + split_tokens - 1) / split_tokens;
  cudaMalloc(&po, size_t(B) * hq * splits * D * 4); cudaMalloc(&ps, size_t(B) * hq * splits * 8);
  DecodeAttnArgs p{};
  p.q = q; p.k = k; p.v = v; p.k_params = reinterpret_cast<float*>(kp); p.v_params = reinterpret_cast<float*>(vp);
  p.block_tables = tables; p.seq_lens = lens; p.out = out; p.part_out = po; p.part_stats = ps;
  p.q_stride_b = hq * D; p.q_stride_h = D; p.out_stride_b = hq * D; p.out_stride_h = D;
  p.hq = hq; p.hkv = hkv; p.group = hq / hkv; p.block_size = bs; p.max_blocks = per_seq; p.split_tokens = split_tokens;
  p.num_splits = splits; p.slices = 1; p.block_shift = 4; p.tile_in_one_page = true; p.scale = 0.0883883f;
  dim3 grid(B, hkv, splits);
  auto kern = decode_attn::decode_attention_kernel<KT, VT, D, MB, VA, 1, CH, false, RING, L2, BULK>;
  // A ring larger than static shared memory allows takes it as dynamic shared memory.
  constexpr int dyn = decode_attn::decode_dynamic_smem<KT, VT, D, 1, RING, BULK>();
  if (dyn > 0) cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn);
  std::vector<float> ts;
  if (reps == 0) {
    kern<<<grid, decode_attn::kThreads, dyn>>>(p);
    ts.push_back(0.f);
  } else {
    for (int i = 0; i < 3; ++i) kern<<<grid, decode_attn::kThreads, dyn>>>(p);
    cudaDeviceSynchronize();
    std::vector<cudaEvent_t> ev(2 * reps);
    for (auto& e : ev) cudaEventCreate(&e);
    for (int r = 0; r < reps; ++r) {
      cudaEventRecord(ev[2 * r]); kern<<<grid, decode_attn::kThreads, dyn>>>(p); cudaEventRecord(ev[2 * r + 1]);
    }
    cudaEventSynchronize(ev.back());
    for (int r = 0; r < reps; ++r) {
      float ms; cudaEventElapsedTime(&ms, ev[2 * r], ev[2 * r + 1]); ts.push_back(ms * 1000);
    }
    for (auto& e : ev) cudaEventDestroy(e);
  }
  cudaDeviceSynchronize();
  cudaError_t e = cudaGetLastError(); if (e) printf("err %s\n", cudaGetErrorString(e));
  cudaFree(k); cudaFree(v); cudaFree(kp); cudaFree(vp); cudaFree(q); cudaFree(out); cudaFree(tables); cudaFree(lens);
  cudaFree(po); cudaFree(ps);
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

// The split size of u4/u4 and u2/u2 as shipped at four shapes (what the op's split plan picks and the others), u4/u4
// with pages in order (a DRAM-locality probe), and ring depth / L2 prefetch hint at 64 x 8K.
void sweep() {
  struct Cfg { int B, L; std::vector<int> splits; };
  for (const Cfg& c : {Cfg{64, 8192, {4096, 8192}}, Cfg{1, 131072, {2000, 2624, 4000, 5472}},
                       Cfg{16, 32768, {8192, 16384}}, Cfg{4, 131072, {8192, 16384}}}) {
    for (int split : c.splits)
      printf("B=%d L=%d split=%5d  u4/u4 %7.1f us  u2/u2 %7.1f us\n", c.B, c.L, split,
             run<KvType::u4, KvType::u4, 4, false, 4>(c.B, c.L, split, 30),
             run<KvType::u2, KvType::u2, 3, false, 4>(c.B, c.L, split, 30));
  }
  g_pages_in_order = true;
  printf("pages in order: 64 x 8K u4/u4 %7.1f us (4096), 1 x 128K %7.1f us (2000)\n",
         run<KvType::u4, KvType::u4, 4, false, 4>(64, 8192, 4096, 30), run<KvType::u4, KvType::u4, 4, false, 4>(1, 131072, 2000, 30));
  g_pages_in_order = false;
  printf("64 x 8K u4/u4: ring5 %7.1f us, L2::256B %7.1f us\n", run<KvType::u4, KvType::u4, 4, false, 5>(64, 8192, 4096, 30),
         run<KvType::u4, KvType::u4, 4, false, 4, 1, 256>(64, 8192, 4096, 30));
}

int main(int argc, char** argv) {
  if (argc > 1 && !strcmp(argv[1], "sweep")) return sweep(), 0;
  // once B L split [lanes|bulk]: one launch of u4/u4's ring (for a profiler) with the lanes' copies (the default) or
  // with bulk copies.
  if (argc > 4 && !strcmp(argv[1], "once")) {
    constexpr int kR44 = decode_attn::ring_stages<128, KvType::u4, KvType::u4>();
    const bool bulk = argc > 5 && !strcmp(argv[5], "bulk");
    const int B = atoi(argv[2]), L = atoi(argv[3]), split = atoi(argv[4]);
    if (!bulk)
      run<KvType::u4, KvType::u4, 4, false, kR44, 1, 0, false>(B, L, split, 0);
    else
      run<KvType::u4, KvType::u4, 4, false, kR44, 1, 0, true>(B, L, split, 0);
    return 0;
  }
  // ab: the ring with the lanes' copies against bulk copies (u4/u4 and u2/u2 as shipped otherwise) at the splits the
  // op's plan picks on an H200 and the next ones (a whole wave where it takes half), alternated twice in one process.
  if (argc > 1 && !strcmp(argv[1], "ab")) {
    struct Shape { int B, L, split; bool two_bit; };
    for (Shape c : {Shape{64, 8192, 8192, false}, Shape{64, 8192, 4096, false}, Shape{1, 131072, 4000, false},
                    Shape{1, 131072, 2000, false}, Shape{16, 32768, 16384, false}, Shape{16, 32768, 8192, false},
                    Shape{256, 1536, 1536, false}, Shape{64, 8192, 8192, true}, Shape{1, 131072, 2000, true}}) {
      float r[2][2];  // [round][lanes, bulk]
      for (int round = 0; round < 2; ++round) {
        if (c.two_bit) {
          r[round][0] = run<KvType::u2, KvType::u2, 3, false, 4, 1, 0, false>(c.B, c.L, c.split, 30);
          r[round][1] = run<KvType::u2, KvType::u2, 3, false, 4, 1, 0, true>(c.B, c.L, c.split, 30);
        } else {
          r[round][0] = run<KvType::u4, KvType::u4, 4, false, 4, 1, 0, false>(c.B, c.L, c.split, 30);
          r[round][1] = run<KvType::u4, KvType::u4, 4, false, 4, 1, 0, true>(c.B, c.L, c.split, 30);
        }
      }
      printf("%s B=%d L=%d split %d  lanes %7.1f %7.1f  bulk %7.1f %7.1f us\n", c.two_bit ? "u2/u2" : "u4/u4", c.B, c.L,
             c.split, r[0][0], r[1][0], r[0][1], r[1][1]);
    }
    return 0;
  }
  const bool once = argc > 1 && !strcmp(argv[1], "once");
  struct Cfg { int B, L, split; };
  for (Cfg c : {Cfg{64, 8192, 4096}, Cfg{1, 131072, 2000}, Cfg{16, 32768, 8192}, Cfg{256, 1536, 1536}}) {
    if (once && c.B != 64) continue;
    const int reps = once ? 0 : 30;
#ifdef RING_VARIANTS
    // The ring (kRing stages, no V ahead), one or two score chains, 4 blocks per SM.
    const float a = run<KvType::u4, KvType::u4, 4, false, 4>(c.B, c.L, c.split, reps);
    const float b = run<KvType::u4, KvType::u4, 4, false, 4, 2>(c.B, c.L, c.split, reps);
    const float c3 = run<KvType::u4, KvType::u4, 4, false, 3>(c.B, c.L, c.split, reps);
    const float d = run<KvType::u2, KvType::u2, 4, false, 4>(c.B, c.L, c.split, reps);
    const float e = run<KvType::u2, KvType::u2, 4, false, 4, 2>(c.B, c.L, c.split, reps);
    const float f = run<KvType::u4, KvType::u2, 4, false, 4>(c.B, c.L, c.split, reps);
    printf("B=%d L=%d split=%d  ring u4/u4 %7.1f ch2 %7.1f s3 %7.1f | u2/u2 %7.1f ch2 %7.1f | u4/u2 %7.1f us\n", c.B,
           c.L, c.split, a, b, c3, d, e, f);
#else
    // As launch_decode_attention builds them (the ring where ring_stages() has one; V ahead only without it).
    constexpr int kR44 = decode_attn::ring_stages<128, KvType::u4, KvType::u4>();
    constexpr int kR22 = decode_attn::ring_stages<128, KvType::u2, KvType::u2>();
    const float u4 = run<KvType::u4, KvType::u4, 4, false, kR44>(c.B, c.L, c.split, reps);
    const float u2 = run<KvType::u2, KvType::u2, 3, kR22 == 0, kR22>(c.B, c.L, c.split, reps);
    printf("B=%d L=%d split=%d  u4/u4 %8.1f us  u2/u2 %8.1f us\n", c.B, c.L, c.split, u4, u2);
#endif
  }
}
