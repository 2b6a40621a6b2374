// CPU packing: QuantizedWeight -> the tile/k-pair layout the AVX2 GEMM kernels read. The layout is
// documented in quant/pack_cpu_layout.h; unpack_cpu inverts it bit-exactly.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/pack_cpu_layout.h"
#include "lowbit/quant/pack.h"

namespace lowbit {
namespace {

using cpu::kGroupParamLanes;
using cpu::kPairElems;
using cpu::kTileRows;

constexpr const char* kOp = "pack_cpu";

bool is_u4_format(WeightFormat f) {
  return f == WeightFormat::w4 || f == WeightFormat::qoq || f == WeightFormat::liquid;
}

ScalarType element_type(WeightFormat f) {
  switch (f) {
    case WeightFormat::f32: return ScalarType::f32;
    case WeightFormat::f16: return ScalarType::f16;
    case WeightFormat::bf16: return ScalarType::bf16;
    case WeightFormat::w8: return ScalarType::s8;
    case WeightFormat::e4m3: return ScalarType::e4m3;
    default: return ScalarType::u4;
  }
}

inline uint8_t get_u4(const uint8_t* q, int64_t e) { return (q[e >> 1] >> ((e & 1) * 4)) & 0xF; }
inline void set_u4(uint8_t* q, int64_t e, uint8_t v) {
  const int shift = (e & 1) * 4;
  q[e >> 1] = static_cast<uint8_t>((q[e >> 1] & ~(0xF << shift)) | ((v & 0xF) << shift));
}

void check_quantized(const QuantizedWeight& w) {
  LOWBIT_CHECK(w.n > 0 && w.k > 0, kOp, ": weight must have n > 0 and k > 0, got n=", w.n, " k=", w.k);
  check_defined(w.q, kOp, "q");
  LOWBIT_CHECK_TYPE(w.q.device().is_cpu(), kOp, ": argument 'q' must be on the CPU, got ", w.q.device().str());
  check_dtype(w.q, element_type(w.format), kOp, "q");
  check_shape(w.q, {w.n, w.k}, kOp, "q");
  const int64_t G = w.num_groups();
  switch (w.format) {
    case WeightFormat::w8:
    case WeightFormat::e4m3:
      check_dtype(w.scales, ScalarType::f32, kOp, "scales");
      if (w.format == WeightFormat::w8 && w.group > 0) {  // grouped w8: a k pair must not straddle groups
        LOWBIT_CHECK(w.group % 2 == 0, kOp, ": group size of w8 must be even, got ", w.group);
        check_shape(w.scales, {w.n, G}, kOp, "scales");
      } else {
        check_shape(w.scales, {w.n}, kOp, "scales");
      }
      break;
    case WeightFormat::w4:
    case WeightFormat::qoq:
    case WeightFormat::liquid: {
      const int multiple = w.format == WeightFormat::w4 ? 2 : 4;  // k pairs / k quads must not straddle groups
      LOWBIT_CHECK(w.group > 0 && w.group % multiple == 0, kOp, ": group size of ", name_of(w.format),
                   " must be a positive multiple of ", multiple, ", got ", w.group);
      const ScalarType pt = w.format == WeightFormat::w4 ? ScalarType::f16 : ScalarType::u8;
      check_defined(w.scales, kOp, "scales");
      check_dtype(w.scales, pt, kOp, "scales");
      check_shape(w.scales, {w.n, G}, kOp, "scales");
      if (w.mins.defined()) {  // w = q*s + m replaces the zero point
        check_dtype(w.mins, ScalarType::f16, kOp, "mins");
        check_shape(w.mins, {w.n, G}, kOp, "mins");
      } else if (w.format != WeightFormat::w4 || !w.symmetric || w.zeros.defined()) {
        check_defined(w.zeros, kOp, "zeros");
        check_dtype(w.zeros, pt, kOp, "zeros");
        check_shape(w.zeros, {w.n, G}, kOp, "zeros");
      }
      if (w.format != WeightFormat::w4) {
        check_defined(w.channel_scales, kOp, "channel_scales");
        check_dtype(w.channel_scales, ScalarType::f32, kOp, "channel_scales");
        check_shape(w.channel_scales, {w.n}, kOp, "channel_scales");
      }
      break;
    }
    default: break;
  }
}

// [n] f32 -> [tiles * 8] f32, zero padded.
Tensor pad_channels(const Tensor& v, int64_t tiles) {
  Tensor out = Tensor::zeros({tiles * kTileRows}, ScalarType::f32);
  std::memcpy(out.data_ptr(), v.contiguous().data_ptr(), v.nbytes());
  return out;
}

// [n, G] of 1- or 2-byte params -> [tiles, G, 8] (zero padded), the tile-major order the kernel walks.
Tensor tile_group_params(const Tensor& p, int64_t n, int64_t G, int64_t tiles) {
  const Tensor src = p.contiguous();
  const int64_t es = bytes_for(p.dtype(), 1);
  Tensor out = Tensor::zeros({tiles, G, kTileRows}, p.dtype());
  const char* s = static_cast<const char*>(src.data_ptr());
  char* d = static_cast<char*>(out.data_ptr());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < G; ++g)
      std::memcpy(d + (((r / kTileRows) * G + g) * kTileRows + r % kTileRows) * es, s + (r * G + g) * es, es);
  return out;
}

Tensor untile_group_params(const Tensor& p, int64_t n, int64_t G) {
  const int64_t es = bytes_for(p.dtype(), 1);
  Tensor out = Tensor::empty({n, G}, p.dtype());
  const char* s = static_cast<const char*>(p.data_ptr());
  char* d = static_cast<char*>(out.data_ptr());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < G; ++g)
      std::memcpy(d + (r * G + g) * es, s + (((r / kTileRows) * G + g) * kTileRows + r % kTileRows) * es, es);
  return out;
}

// Where u4 value (r, c) lives in the packed data: byte, nibble shift, and the XOR applied to it.
//   w4        : byte ((r / 8) * k + c) * 4 + (r % 8) / 2, nibble r % 2; row 7 of a tile stored q ^ 8.
//   qoq/liquid: byte ((r / 8) * quads + c / 4) * 16 + (r % 4) * 4 + c % 4, nibble (r % 8) / 4.
struct U4Slot {
  int64_t byte;
  int shift;
  uint8_t flip;
};
U4Slot u4_slot(WeightFormat f, int64_t r, int64_t c, int64_t k) {
  const int64_t tile = r / kTileRows, row = r % kTileRows;
  if (f == WeightFormat::w4)
    return {(tile * k + c) * (kTileRows / 2) + row / 2, static_cast<int>(4 * (row % 2)),
            static_cast<uint8_t>(row == kTileRows - 1 ? 8 : 0)};
  return {(tile * cpu::num_k_quads(k) + c / 4) * cpu::kQuadBytes + (row % 4) * 4 + c % 4,
          static_cast<int>(4 * (row / 4)), 0};
}

}  // namespace

PackedWeight pack_cpu(const QuantizedWeight& w) {
  check_quantized(w);
  const int64_t n = w.n, k = w.k, tiles = cpu::num_row_tiles(n), pairs = cpu::num_k_pairs(k);
  const int64_t G = w.num_groups();
  PackedWeight p = packed_header(w, PackTarget::cpu);
  const Tensor q = w.q.contiguous();

  if (!is_u4_format(w.format)) {
    const int64_t es = bytes_for(q.dtype(), 1);
    p.data = Tensor::zeros({tiles, pairs, kPairElems}, q.dtype());
    const char* s = static_cast<const char*>(q.data_ptr());
    char* d = static_cast<char*>(p.data.data_ptr());
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) {
        const int64_t dst = ((r / kTileRows) * pairs + c / 2) * kPairElems + (r % kTileRows) * 2 + c % 2;
        std::memcpy(d + dst * es, s + (r * k + c) * es, es);
      }
    if (w.format == WeightFormat::w8 && G > 0) {
      // grouped w8: scales f32 [tiles, G, 8] (for unpack) and aux f32 [tiles, G, 16], each row's group scale
      // repeated for its two k lanes (pair order e = row * 2 + kk), so the kernel dequantizes q * s per lane.
      p.scales = tile_group_params(w.scales, n, G, tiles);
      p.aux = Tensor::zeros({tiles, G, kPairElems}, ScalarType::f32);
      const Tensor sc = w.scales.contiguous();
      float* aux = p.aux.data<float>();
      for (int64_t r = 0; r < n; ++r)
        for (int64_t g = 0; g < G; ++g) {
          float* a = aux + ((r / kTileRows) * G + g) * kPairElems + (r % kTileRows) * 2;
          a[0] = a[1] = sc.data<float>()[r * G + g];
        }
    } else if (w.format == WeightFormat::w8 || w.format == WeightFormat::e4m3) {
      p.scales = pad_channels(w.scales, tiles);
    }
    return p;
  }

  // u4 formats: see u4_slot for where each value goes.
  p.data = Tensor::zeros(w.format == WeightFormat::w4 ? Shape{tiles, k, kTileRows / 2}
                                                     : Shape{tiles, cpu::num_k_quads(k), cpu::kQuadBytes},
                         ScalarType::u8);
  const uint8_t* s = q.data<uint8_t>();
  uint8_t* d = p.data.data<uint8_t>();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const U4Slot slot = u4_slot(w.format, r, c, k);
      d[slot.byte] |= static_cast<uint8_t>((get_u4(s, r * k + c) ^ slot.flip) << slot.shift);
    }

  p.scales = tile_group_params(w.scales, n, G, tiles);
  if (w.zeros.defined()) p.zeros = tile_group_params(w.zeros, n, G, tiles);
  if (w.mins.defined()) p.mins = tile_group_params(w.mins, n, G, tiles);
  const Tensor sc = w.scales.contiguous();
  const Tensor zr = w.zeros.defined() ? w.zeros.contiguous() : Tensor();
  const Tensor mn = w.mins.defined() ? w.mins.contiguous() : Tensor();
  if (w.format == WeightFormat::w4) {
    // Per (tile, group): lane r multiplier s_r * 16^-r (the kernel converts nibble r in place, i.e.
    // q * 16^r), then lane r addend -z*s; row 7 is stored q ^ 8 and read as q - 8, so its addend is
    // (8 - z) * s. All products are exact in f32 (f16 s and z, 4-bit q). With mins (w = q*s + m) the addend
    // is m, and m + 8s on row 7.
    p.aux = Tensor::empty({tiles, G, 2 * kTileRows}, ScalarType::f32);
    std::memset(p.aux.data_ptr(), 0, p.aux.nbytes());
    const uint16_t* sb = sc.data<uint16_t>();
    const uint16_t* zb = zr.defined() ? zr.data<uint16_t>() : nullptr;
    const uint16_t* mb = mn.defined() ? mn.data<uint16_t>() : nullptr;
    float* aux = p.aux.data<float>();
    for (int64_t r = 0; r < n; ++r)
      for (int64_t g = 0; g < G; ++g) {
        const int lane = static_cast<int>(r % kTileRows);
        const float scale = f16_bits_to_f32(sb[r * G + g]);
        const float zero = zb ? f16_bits_to_f32(zb[r * G + g]) : 8.f;
        float* a = aux + ((r / kTileRows) * G + g) * 2 * kTileRows;
        a[lane] = std::ldexp(scale, -4 * lane);
        if (mb) {
          const float mn_v = f16_bits_to_f32(mb[r * G + g]);
          a[kTileRows + lane] = lane == kTileRows - 1 ? mn_v + 8.f * scale : mn_v;
        } else {
          a[kTileRows + lane] = lane == kTileRows - 1 ? (8.f - zero) * scale : -(zero * scale);
        }
      }
  } else {
    p.channel_scales = pad_channels(w.channel_scales, tiles);
    p.aux = Tensor::zeros({tiles, G, cpu::kU4AuxBytes}, ScalarType::u8);
    const uint8_t* sb = sc.data<uint8_t>();
    const uint8_t* zb = zr.data<uint8_t>();
    const bool qoq = w.format == WeightFormat::qoq;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t g = 0; g < G; ++g) {
        const int scale = sb[r * G + g], offset = zb[r * G + g];
        const int add = qoq ? -offset * scale : offset - 128;
        // The int8 decode kernel factors sum_k (q*s + add) * x = s * sum q*x + add * sum x, which equals
        // the GPU's 8-bit reconstruction only when q*s + add never leaves the s8 range.
        for (int64_t c = g * w.group; c < std::min(k, (g + 1) * w.group); ++c) {
          const int v = get_u4(s, r * k + c) * scale + add;
          LOWBIT_CHECK(v >= -128 && v <= 127, kOp, ": ", name_of(w.format), " weight (row ", r, ", k ", c,
                       ") reconstructs to ", v, ", outside the s8 range [-128, 127] (q=", int(get_u4(s, r * k + c)),
                       " scale=", scale, qoq ? " zero=" : " offset=", offset, ")");
        }
        uint8_t* a = p.aux.data<uint8_t>() + ((r / kTileRows) * G + g) * cpu::kU4AuxBytes;
        int16_t* lanes16 = reinterpret_cast<int16_t*>(a);
        int32_t* lanes32 = reinterpret_cast<int32_t*>(a + 2 * kGroupParamLanes);
        const int row = static_cast<int>(r % kTileRows);
        lanes16[2 * row] = lanes16[2 * row + 1] = static_cast<int16_t>(scale);
        lanes16[kPairElems + 2 * row] = lanes16[kPairElems + 2 * row + 1] = static_cast<int16_t>(add);
        lanes32[row] = scale;
        lanes32[kTileRows + row] = add;
      }
  }
  return p;
}

QuantizedWeight unpack_cpu(const PackedWeight& p) {
  LOWBIT_CHECK(p.target == PackTarget::cpu, "unpack_cpu: weight was packed for target code ", static_cast<int>(p.target),
               ", not cpu");
  check_defined(p.data, "unpack_cpu", "data");
  QuantizedWeight w = unpacked_header(p);
  const int64_t n = p.n, k = p.k, pairs = cpu::num_k_pairs(k), G = w.num_groups();
  if (!is_u4_format(p.format)) {
    const int64_t es = bytes_for(p.data.dtype(), 1);
    w.q = Tensor::empty({n, k}, p.data.dtype());
    const char* s = static_cast<const char*>(p.data.data_ptr());
    char* d = static_cast<char*>(w.q.data_ptr());
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) {
        const int64_t src = ((r / kTileRows) * pairs + c / 2) * kPairElems + (r % kTileRows) * 2 + c % 2;
        std::memcpy(d + (r * k + c) * es, s + src * es, es);
      }
    if (p.format == WeightFormat::w8 && G > 0) w.scales = untile_group_params(p.scales, n, G);
    else if (p.format == WeightFormat::w8 || p.format == WeightFormat::e4m3) w.scales = p.scales.slice(0, 0, n).clone();
    return w;
  }
  w.q = Tensor::zeros({n, k}, ScalarType::u4);
  const uint8_t* s = p.data.data<uint8_t>();
  uint8_t* d = w.q.data<uint8_t>();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const U4Slot slot = u4_slot(p.format, r, c, k);
      set_u4(d, r * k + c, ((s[slot.byte] >> slot.shift) & 0xF) ^ slot.flip);
    }
  w.scales = untile_group_params(p.scales, n, G);
  if (p.zeros.defined()) w.zeros = untile_group_params(p.zeros, n, G);
  if (p.mins.defined()) w.mins = untile_group_params(p.mins, n, G);
  if (p.channel_scales.defined()) w.channel_scales = p.channel_scales.slice(0, 0, n).clone();
  return w;
}

}  // namespace lowbit
