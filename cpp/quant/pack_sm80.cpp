// sm80-family (mma.sync) packing of group-wise u4 weights (WeightFormat::w4; qoq/liquid: pack_sm80_w4a8.cpp), done once on the host
// at load time so that the W4A16 kernel (cpp/kernels/sm80/gemm_w4a16_sm80.cu) reads each warp's
// operands with one 16-byte load per lane and dequantizes them straight into mma fragments
// (TurboMind §4.1: offline layout in MMA order, 16-byte loads, lop3 u4->f16).
//
// The kernels compute Yᵀ = W · Xᵀ with the weight as the A operand (mma.sync m16n8k16, or a wgmma
// m64 A fragment from registers: both give lane (g = lane/4, t = lane%4) of a warp rows g and g+8 of
// its 16 and, in k16 step j, columns (2t, 2t+1) and (2t+8, 2t+9)). The packed k order is the
// fragment's own, so the activations are read in their natural order: through ldmatrix (sm80
// kernels) or a wgmma shared-memory descriptor over a TMA tile (gemm_w4a16_sm90.cu) — the same
// layout serves every W4A16 kernel, as pack_sm80_w4a8's does for W4A8.
//
// data  : u8 [ceil(n/16), k/64 * 512]. For n-tile nt, chunk kc, lane, step j the 32-bit word at byte
//         ((nt*(k/64) + kc)*32 + lane)*16 + 4j holds 8 nibbles (nibble i at bits 4i..4i+3):
//           i: 0 -> (row g,   k+0)  1 -> (row g+8, k+0)  2 -> (row g,   k+8)  3 -> (row g+8, k+8)
//              4 -> (row g,   k+1)  5 -> (row g+8, k+1)  6 -> (row g,   k+9)  7 -> (row g+8, k+9)
//         with rows relative to 16*nt and k relative to 64*kc + 16j + 2t. The magic-number dequant
//         ((word & 0x000f000f) | 0x64006400, and the 0x00f000f0 mask, then >> 8) yields the fragment
//         registers (i0,i4) (i1,i5) (i2,i6) (i3,i7) = a0 a1 a2 a3 of the A operand.
// scales: f16 [G, npad] (group-major so a block reads its rows' scales contiguously)
// zeros : f16 [G, npad]; the kernel forms the scaled zero z*s in f16 and computes w = q*s - z*s.
// mins  : f16 [G, npad], instead of zeros for weights stored as w = q*s + m (GGUF Q4_1): the kernel
//         computes w = q*s + m with the file's own m.
// Rows past n (npad = 16*ceil(n/16)) are zero-padded. k must be a multiple of 64 and the group a
// multiple of 32 (g32 as GGUF stores it, g64, g128, ...: a 64-k chunk then spans one or two groups);
// the last group may be short (k = 576 with g128).
#include "lowbit/quant/pack.h"
#include "quant/packed_nibbles.h"

namespace lowbit {
namespace {

using packed_nibbles::kChunkBytes;
using packed_nibbles::kChunkK;
using packed_nibbles::kTileN;
constexpr int kHalfChunkK = kChunkK / 2;  // the kernels read a group's parameters per half chunk

// The layout above: nibble i of word j of a lane holds row g + 8*(i&1), k 16j + 2t + 8*((i>>1)&1) + (i>>2).
packed_nibbles::Source w4a16_source(int lane, int j, int i) {
  const int g = lane / 4, t = lane % 4;
  return {static_cast<int8_t>(g + 8 * (i & 1)), static_cast<int8_t>(16 * j + 2 * t + 8 * ((i >> 1) & 1) + (i >> 2))};
}

void check_w4_for_sm80(const QuantizedWeight& w) {
  LOWBIT_CHECK(w.format == WeightFormat::w4, "pack_sm80: only w4, qoq, liquid and f16 weights have an sm80 layout, got format code ",
               static_cast<int>(w.format));
  LOWBIT_CHECK(w.k % kChunkK == 0, "pack_sm80: k must be a multiple of ", kChunkK, ", got k=", w.k);
  LOWBIT_CHECK(w.group >= kHalfChunkK && w.group % kHalfChunkK == 0, "pack_sm80: group must be a multiple of ",
               kHalfChunkK, " (g32, g64, g128, ...), got ", w.group);
  check_dtype(w.q, ScalarType::u4, "pack_sm80", "q");
  check_shape(w.q, {w.n, w.k}, "pack_sm80", "q");
  check_dtype(w.scales, ScalarType::f16, "pack_sm80", "scales");
  check_shape(w.scales, {w.n, w.num_groups()}, "pack_sm80", "scales");
  if (w.mins.defined()) {  // w = q*s + m: the mins replace the zero points
    LOWBIT_CHECK(!w.symmetric && !w.zeros.defined(), "pack_sm80: argument 'mins' (w = q*s + m) goes with an "
                 "asymmetric weight without 'zeros'");
    check_dtype(w.mins, ScalarType::f16, "pack_sm80", "mins");
    check_shape(w.mins, {w.n, w.num_groups()}, "pack_sm80", "mins");
  } else if (!w.symmetric) {
    check_dtype(w.zeros, ScalarType::f16, "pack_sm80", "zeros");
    check_shape(w.zeros, {w.n, w.num_groups()}, "pack_sm80", "zeros");
  }
}

}  // namespace

PackedWeight pack_sm80(const QuantizedWeight& w, const Device& device) {
  if (w.format == WeightFormat::f16) {
    // gemm_f16 reads HF row-major [n, k] as it is: "packing" is the upload.
    PackedWeight p = packed_header(w, PackTarget::sm80);
    p.data = w.q.contiguous().to(device);
    return p;
  }
  if (w.format == WeightFormat::qoq || w.format == WeightFormat::liquid) return pack_sm80_w4a8(w, device);
  check_w4_for_sm80(w);
  const Tensor q = w.q.to(Device::cpu()).contiguous();
  const Tensor s = w.scales.to(Device::cpu()).contiguous();
  const int64_t n = w.n, k = w.k, groups = w.num_groups();
  const int64_t n_tiles = (n + kTileN - 1) / kTileN, npad = n_tiles * kTileN;

  const Tensor data = packed_nibbles::pack(q.data<uint8_t>(), n, k, w4a16_source);

  // Group-major parameters; padding rows get scale 0 and zero (or min) 0: they contribute nothing.
  const bool mins = w.mins.defined();
  Tensor scales = Tensor::zeros({groups, npad}, ScalarType::f16);
  Tensor zeros = Tensor::zeros({groups, npad}, ScalarType::f16);
  const uint16_t* sp = s.data<uint16_t>();
  uint16_t* scales_p = scales.data<uint16_t>();
  uint16_t* zeros_p = zeros.data<uint16_t>();
  const Tensor z = mins ? w.mins.to(Device::cpu()).contiguous()
                   : w.symmetric ? Tensor() : w.zeros.to(Device::cpu()).contiguous();
  constexpr uint16_t kF16Eight = 0x4800;  // 8.0: the fixed zero of symmetric w4
  for (int64_t r = 0; r < n; ++r)
    for (int64_t gi = 0; gi < groups; ++gi) {
      scales_p[gi * npad + r] = sp[r * groups + gi];
      zeros_p[gi * npad + r] = z.defined() ? z.data<uint16_t>()[r * groups + gi] : kF16Eight;
    }

  PackedWeight p = packed_header(w, PackTarget::sm80);
  p.data = data.to(device);
  p.scales = scales.to(device);
  (mins ? p.mins : p.zeros) = zeros.to(device);
  return p;
}

QuantizedWeight unpack_sm80(const PackedWeight& p) {
  if (p.format == WeightFormat::f16 && p.target == PackTarget::sm80) {
    QuantizedWeight w = unpacked_header(p);
    w.q = p.data.to(Device::cpu()).contiguous();
    return w;
  }
  if (p.format == WeightFormat::qoq || p.format == WeightFormat::liquid) return unpack_sm80_w4a8(p);
  LOWBIT_CHECK(p.format == WeightFormat::w4 && p.target == PackTarget::sm80, "unpack_sm80: expected a w4 weight "
               "packed for sm80, got format code ", static_cast<int>(p.format), " target code ",
               static_cast<int>(p.target));
  const int64_t n = p.n, k = p.k;
  QuantizedWeight w = unpacked_header(p);
  const int64_t groups = w.num_groups(), npad = p.scales.size(1);
  check_shape(p.data, {(n + kTileN - 1) / kTileN, (k / kChunkK) * kChunkBytes}, "unpack_sm80", "data");
  check_shape(p.scales, {groups, -1}, "unpack_sm80", "scales");

  const Tensor data = p.data.to(Device::cpu()).contiguous();
  w.q = Tensor::zeros({n, k}, ScalarType::u4);
  packed_nibbles::unpack(data.data<uint8_t>(), n, k, w.q.data<uint8_t>(), w4a16_source);

  const bool mins = p.mins.defined();
  const Tensor s = p.scales.to(Device::cpu()).contiguous();
  const Tensor z = (mins ? p.mins : p.zeros).to(Device::cpu()).contiguous();
  w.scales = Tensor::empty({n, groups}, ScalarType::f16);
  Tensor second;  // zeros, or mins
  if (!p.symmetric) second = Tensor::empty({n, groups}, ScalarType::f16);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t gi = 0; gi < groups; ++gi) {
      w.scales.data<uint16_t>()[r * groups + gi] = s.data<uint16_t>()[gi * npad + r];
      if (!p.symmetric) second.data<uint16_t>()[r * groups + gi] = z.data<uint16_t>()[gi * npad + r];
    }
  (mins ? w.mins : w.zeros) = second;
  return w;
}

}  // namespace lowbit
