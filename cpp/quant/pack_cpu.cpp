// CPU packing. Placeholder layout: the arch-neutral tensors as they are (the CPU GEMM owner replaces
// this with its blocked layout and documents it here).
#include "lowbit/quant/pack.h"

namespace lowbit {

PackedWeight pack_cpu(const QuantizedWeight& w) {
  PackedWeight p;
  p.format = w.format;
  p.target = PackTarget::cpu;
  p.n = w.n;
  p.k = w.k;
  p.group = w.group;
  p.symmetric = w.symmetric;
  p.data = w.q.clone();
  if (w.scales.defined()) p.scales = w.scales.clone();
  if (w.zeros.defined()) p.zeros = w.zeros.clone();
  if (w.channel_scales.defined()) p.channel_scales = w.channel_scales.clone();
  return p;
}

QuantizedWeight unpack_cpu(const PackedWeight& p) {
  QuantizedWeight w;
  w.format = p.format;
  w.n = p.n;
  w.k = p.k;
  w.group = p.group;
  w.symmetric = p.symmetric;
  w.q = p.data.clone();
  if (p.scales.defined()) w.scales = p.scales.clone();
  if (p.zeros.defined()) w.zeros = p.zeros.clone();
  if (p.channel_scales.defined()) w.channel_scales = p.channel_scales.clone();
  return w;
}

}  // namespace lowbit
