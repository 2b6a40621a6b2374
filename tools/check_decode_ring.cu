// Checks the decode kernel's shared-memory ring (ring_stages), with the lanes' cp.async and with bulk copies (kBulk),
// against the register path it replaces, which the
// Python tests check against float64: the three instances of one (K, V) at head_dim 128 run on the same random paged
// cache (shuffled pages; block sizes 16, 32 and 8, the last one with tiles that straddle pages; odd lengths; 1-16
// query heads per kv head; one split (the f16 output) and several (the partial outputs and their (max, sum))), and
// the largest difference relative to the largest magnitude is printed per case and ring. Also the cache's parameters
// offset by 8 bytes (bulk copies then fall back to the lanes' copies). The lanes' ring sums in the registers' order and
// must agree to 1e-5; the bulk ring takes a tile's tokens in another order (bulk_slot_token), so its f32 sums round
// differently: its f32 partials must agree to 1e-5, its f16 outputs to one f16 ulp of the largest magnitude (2^-10).
// Exit status 1 on a mismatch.
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I include -I cpp \
//     tools/check_decode_ring.cu -o /tmp/cr && /tmp/cr
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/sm80/decode_attention_sm80.cuh"
using namespace lowbit::cuda;

struct Case { int B, hq, hkv, bs, L, split; };
bool g_misaligned = false;  // the parameter tensors 8 bytes past a 16-byte boundary

struct Diff { double lanes, bulk; bool f16_out; };
template <KvType KT, KvType VT>
Diff check(const Case& c, uint32_t seed) {
  constexpr int D = 128;
  std::mt19937 rng(seed);
  const int max_blocks = (c.L + c.bs - 1) / c.bs, blocks = c.B * max_blocks + 3;
  const size_t rows = size_t(blocks) * c.hkv * c.bs;
  const size_t kb = rows * D * kv_bits<KT>() / 8, vb = rows * D * kv_bits<VT>() / 8;
  std::vector<uint8_t> hk(kb), hv(vb);
  for (auto& x : hk) x = rng() & 0xff;
  for (auto& x : hv) x = rng() & 0xff;
  std::uniform_real_distribution<float> U(0.f, 1.f);
  std::vector<float> hkp(rows * 2), hvp(rows * 2);
  for (size_t i = 0; i < rows; ++i) {
    hkp[2 * i] = 0.05f + 0.2f * U(rng); hkp[2 * i + 1] = U(rng) - 0.5f;
    hvp[2 * i] = 0.05f + 0.2f * U(rng); hvp[2 * i + 1] = U(rng) - 0.5f;
  }
  std::vector<__half> hq(size_t(c.B) * c.hq * D);
  for (auto& x : hq) x = __float2half(2.f * U(rng) - 1.f);
  std::vector<int> perm(blocks);
  for (int i = 0; i < blocks; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int> tab(size_t(c.B) * max_blocks), lens(c.B);
  for (int b = 0; b < c.B; ++b) {
    lens[b] = b == 0 ? c.L : 1 + int(rng() % c.L);
    for (int j = 0; j < max_blocks; ++j) tab[size_t(b) * max_blocks + j] = perm[b * max_blocks + j];
  }
  constexpr int kRuns = 3;  // registers, ring with the lanes' copies, ring with bulk copies
  uint8_t *k, *v; float *kp, *vp, *kp_mem, *vp_mem; __half *q, *out[kRuns]; int *tables, *dl; float *po[kRuns], *ps[kRuns];
  cudaMalloc(&k, kb); cudaMalloc(&v, vb); cudaMalloc(&kp_mem, rows * 8 + 8); cudaMalloc(&vp_mem, rows * 8 + 8);
  kp = kp_mem + (g_misaligned ? 2 : 0); vp = vp_mem + (g_misaligned ? 2 : 0);
  cudaMemcpy(k, hk.data(), kb, cudaMemcpyHostToDevice); cudaMemcpy(v, hv.data(), vb, cudaMemcpyHostToDevice);
  cudaMemcpy(kp, hkp.data(), rows * 8, cudaMemcpyHostToDevice); cudaMemcpy(vp, hvp.data(), rows * 8, cudaMemcpyHostToDevice);
  cudaMalloc(&q, hq.size() * 2); cudaMemcpy(q, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice);
  cudaMalloc(&tables, tab.size() * 4); cudaMemcpy(tables, tab.data(), tab.size() * 4, cudaMemcpyHostToDevice);
  cudaMalloc(&dl, c.B * 4); cudaMemcpy(dl, lens.data(), c.B * 4, cudaMemcpyHostToDevice);
  const int splits = (c.L + c.split - 1) / c.split;
  const size_t po_n = size_t(c.B) * c.hq * splits * D, ps_n = size_t(c.B) * c.hq * splits * 2, out_n = size_t(c.B) * c.hq * D;
  for (int i = 0; i < kRuns; ++i) {
    cudaMalloc(&out[i], out_n * 2); cudaMalloc(&po[i], po_n * 4); cudaMalloc(&ps[i], ps_n * 4);
    cudaMemset(out[i], 0xff, out_n * 2); cudaMemset(po[i], 0xff, po_n * 4); cudaMemset(ps[i], 0xff, ps_n * 4);
  }
  DecodeAttnArgs p{};
  p.q = q; p.k = k; p.v = v; p.k_params = kp; p.v_params = vp; p.block_tables = tables; p.seq_lens = dl;
  p.q_stride_b = c.hq * D; p.q_stride_h = D; p.out_stride_b = c.hq * D; p.out_stride_h = D;
  p.hq = c.hq; p.hkv = c.hkv; p.group = c.hq / c.hkv; p.slices = (p.group + 7) / 8; p.block_size = c.bs;
  p.block_shift = -1;
  for (int sh = 0; sh < 31; ++sh) if ((1 << sh) == c.bs) p.block_shift = sh;
  p.max_blocks = max_blocks; p.split_tokens = c.split; p.num_splits = splits;
  p.tile_in_one_page = c.bs % 16 == 0 && c.split % 16 == 0; p.scale = 0.0883883f;
  const dim3 grid(c.B, c.hkv * p.slices, splits);
  constexpr int kR = decode_attn::ring_stages<D, KT, VT>();
  for (int i = 0; i < kRuns; ++i) {
    p.out = out[i]; p.part_out = po[i]; p.part_stats = ps[i];
    if (i == 0)
      decode_attn::decode_attention_kernel<KT, VT, D, 3, false, 1, 1, false, 0><<<grid, decode_attn::kThreads>>>(p);
    else if (i == 1)
      decode_attn::decode_attention_kernel<KT, VT, D, 4, false, 1, 1, false, kR, 0, false><<<grid, decode_attn::kThreads>>>(p);
    else
      decode_attn::decode_attention_kernel<KT, VT, D, 4, false, 1, 1, false, kR, 0, true><<<grid, decode_attn::kThreads>>>(p);
  }
  const cudaError_t e = cudaDeviceSynchronize();
  const Diff bad{1e30, 1e30, splits == 1};
  if (e != cudaSuccess) { printf("cuda error %s\n", cudaGetErrorString(e)); return bad; }
  double rel[kRuns] = {};
  for (int run = 1; run < kRuns; ++run) {  // each ring against the registers
  double worst = 0, mag = 0;
  if (splits == 1) {
    std::vector<__half> a(out_n), b(out_n);
    cudaMemcpy(a.data(), out[0], out_n * 2, cudaMemcpyDeviceToHost); cudaMemcpy(b.data(), out[run], out_n * 2, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < out_n; ++i) {
      const double x = __half2float(a[i]), y = __half2float(b[i]);
      if (!std::isfinite(x) || !std::isfinite(y)) return bad;
      worst = std::max(worst, std::fabs(x - y)); mag = std::max(mag, std::fabs(x));
    }
  } else {
    std::vector<float> a(po_n), b(po_n), sa(ps_n), sb(ps_n);
    cudaMemcpy(a.data(), po[0], po_n * 4, cudaMemcpyDeviceToHost); cudaMemcpy(b.data(), po[run], po_n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(sa.data(), ps[0], ps_n * 4, cudaMemcpyDeviceToHost); cudaMemcpy(sb.data(), ps[run], ps_n * 4, cudaMemcpyDeviceToHost);
    // Splits past a sequence's length are left unwritten by both: compare the bytes then (both still 0xff).
    for (size_t i = 0; i < po_n; ++i) {
      if (std::isnan(a[i]) && std::isnan(b[i])) continue;
      if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return bad;
      worst = std::max(worst, double(std::fabs(a[i] - b[i]))); mag = std::max(mag, double(std::fabs(a[i])));
    }
    for (size_t i = 0; i < ps_n; ++i) {
      if (std::isnan(sa[i]) && std::isnan(sb[i])) continue;
      if (!(std::fabs(sa[i] - sb[i]) <= 1e-5 * std::max(1.f, std::fabs(sa[i])))) return bad;
    }
  }
  rel[run] = mag > 0 ? worst / mag : 1e30;
  }
  cudaFree(k); cudaFree(v); cudaFree(kp_mem); cudaFree(vp_mem); cudaFree(q); cudaFree(tables); cudaFree(dl);
  for (int i = 0; i < kRuns; ++i) { cudaFree(out[i]); cudaFree(po[i]); cudaFree(ps[i]); }
  return Diff{rel[1], rel[2], splits == 1};
}

int main(int argc, char** argv) {
  const bool small = argc > 1;  // a few small cases (for compute-sanitizer)
  std::vector<Case> cases = {{1, 8, 8, 16, 37, 4096}, {2, 32, 8, 16, 1000, 4096}, {3, 32, 8, 16, 1000, 256},
                             {2, 16, 1, 32, 777, 4096}, {2, 12, 1, 16, 333, 96}, {1, 4, 4, 8, 301, 4096},
                             {2, 8, 2, 8, 515, 112}, {1, 2, 2, 16, 1, 4096}, {3, 14, 2, 16, 4099, 1024},
                             {1, 64, 8, 16, 16384, 2048}, {2, 32, 2, 64, 2111, 512}, {1, 8, 1, 16, 64, 16}};
  if (small) cases = {{1, 8, 8, 16, 37, 4096}, {2, 12, 1, 16, 333, 96}, {1, 4, 4, 8, 301, 4096}, {2, 8, 2, 8, 515, 112}};
  int bad = 0, idx = 0;
  const size_t plain = cases.size();
  for (size_t ci = 0; ci < plain; ++ci) cases.push_back(cases[ci]);  // the same cases with misaligned parameters
  for (const Case& c : cases) {
    g_misaligned = size_t(idx) >= plain;
    const Diff r[4] = {check<KvType::u4, KvType::u4>(c, 11 + idx), check<KvType::u2, KvType::u2>(c, 23 + idx),
                       check<KvType::u4, KvType::u2>(c, 37 + idx), check<KvType::u2, KvType::u4>(c, 41 + idx)};
    ++idx;
    printf("%sB=%d hq=%d hkv=%d bs=%d L=%d split=%d  rel. diff vs registers (lanes / bulk ring) u4/u4 %.2e / %.2e "
           "u2/u2 %.2e / %.2e u4/u2 %.2e / %.2e u2/u4 %.2e / %.2e\n", g_misaligned ? "params+8 " : "", c.B, c.hq, c.hkv,
           c.bs, c.L, c.split, r[0].lanes, r[0].bulk, r[1].lanes, r[1].bulk, r[2].lanes, r[2].bulk, r[3].lanes, r[3].bulk);
    for (const Diff& d : r) bad += !(d.lanes <= 1e-5) + !(d.bulk <= (d.f16_out ? 1.0 / 1024 : 1e-5));
  }
  printf(bad ? "MISMATCH in %d\n" : "all match (%d)\n", bad ? bad : int(cases.size()) * 8);
  return bad ? 1 : 0;
}
