// Weight format names, element types and the u4 value <-> nibble helpers.
#include <cctype>

#include "lowbit/quant/format.h"

namespace lowbit {
namespace {

constexpr WeightFormat kAllFormats[] = {WeightFormat::f32, WeightFormat::f16,    WeightFormat::bf16,
                                        WeightFormat::w8,  WeightFormat::w4,     WeightFormat::qoq,
                                        WeightFormat::liquid, WeightFormat::e4m3};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

const char* name_of(WeightFormat f) {
  switch (f) {
    case WeightFormat::f32: return "f32";
    case WeightFormat::f16: return "f16";
    case WeightFormat::bf16: return "bf16";
    case WeightFormat::w8: return "w8";
    case WeightFormat::w4: return "w4";
    case WeightFormat::qoq: return "qoq";
    case WeightFormat::liquid: return "liquid";
    case WeightFormat::e4m3: return "e4m3";
  }
  return "?";
}

WeightFormat weight_format_from_name(const std::string& name) {
  const std::string want = lower(name);
  for (WeightFormat f : kAllFormats)
    if (want == name_of(f)) return f;
  LOWBIT_CHECK(false, "weight_format_from_name: unknown weight format '", name,
               "' (known: f32, f16, bf16, w8, w4, qoq, liquid, e4m3)");
}

int weight_bits(WeightFormat f) { return bits_of(element_type_of(f)); }

bool is_group_wise(WeightFormat f) {
  return f == WeightFormat::w4 || f == WeightFormat::qoq || f == WeightFormat::liquid;
}

int default_group(WeightFormat f) {
  if (f == WeightFormat::liquid) return 64;
  return is_group_wise(f) ? 128 : 0;
}

ScalarType element_type_of(WeightFormat f) {
  switch (f) {
    case WeightFormat::f32: return ScalarType::f32;
    case WeightFormat::f16: return ScalarType::f16;
    case WeightFormat::bf16: return ScalarType::bf16;
    case WeightFormat::w8: return ScalarType::s8;
    case WeightFormat::e4m3: return ScalarType::e4m3;
    case WeightFormat::w4:
    case WeightFormat::qoq:
    case WeightFormat::liquid: return ScalarType::u4;
  }
  return ScalarType::u4;
}

Tensor pack_u4_values(const Tensor& values, const char* op, const char* arg) {
  check_defined(values, op, arg);
  check_dtype(values, ScalarType::u8, op, arg);
  LOWBIT_CHECK_TYPE(values.device().is_cpu(), op, ": argument '", arg, "' must be on the CPU, got ", values.device().str());
  const Tensor v = values.contiguous();
  const int64_t count = v.numel();
  const uint8_t* src = v.data<uint8_t>();
  for (int64_t i = 0; i < count; ++i)
    LOWBIT_CHECK(src[i] <= 15, op, ": argument '", arg, "' holds u4 values one per byte and must be <= 15, got ",
                 int(src[i]), " at flat index ", i);
  Tensor out = Tensor::empty(v.shape(), ScalarType::u4);
  uint8_t* dst = out.data<uint8_t>();
  const int64_t bytes = bytes_for(ScalarType::u4, count);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < bytes; ++b) {
    const uint8_t lo = src[2 * b];
    const uint8_t hi = 2 * b + 1 < count ? src[2 * b + 1] : 0;
    dst[b] = static_cast<uint8_t>(lo | (hi << 4));
  }
  return out;
}

Tensor unpack_u4_values(const Tensor& packed) {
  check_defined(packed, "unpack_u4_values", "packed");
  check_dtype(packed, ScalarType::u4, "unpack_u4_values", "packed");
  LOWBIT_CHECK_TYPE(packed.device().is_cpu(), "unpack_u4_values: argument 'packed' must be on the CPU, got ",
                    packed.device().str());
  const Tensor p = packed.contiguous();
  Tensor out = Tensor::empty(p.shape(), ScalarType::u8);
  const uint8_t* src = p.data<uint8_t>();
  uint8_t* dst = out.data<uint8_t>();
  const int64_t count = p.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) dst[i] = (src[i >> 1] >> ((i & 1) * 4)) & 0xF;
  return out;
}

}  // namespace lowbit
