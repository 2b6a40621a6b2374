// Scalar types, spelled as in ml_dtypes / vLLM. Sub-byte types (s4 u4 u2) are packed little-end
// first along the innermost dimension: element 2i sits in the low nibble of byte i.
#pragma once
#include <cstdint>
#include <string>

namespace lowbit {

enum class ScalarType : uint8_t { f32, f16, bf16, e4m3, e5m2, s8, u8, s4, u4, u2, s32, s64 };
constexpr int kNumScalarTypes = 12;

int bits_of(ScalarType t);                 // 32, 16, ..., 4, 2
inline bool is_sub_byte(ScalarType t) { return bits_of(t) < 8; }
bool is_floating(ScalarType t);            // f32 f16 bf16 e4m3 e5m2
bool is_signed(ScalarType t);
const char* name_of(ScalarType t);         // "f32", "u4", ...
ScalarType scalar_type_from_name(const std::string& name);  // throws naming the known types
// Bytes taken by `count` elements of `t`; sub-byte counts round up to whole bytes.
int64_t bytes_for(ScalarType t, int64_t count);

// Half-precision conversions used by the CPU kernels (round to nearest even).
uint16_t f32_to_f16_bits(float f);
float f16_bits_to_f32(uint16_t h);
uint16_t f32_to_bf16_bits(float f);
inline float bf16_bits_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
uint8_t f32_to_e4m3_bits(float f);  // saturating to +-448, NaN stays NaN
float e4m3_bits_to_f32(uint8_t v);
uint8_t f32_to_e5m2_bits(float f);
float e5m2_bits_to_f32(uint8_t v);

}  // namespace lowbit
