// sm80-family packing of the two-level W4A8 weights (WeightFormat::qoq and ::liquid) for the W4A8
// GEMM (cpp/kernels/sm80/gemm_w4a8_sm80.cu), done once on the host at load time.
//
// Both W4A8 kernels take the weight as the A operand in registers, dequantized there: mma.sync
// m16n8k32 s8 (cpp/kernels/sm80/gemm_w4a8_sm80.cu, 16 weight rows x 32 k) and sm_90's wgmma
// m64nNk32 with a register A (cpp/kernels/sm90/gemm_w4a8_sm90.cu), whose per-warp fragment is the
// same. The k order is the fragment's own (no permutation), because wgmma reads the activations
// from shared memory in plain k order: in k32 step j (0, 1) of a 64-k chunk, lane (g = lane/4,
// t = lane%4) holds columns 4t..4t+3 (actual k 32j+4t+0..3) and 16+4t..16+4t+3 (32j+16+4t+0..3).
//
// data   : u8 [ceil(n/16), k/64 * 512]. For n-tile nt, chunk kc and lane, the 16 bytes at
//          ((nt*(k/64) + kc)*32 + lane)*16 are four 32-bit words: word 2j + h (step j, h = 0 for row g,
//          1 for row g+8, rows relative to 16*nt). Byte b of a word holds two nibbles: the low one is
//          k 32j+4t+b, the high one k 32j+16+4t+b (k relative to 64*kc). So (word & 0x0f0f0f0f) and
//          ((word >> 4) & 0x0f0f0f0f) are the u4 codes of fragment registers a0/a2 (row g) or a1/a3
//          (row g+8), one code per byte: one 16-byte load per lane and chunk.
// scales : u8 [G, npad] group steps s (group-major, so a block reads its rows' steps contiguously).
// zeros  : u8 [G, npad] offsets a, so that the s8 weight is (q*s + a) XOR 0x80 computed on bytes
//          (LiquidGEMM §5.1: one IMAD and one XOR per four weights; no byte ever carries, since
//          q*s + a <= 255). liquid stores a as it is. QoQ's s8 = q*s - z*s (QServe §3.1) is the same
//          byte with a = 128 - z*s, exact whenever z*s <= 128, which QoQ's own quantizer guarantees
//          (z*s <= -min + s/2 <= 119 + 8); given parameters with a larger z*s are refused.
// channel_scales: f32 [npad], the level-1 per-channel scale (0 on padding rows).
// Rows past n are zero-padded with s = 0 and a = 128, i.e. s8 weight 0. k and the group must be
// multiples of 64 (the last group may be short: k = 576 with g128).
#include "lowbit/quant/pack.h"
#include "quant/packed_nibbles.h"

namespace lowbit {
namespace {

using packed_nibbles::kChunkBytes;
using packed_nibbles::kChunkK;
using packed_nibbles::kTileN;

// The layout above: word w of a lane is row g + 8*(w%2) of k16 step w/2; nibble i of it (byte i/2, the high half
// for odd i) is column 32*(w/2) + 16*(i%2) + 4t + i/2.
packed_nibbles::Source w4a8_source(int lane, int w, int i) {
  const int g = lane / 4, t = lane % 4;
  return {static_cast<int8_t>(g + 8 * (w % 2)), static_cast<int8_t>(32 * (w / 2) + 16 * (i % 2) + 4 * t + i / 2)};
}

void check_two_level_for_sm80(const QuantizedWeight& w) {
  LOWBIT_CHECK(w.k % kChunkK == 0, "pack_sm80: ", name_of(w.format), " weight needs k a multiple of ", kChunkK,
               ", got k=", w.k);
  LOWBIT_CHECK(w.group >= kChunkK && w.group % kChunkK == 0, "pack_sm80: ", name_of(w.format),
               " weight needs a group that is a multiple of ", kChunkK, " (g64, g128), got ", w.group);
  check_dtype(w.q, ScalarType::u4, "pack_sm80", "q");
  check_shape(w.q, {w.n, w.k}, "pack_sm80", "q");
  for (const auto& [t, name] : {std::pair<const Tensor*, const char*>{&w.scales, "scales"}, {&w.zeros, "zeros"}}) {
    check_dtype(*t, ScalarType::u8, "pack_sm80", name);
    check_shape(*t, {w.n, w.num_groups()}, "pack_sm80", name);
  }
  check_dtype(w.channel_scales, ScalarType::f32, "pack_sm80", "channel_scales");
  check_shape(w.channel_scales, {w.n}, "pack_sm80", "channel_scales");
}

}  // namespace

PackedWeight pack_sm80_w4a8(const QuantizedWeight& w, const Device& device) {
  LOWBIT_CHECK(w.format == WeightFormat::qoq || w.format == WeightFormat::liquid,
               "pack_sm80_w4a8: expected a qoq or liquid weight, got ", name_of(w.format));
  check_two_level_for_sm80(w);
  const bool qoq = w.format == WeightFormat::qoq;
  const Tensor q = w.q.to(Device::cpu()).contiguous();
  const Tensor s = w.scales.to(Device::cpu()).contiguous();
  const Tensor z = w.zeros.to(Device::cpu()).contiguous();
  const Tensor cs = w.channel_scales.to(Device::cpu()).contiguous();
  const int64_t n = w.n, k = w.k, groups = w.num_groups();
  const int64_t n_tiles = (n + kTileN - 1) / kTileN, npad = n_tiles * kTileN;

  const Tensor data = packed_nibbles::pack(q.data<uint8_t>(), n, k, w4a8_source);

  Tensor steps = Tensor::zeros({groups, npad}, ScalarType::u8);
  Tensor offsets = Tensor::empty({groups, npad}, ScalarType::u8);
  offsets.fill_bytes_(128);
  Tensor channel = Tensor::zeros({npad}, ScalarType::f32);
  const uint8_t* sp = s.data<uint8_t>();
  const uint8_t* zp = z.data<uint8_t>();
  for (int64_t r = 0; r < n; ++r) {
    channel.data<float>()[r] = cs.data<float>()[r];
    for (int64_t gi = 0; gi < groups; ++gi) {
      const int step = sp[r * groups + gi], zero = zp[r * groups + gi];
      int offset = zero;
      if (qoq) {
        offset = 128 - zero * step;
        LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, offset >= 0, "pack_sm80: qoq weight row ", r, " group ", gi,
                          " has z*s = ", zero, "*", step, " = ", zero * step,
                          " > 128, which the GPU's (q*s + 128 - z*s) XOR 0x80 byte dequant cannot hold; "
                          "requantize it with lowbit's QoQ quantizer or run it on device='cpu'");
      }
      steps.data<uint8_t>()[gi * npad + r] = static_cast<uint8_t>(step);
      offsets.data<uint8_t>()[gi * npad + r] = static_cast<uint8_t>(offset);
    }
  }

  PackedWeight p = packed_header(w, PackTarget::sm80);
  p.data = data.to(device);
  p.scales = steps.to(device);
  p.zeros = offsets.to(device);
  p.channel_scales = channel.to(device);
  return p;
}

QuantizedWeight unpack_sm80_w4a8(const PackedWeight& p) {
  LOWBIT_CHECK((p.format == WeightFormat::qoq || p.format == WeightFormat::liquid) && p.target == PackTarget::sm80,
               "unpack_sm80_w4a8: expected a qoq or liquid weight packed for sm80, got ", name_of(p.format), " for ",
               name_of(p.target));
  const int64_t n = p.n, k = p.k;
  QuantizedWeight w = unpacked_header(p);
  const int64_t groups = w.num_groups(), n_tiles = (n + kTileN - 1) / kTileN, npad = n_tiles * kTileN;
  check_shape(p.data, {n_tiles, (k / kChunkK) * kChunkBytes}, "unpack_sm80_w4a8", "data");
  check_shape(p.scales, {groups, npad}, "unpack_sm80_w4a8", "scales");
  check_shape(p.zeros, {groups, npad}, "unpack_sm80_w4a8", "zeros");
  check_shape(p.channel_scales, {npad}, "unpack_sm80_w4a8", "channel_scales");

  const Tensor data = p.data.to(Device::cpu()).contiguous();
  w.q = Tensor::zeros({n, k}, ScalarType::u4);
  packed_nibbles::unpack(data.data<uint8_t>(), n, k, w.q.data<uint8_t>(), w4a8_source);

  const Tensor s = p.scales.to(Device::cpu()).contiguous();
  const Tensor a = p.zeros.to(Device::cpu()).contiguous();
  const Tensor cs = p.channel_scales.to(Device::cpu()).contiguous();
  w.scales = Tensor::empty({n, groups}, ScalarType::u8);
  w.zeros = Tensor::empty({n, groups}, ScalarType::u8);
  w.channel_scales = Tensor::empty({n}, ScalarType::f32);
  for (int64_t r = 0; r < n; ++r) {
    w.channel_scales.data<float>()[r] = cs.data<float>()[r];
    for (int64_t gi = 0; gi < groups; ++gi) {
      const int step = s.data<uint8_t>()[gi * npad + r], offset = a.data<uint8_t>()[gi * npad + r];
      w.scales.data<uint8_t>()[r * groups + gi] = static_cast<uint8_t>(step);
      // qoq: a = 128 - z*s, so z = (128 - a) / s exactly.
      w.zeros.data<uint8_t>()[r * groups + gi] =
          static_cast<uint8_t>(p.format == WeightFormat::qoq ? (128 - offset) / step : offset);
    }
  }
  return w;
}

}  // namespace lowbit
