// Quantization formats: QuantizedWeight / PackedWeight, quantize/dequantize, the packer, activation
// quantization and recipe parsing. No logic here beyond argument conversion.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include "bindings/bind.h"
#include "bindings/tensor_arg.h"
#include "lowbit/ops/ops.h"
#include "lowbit/quant/activation.h"
#include "lowbit/quant/pack.h"
#include "lowbit/quant/recipe.h"

namespace nb = nanobind;

namespace lowbit::bindings {
namespace {

Tensor optional_arg(nb::handle obj, const char* arg) {
  return obj.is_none() ? Tensor() : tensor_from_python(obj, arg).contiguous().clone();
}

nb::object optional_result(const Tensor& t) { return t.defined() ? nb::cast(t) : nb::none(); }

// q as given by Python: u4 formats take a lowbit u4 tensor or u8 values one per byte (<= 15);
// e4m3 takes e4m3 or its raw u8 bits.
Tensor weight_values(nb::handle obj, WeightFormat f) {
  constexpr const char* kOp = "QuantizedWeight";
  Tensor q = tensor_from_python(obj, "q");
  check_dim(q, 2, kOp, "q");
  if (element_type_of(f) == ScalarType::u4 && q.dtype() == ScalarType::u8) return pack_u4_values(q, kOp, "q");
  if (f == WeightFormat::e4m3 && q.dtype() == ScalarType::u8) q = q.contiguous().as_dtype_view(ScalarType::e4m3);
  return q.contiguous().clone();
}

QuantizedWeight make_quantized_weight(const std::string& format, nb::handle q, nb::handle scales, nb::handle zeros,
                                      nb::handle channel_scales, int group, bool symmetric, nb::handle mins) {
  QuantizedWeight w;
  w.format = weight_format_from_name(format);
  w.q = weight_values(q, w.format);
  w.n = w.q.size(0);
  w.k = w.q.size(1);
  // w8 keeps the given group: 0 per channel, else one scale per group (GGUF Q8_0)
  w.group = is_group_wise(w.format) ? (group == 0 ? default_group(w.format) : group)
                                    : (w.format == WeightFormat::w8 ? group : 0);
  w.symmetric = symmetric;
  w.scales = optional_arg(scales, "scales");
  w.zeros = optional_arg(zeros, "zeros");
  w.channel_scales = optional_arg(channel_scales, "channel_scales");
  w.mins = optional_arg(mins, "mins");
  validate_quantized_weight(w, "QuantizedWeight");
  return w;
}

Tensor block_bits_arg(nb::handle obj) {
  if (!nb::isinstance<nb::list>(obj) && !nb::isinstance<nb::tuple>(obj)) return tensor_from_python(obj, "block_bits");
  const size_t count = nb::len(obj);
  Tensor t = Tensor::empty({static_cast<int64_t>(count)}, ScalarType::u8);
  for (size_t i = 0; i < count; ++i) {
    int v = 0;
    if (!nb::try_cast<int>(obj[i], v))
      LOWBIT_FAIL(ErrorKind::kType, "quantize_fmpq: argument 'block_bits' must hold ints (4 or 8), got ",
                  nb::type_name(obj[i].type()).c_str(), " for block ", i);
    LOWBIT_CHECK(v == 4 || v == 8, "quantize_fmpq: argument 'block_bits' must hold 4 or 8 per block, got ", v,
                 " for block ", i);
    t.data<uint8_t>()[i] = static_cast<uint8_t>(v);
  }
  return t;
}

std::string repr(const QuantizedWeight& w) {
  std::string s = std::string("QuantizedWeight(") + name_of(w.format) + ", n=" + std::to_string(w.n) +
                  ", k=" + std::to_string(w.k);
  if (w.group) s += ", group=" + std::to_string(w.group);
  if (w.symmetric) s += ", symmetric";
  return s + ")";
}

}  // namespace

void bind_quant(nb::module_& m) {
  nb::class_<QuantizedWeight>(m, "QuantizedWeight",
                              "An arch-neutral quantized weight W[n, k] (formats and fields: docs/formats.md)")
      .def("__init__",
           [](QuantizedWeight* self, const std::string& format, nb::handle q, nb::handle scales, nb::handle zeros,
              nb::handle channel_scales, int group, bool symmetric, nb::handle mins) {
             new (self) QuantizedWeight(make_quantized_weight(format, q, scales, zeros, channel_scales, group,
                                                              symmetric, mins));
           },
           nb::arg("format"), nb::arg("q"), nb::arg("scales") = nb::none(), nb::arg("zeros") = nb::none(),
           nb::arg("channel_scales") = nb::none(), nb::arg("group") = 0, nb::arg("symmetric") = false,
           nb::arg("mins") = nb::none(),
           "Builds a weight from tensors (copied) and validates every field. q: [n, k]; for w4/qoq/liquid either "
           "a lowbit u4 tensor or uint8 values one per byte (<= 15); for e4m3 float8_e4m3fn or its uint8 bits. "
           "`group` 0 means the format's default (128; liquid 64); w8 takes 0 (per channel) or a group (scales f32 "
           "[n, groups], GGUF Q8_0); other formats without groups ignore it. `mins` (w4 "
           "only, f16 [n, groups], instead of zeros): w = q*s + m, GGUF Q4_1's scale + min (the CPU and the GPU W4A16 kernels).")
      .def_prop_ro("format", [](const QuantizedWeight& w) { return std::string(name_of(w.format)); })
      .def_prop_ro("n", [](const QuantizedWeight& w) { return w.n; })
      .def_prop_ro("k", [](const QuantizedWeight& w) { return w.k; })
      .def_prop_ro("group", [](const QuantizedWeight& w) { return w.group; })
      .def_prop_ro("symmetric", [](const QuantizedWeight& w) { return w.symmetric; })
      .def_prop_ro("num_groups", [](const QuantizedWeight& w) { return w.num_groups(); })
      .def_prop_ro(
          "q", [](const QuantizedWeight& w) { return w.q.dtype() == ScalarType::u4 ? unpack_u4_values(w.q) : w.q; },
          "Quantized values [n, k]; u4 formats give one uint8 per value (a copy), e4m3 its float8 values")
      .def_prop_ro(
          "q_values", [](const QuantizedWeight& w) { return w.q.dtype() == ScalarType::u4 ? unpack_u4_values(w.q) : w.q; },
          "Same as q (kept for existing callers)")
      .def_prop_ro("q_packed", [](const QuantizedWeight& w) { return w.q; },
                   "The stored tensor: u4 formats pack two values per byte (low nibble first)")
      .def_prop_ro("scales", [](const QuantizedWeight& w) { return optional_result(w.scales); })
      .def_prop_ro("zeros", [](const QuantizedWeight& w) { return optional_result(w.zeros); })
      .def_prop_ro("channel_scales", [](const QuantizedWeight& w) { return optional_result(w.channel_scales); })
      .def_prop_ro("mins", [](const QuantizedWeight& w) { return optional_result(w.mins); })
      .def("__repr__", &repr);

  nb::class_<PackedWeight>(m, "PackedWeight", "A weight in the layout one kernel family reads")
      .def_prop_ro("format", [](const PackedWeight& p) { return std::string(name_of(p.format)); })
      .def_prop_ro("target", [](const PackedWeight& p) { return std::string(name_of(p.target)); })
      .def_prop_ro("n", [](const PackedWeight& p) { return p.n; })
      .def_prop_ro("k", [](const PackedWeight& p) { return p.k; })
      .def_prop_ro("group", [](const PackedWeight& p) { return p.group; })
      .def_prop_ro("symmetric", [](const PackedWeight& p) { return p.symmetric; })
      .def_prop_ro("data", [](const PackedWeight& p) { return optional_result(p.data); })
      .def_prop_ro("scales", [](const PackedWeight& p) { return optional_result(p.scales); })
      .def_prop_ro("zeros", [](const PackedWeight& p) { return optional_result(p.zeros); })
      .def_prop_ro("channel_scales", [](const PackedWeight& p) { return optional_result(p.channel_scales); })
      .def_prop_ro("mins", [](const PackedWeight& p) { return optional_result(p.mins); })
      .def_prop_ro("aux", [](const PackedWeight& p) { return optional_result(p.aux); });

  m.def(
      "quantize_weight",
      [](nb::handle w, const std::string& format, int group, bool symmetric, nb::handle scales, nb::handle zeros,
         nb::handle channel_scales) {
        const WeightQuantParams given{optional_arg(scales, "scales"), optional_arg(zeros, "zeros"),
                                      optional_arg(channel_scales, "channel_scales")};
        return quantize_weight_with_params(tensor_from_python(w, "w"), weight_format_from_name(format), group,
                                           symmetric, given);
      },
      nb::arg("w"), nb::arg("format"), nb::arg("group") = 0, nb::arg("symmetric") = false,
      nb::arg("scales") = nb::none(), nb::arg("zeros") = nb::none(), nb::arg("channel_scales") = nb::none(),
      "Round-to-nearest quantization of w (f32/f16/bf16 [n, k]); group 0 = the format's default (128; liquid "
      "64; w8: per channel, while a group gives one scale per group, GGUF Q8_0's layout). Parameters given as tensors are used as they are "
      "(e.g. from an AWQ/GPTQ search); the others are computed by the round-to-nearest rule.");
  m.def("dequantize_weight", &dequantize_weight, nb::arg("qw"), "f32 [n, k]: exactly what the kernels compute with");
  m.def(
      "pack_weight",
      [](const QuantizedWeight& w, const std::string& target, const std::string& device) {
        return pack_weight(w, pack_target_from_name(target), Device::parse(device));
      },
      nb::arg("qw"), nb::arg("target") = "cpu", nb::arg("device") = "cpu");
  m.def("unpack_weight", &unpack_weight, nb::arg("pw"));
  m.def("weight_bits", [](const std::string& f) { return weight_bits(weight_format_from_name(f)); },
        nb::arg("format"));
  m.def(
      "quantize_per_token_s8",
      [](nb::handle x) {
        Tensor q, scales;
        quantize_per_token_s8(tensor_from_python(x, "x"), q, scales);
        return nb::make_tuple(q, scales);
      },
      nb::arg("x"), "Per-token symmetric int8: returns (q s8 [m, k], scales f32 [m])");
  m.def(
      "quantize_fmpq",
      [](nb::handle x, nb::handle block_bits) {
        FmpqActivation out;
        ops::quantize_fmpq(tensor_from_python(x, "x"), block_bits_arg(block_bits), out);
        return nb::make_tuple(out.q, out.scales);
      },
      nb::arg("x"), nb::arg("block_bits"),
      "COMET FMPQ: block_bits (4 or 8) per 128 channels; returns (q s8 [m, k], scales f32 [m, blocks]) on x's "
      "device (a CUDA x: f16 or f32, the CPU's codes and scales bit for bit)");
  m.def(
      "parse_recipe",
      [](const std::string& text) {
        const Recipe r = parse_recipe(text);
        nb::dict d;
        d["text"] = r.text;
        d["weight_format"] = std::string(name_of(r.weight));
        d["weight_bits"] = r.weight_bits;
        d["group"] = r.group;
        d["activation"] = std::string(name_of(r.activation));
        d["activation_bits"] = activation_bits(r.activation);
        d["variant"] = std::string(variant_of(r));
        d["k_bits"] = static_cast<int>(r.k_bits);
        d["v_bits"] = static_cast<int>(r.v_bits);
        d["has_kv2"] = r.has_kv2();
        d["k_per_channel"] = r.k_per_channel;
        d["k_group"] = r.k_group;
        d["kv_format"] = kv_format_name(r);
        return d;
      },
      nb::arg("text"),
      "Parses a recipe such as 'w4a8kv4' into a dict: text (the canonical spelling), weight_format, weight_bits, "
      "group, activation, activation_bits, variant ('qoq'/'liquid' for w4a8, else ''), k_bits, v_bits, has_kv2, "
      "k_per_channel, k_group (tokens per per-channel K group, else 0), kv_format ('kv4', 'k8v4', 'kc4v4', ...). "
      "The one recipe parser: lowbit.quantize.recipes.parse_recipe wraps it. Bad recipes raise ValueError "
      "naming the recipe and the position.");
}

}  // namespace lowbit::bindings
