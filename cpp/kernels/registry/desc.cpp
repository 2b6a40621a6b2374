// Descriptor keys (include/lowbit/kernels/desc.h).
#include "lowbit/kernels/desc.h"

#include <atomic>
#include <sstream>

#ifdef LOWBIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "lowbit/cuda/check.h"
#endif

namespace lowbit::kernels {

const char* name_of(MBucket b) {
  switch (b) {
    case MBucket::m1: return "m1";
    case MBucket::m4: return "m2-4";
    case MBucket::m16: return "m5-16";
    case MBucket::m127: return "m17-127";
    case MBucket::m_large: return "m128+";
  }
  return "m?";
}

const char* name_of(AttnPhase p) { return p == AttnPhase::decode ? "decode" : "prefill"; }

const char* name_of(KvGranularity g) {
  return g == KvGranularity::per_channel_k ? "per_channel_k" : "per_token_head";
}

std::string arch_name(DeviceKind device, int sm) {
  return device == DeviceKind::cpu ? std::string("cpu") : "sm_" + std::to_string(sm);
}

int compute_capability(const Device& device) {
#ifdef LOWBIT_WITH_CUDA
  if (!device.is_cuda()) return 0;
  static std::atomic<int> cache[64] = {};
  if (device.index >= 0 && device.index < 64 && cache[device.index].load() != 0) return cache[device.index].load();
  int major = 0, minor = 0;
  LOWBIT_CUDA_CHECK("compute_capability", cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index));
  LOWBIT_CUDA_CHECK("compute_capability", cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device.index));
  const int cap = 10 * major + minor;
  if (device.index >= 0 && device.index < 64) cache[device.index].store(cap);
  return cap;
#else
  return 0;
#endif
}

GemmDesc describe_gemm(const Device& device, ActivationMode act, ScalarType x_type, ScalarType y_type,
                       const PackedWeight& w, int64_t m, bool aligned_rows) {
  GemmDesc d;
  d.device = device.kind;
  d.sm = compute_capability(device);
  d.act = act;
  d.x_type = x_type;
  d.y_type = y_type;
  d.weight = w.format;
  d.packed = w.target;
  d.group = w.group;
  d.n = w.n;
  d.k = w.k;
  d.m = m_bucket_of(m);
  d.aligned_rows = aligned_rows;
#ifdef LOWBIT_WITH_CUBLASLT
  d.cublaslt = device.kind == DeviceKind::cuda;
#endif
  return d;
}

std::string GemmDesc::to_string() const {
  std::ostringstream s;
  s << "gemm " << arch_name(device, sm) << ' ' << lowbit::name_of(weight);
  if (group > 0) s << " g" << group;
  s << " act=" << lowbit::name_of(act) << " x=" << lowbit::name_of(x_type) << " y=" << lowbit::name_of(y_type)
    << " n=" << n << " k=" << k << ' ' << name_of(m);
  if (!aligned_rows) s << " unaligned";
  return s.str();
}

std::string AttnDesc::to_string() const {
  std::ostringstream s;
  s << "attention " << name_of(phase) << ' ' << arch_name(device, sm) << " d" << head_dim
    << " q=" << lowbit::name_of(q_type) << " k=" << lowbit::name_of(k_type) << " v=" << lowbit::name_of(v_type)
    << " gqa" << gqa_group << " block" << block_size;
  if (out_type != q_type) s << " out=" << lowbit::name_of(out_type);
  if (kv_granularity != KvGranularity::per_token_head) s << ' ' << name_of(kv_granularity);
  if (!q_rows_aligned16) s << " q-rows-unaligned";
  return s.str();
}

}  // namespace lowbit::kernels
