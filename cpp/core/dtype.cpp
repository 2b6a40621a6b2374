#include "lowbit/core/dtype.h"

#include <cmath>
#include <cstring>

#include "lowbit/core/error.h"

namespace lowbit {
namespace {
struct TypeInfo {
  const char* name;
  int bits;
  bool floating;
  bool is_signed;
};
// Indexed by ScalarType.
constexpr TypeInfo kInfo[kNumScalarTypes] = {
    {"f32", 32, true, true}, {"f16", 16, true, true}, {"bf16", 16, true, true},
    {"e4m3", 8, true, true}, {"e5m2", 8, true, true}, {"s8", 8, false, true},
    {"u8", 8, false, false}, {"s4", 4, false, true},  {"u4", 4, false, false},
    {"u2", 2, false, false}, {"s32", 32, false, true}, {"s64", 64, false, true},
};
const TypeInfo& info(ScalarType t) { return kInfo[static_cast<int>(t)]; }
}  // namespace

int bits_of(ScalarType t) { return info(t).bits; }
bool is_floating(ScalarType t) { return info(t).floating; }
bool is_signed(ScalarType t) { return info(t).is_signed; }
const char* name_of(ScalarType t) { return info(t).name; }

ScalarType scalar_type_from_name(const std::string& name) {
  for (int i = 0; i < kNumScalarTypes; ++i)
    if (name == kInfo[i].name) return static_cast<ScalarType>(i);
  std::string known;
  for (int i = 0; i < kNumScalarTypes; ++i) known += std::string(i ? ", " : "") + kInfo[i].name;
  LOWBIT_FAIL(ErrorKind::kType, "unknown scalar type '", name, "' (known: ", known, ")");
}

int64_t bytes_for(ScalarType t, int64_t count) { return (count * bits_of(t) + 7) / 8; }

uint16_t f32_to_f16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (e <= 0) {                                                // subnormal or zero
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - e;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into exponent: correct
  return static_cast<uint16_t>(sign | half);
}

float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t x;
  if (exp == 0) {
    if (mant == 0) {
      x = sign;
    } else {  // normalise the subnormal
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while (!(mant & 0x400u));
      x = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    x = sign | 0x7f800000u | (mant << 13);
  } else {
    x = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t f32_to_bf16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// Generic minifloat decode/encode: `mbits` mantissa bits, `ebits` exponent bits.
namespace {
float minifloat_decode(uint8_t v, int ebits, int mbits, int bias) {
  const bool neg = v >> 7;
  const int e = (v >> mbits) & ((1 << ebits) - 1);
  const int m = v & ((1 << mbits) - 1);
  float mag;
  if (e == 0) mag = std::ldexp(static_cast<float>(m), 1 - bias - mbits);
  else mag = std::ldexp(static_cast<float>((1 << mbits) | m), e - bias - mbits);
  return neg ? -mag : mag;
}
// Round-to-nearest-even by searching the monotone code space (exact and simple; used off the hot path).
uint8_t minifloat_encode(float f, int ebits, int mbits, int bias, uint8_t max_code) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a == 0.f) return sign;
  const float max_val = minifloat_decode(max_code, ebits, mbits, bias);
  if (a >= max_val) return sign | max_code;  // saturate
  int lo = 0, hi = max_code;               // decode(lo) <= a < decode(hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (minifloat_decode(static_cast<uint8_t>(mid), ebits, mbits, bias) <= a) lo = mid;
    else hi = mid;
  }
  const float dl = a - minifloat_decode(static_cast<uint8_t>(lo), ebits, mbits, bias);
  const float dh = minifloat_decode(static_cast<uint8_t>(hi), ebits, mbits, bias) - a;
  const int pick = (dl < dh) ? lo : (dh < dl) ? hi : ((lo & 1) ? hi : lo);
  return sign | static_cast<uint8_t>(pick);
}
}  // namespace

uint8_t f32_to_e4m3_bits(float f) {
  if (std::isnan(f)) return 0x7f;
  return minifloat_encode(f, 4, 3, 7, 0x7e);  // 0x7e = 448, 0x7f is NaN
}
float e4m3_bits_to_f32(uint8_t v) {
  if ((v & 0x7f) == 0x7f) return NAN;
  return minifloat_decode(v, 4, 3, 7);
}
uint8_t f32_to_e5m2_bits(float f) {
  if (std::isnan(f)) return 0x7f;
  return minifloat_encode(f, 5, 2, 15, 0x7b);  // 0x7b = 57344; 0x7c is inf
}
float e5m2_bits_to_f32(uint8_t v) {
  const int e = (v >> 2) & 0x1f;
  if (e == 0x1f) return (v & 3) ? NAN : ((v & 0x80) ? -INFINITY : INFINITY);
  return minifloat_decode(v, 5, 2, 15);
}

}  // namespace lowbit
