// lowbit._core.kernels: the kernel registries, read-only: every kernel's name and summary, and the
// lookup for a descriptor given as keywords (tools/gen_support_matrix.py, `lowbit info`, tests).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings/bind.h"
#include "lowbit/kernels/registry.h"

namespace nb = nanobind;

namespace lowbit::bindings {
namespace {

using namespace lowbit::kernels;

ActivationMode activation_from_name(const std::string& s) {
  for (ActivationMode a : {ActivationMode::float16, ActivationMode::int8_per_token, ActivationMode::fmpq_mixed,
                           ActivationMode::fp8_per_token})
    if (s == name_of(a)) return a;
  LOWBIT_CHECK(false, "kernels: act must be float16, int8_per_token, fmpq_mixed or fp8_per_token, got '", s, "'");
  return ActivationMode::float16;
}

template <class Sel>
nb::dict selection_dict(const Sel& s) {
  nb::dict d;
  d["kernel"] = s.kernel ? nb::cast(std::string(s.kernel->name)) : nb::none();
  d["fallback"] = s.fallback;
  d["why"] = s.why_chosen();
  d["reasons"] = s.reasons();
  return d;
}

template <class Entry>
nb::list entries(const std::vector<Entry>& all) {
  nb::list out;
  for (const Entry& e : all) {
    nb::dict d;
    d["name"] = e.name;
    d["summary"] = e.summary;
    d["built"] = e.launch != nullptr;
    out.append(d);
  }
  return out;
}

}  // namespace

void bind_kernels(nb::module_& root) {
  nb::module_ m = root.def_submodule("kernels", "Kernel registries: GEMM and attention kernels, lookup by descriptor");
  m.def("gemm_kernels", [] { return entries(gemm_kernels()); });
  m.def("attention_kernels", [] { return entries(attention_kernels()); });
  m.def(
      "select_gemm",
      [](const std::string& device, int sm, const std::string& act, const std::string& x, const std::string& y,
         const std::string& weight, const std::string& packed, int group, int64_t n, int64_t k, int64_t m,
         bool aligned, bool cublaslt, const std::string& forced, bool strict) {
        GemmDesc d;
        d.device = Device::parse(device).kind;
        d.sm = sm;
        d.act = activation_from_name(act);
        d.x_type = scalar_type_from_name(x);
        d.y_type = scalar_type_from_name(y);
        d.weight = weight_format_from_name(weight);
        d.packed = pack_target_from_name(packed);
        d.group = group;
        d.n = n;
        d.k = k;
        d.m = m_bucket_of(m);
        d.aligned_rows = aligned;
        d.cublaslt = cublaslt && d.device == DeviceKind::cuda;
        nb::dict out = forced.empty() && !strict ? selection_dict(try_select_gemm(d))
                                                 : selection_dict(select_gemm(d, forced, strict, "select_gemm"));
        out["desc"] = d.to_string();
        return out;
      },
      nb::kw_only(), nb::arg("device"), nb::arg("sm") = 0, nb::arg("act") = "float16", nb::arg("x") = "f32",
      nb::arg("y") = "f32", nb::arg("weight") = "f32", nb::arg("packed") = "cpu", nb::arg("group") = 0,
      nb::arg("n") = 64, nb::arg("k") = 64, nb::arg("m") = 1, nb::arg("aligned") = true,
      nb::arg("cublaslt") = true, nb::arg("forced") = "",
      nb::arg("strict") = false,
      "The GEMM kernel for a descriptor: {kernel (None: none can run), fallback, why, reasons, desc}. With "
      "forced or strict it raises as a model load would.");
  m.def(
      "select_attention",
      [](const std::string& device, int sm, const std::string& phase, int head_dim, const std::string& q,
         const std::string& out, const std::string& k, const std::string& v, int gqa, int block_size,
         const std::string& forced, bool strict, bool k_per_channel) {
        AttnDesc d;
        d.device = Device::parse(device).kind;
        d.sm = sm;
        LOWBIT_CHECK(phase == "prefill" || phase == "decode", "select_attention: phase must be prefill or decode");
        d.phase = phase == "decode" ? AttnPhase::decode : AttnPhase::prefill;
        d.head_dim = head_dim;
        d.q_type = scalar_type_from_name(q);
        d.out_type = scalar_type_from_name(out.empty() ? q : out);
        d.k_type = scalar_type_from_name(k);
        d.v_type = scalar_type_from_name(v);
        d.gqa_group = gqa;
        d.block_size = block_size;
        if (k_per_channel) d.kv_granularity = KvGranularity::per_channel_k;
        nb::dict r = forced.empty() && !strict ? selection_dict(try_select_attention(d))
                                               : selection_dict(select_attention(d, forced, strict, "select_attention"));
        r["desc"] = d.to_string();
        return r;
      },
      nb::kw_only(), nb::arg("device"), nb::arg("sm") = 0, nb::arg("phase") = "prefill", nb::arg("head_dim") = 64,
      nb::arg("q") = "f32", nb::arg("out") = "", nb::arg("k") = "f32", nb::arg("v") = "f32", nb::arg("gqa") = 1,
      nb::arg("block_size") = 16, nb::arg("forced") = "", nb::arg("strict") = false,
      nb::arg("k_per_channel") = false,
      "The attention kernel for a descriptor, as select_gemm (k_per_channel: K quantized per channel).");
}

}  // namespace lowbit::bindings
