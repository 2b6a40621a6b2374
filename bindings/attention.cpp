// rope, kv_write, paged_attention and their AttentionMeta.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <map>

#include "bindings/bind.h"
#include "bindings/tensor_arg.h"
#include "lowbit/ops/ops.h"
#ifdef LOWBIT_WITH_CUDA
#include "lowbit/cuda/stream.h"
#endif

namespace nb = nanobind;

namespace lowbit::bindings {
namespace {

Tensor optional_tensor_arg(nb::handle obj, const char* arg) {
  return obj.is_none() ? Tensor() : tensor_from_python(obj, arg);
}

ops::RopeConfig rope_config(float theta, int rotary_dim, bool neox, bool llama3, float factor, float low_freq_factor,
                            float high_freq_factor, int original_max_position, float linear_factor) {
  ops::RopeConfig c;
  c.theta = theta;
  c.rotary_dim = rotary_dim;
  c.neox = neox;
  c.llama3 = llama3;
  c.factor = factor;
  c.low_freq_factor = low_freq_factor;
  c.high_freq_factor = high_freq_factor;
  c.original_max_position = original_max_position;
  c.linear_factor = linear_factor;
  return c;
}

// The keyword arguments of rope_config, shared by rope and rope_kv_write.
#define ROPE_CONFIG_ARGS                                                                                       \
  nb::arg("theta") = 10000.f, nb::arg("rotary_dim") = 0, nb::arg("neox") = true, nb::arg("llama3") = false,   \
      nb::arg("factor") = 1.f, nb::arg("low_freq_factor") = 1.f, nb::arg("high_freq_factor") = 4.f,           \
      nb::arg("original_max_position") = 8192, nb::arg("linear_factor") = 1.f

}  // namespace

void bind_attention(nb::module_& m) {
  using ops::AttentionMeta;
  nb::class_<AttentionMeta>(m, "AttentionMeta",
                            "One step's sequences: query rows [q_start[i], q_start[i] + q_len[i]) of sequence i, "
                            "which holds kv_len[i] cached tokens including the new ones; block_tables s32 "
                            "[num_seqs, max_blocks] (-1 padded), slot_mapping s32 [num_tokens]")
      .def(
          "__init__",
          [](AttentionMeta* self, std::vector<int32_t> q_start, std::vector<int32_t> q_len,
             std::vector<int32_t> kv_len, nb::handle block_tables, nb::handle slot_mapping) {
            new (self) AttentionMeta();
            self->q_start = std::move(q_start);
            self->q_len = std::move(q_len);
            self->kv_len = std::move(kv_len);
            self->block_tables = optional_tensor_arg(block_tables, "block_tables");
            self->slot_mapping = optional_tensor_arg(slot_mapping, "slot_mapping");
            for (int32_t x : self->q_len) self->max_q_len = std::max(self->max_q_len, x);
            for (int32_t x : self->kv_len) self->max_kv_len = std::max(self->max_kv_len, x);
          },
          nb::arg("q_start"), nb::arg("q_len"), nb::arg("kv_len"), nb::arg("block_tables") = nb::none(),
          nb::arg("slot_mapping") = nb::none())
      .def_rw("q_start", &AttentionMeta::q_start)
      .def_rw("q_len", &AttentionMeta::q_len)
      .def_rw("kv_len", &AttentionMeta::kv_len)
      .def_rw("max_q_len", &AttentionMeta::max_q_len)
      .def_rw("max_kv_len", &AttentionMeta::max_kv_len)
      .def_prop_rw(
          "block_tables", [](const AttentionMeta& a) { return a.block_tables.defined() ? nb::cast(a.block_tables) : nb::none(); },
          [](AttentionMeta& a, nb::handle t) { a.block_tables = optional_tensor_arg(t, "block_tables"); })
      .def_prop_rw(
          "slot_mapping", [](const AttentionMeta& a) { return a.slot_mapping.defined() ? nb::cast(a.slot_mapping) : nb::none(); },
          [](AttentionMeta& a, nb::handle t) { a.slot_mapping = optional_tensor_arg(t, "slot_mapping"); })
      .def_prop_rw(
          "seq_info", [](const AttentionMeta& a) { return a.seq_info.defined() ? nb::cast(a.seq_info) : nb::none(); },
          [](AttentionMeta& a, nb::handle t) { a.seq_info = optional_tensor_arg(t, "seq_info"); },
          "GPU: s32 [3, num_seqs] (q_start, q_len, kv_len) on the device, or None (paged_attention uploads it at each "
          "call, a synchronous copy: set it to capture the call in a CUDA graph)");

  m.def(
      "rope",
      [](nb::handle q, nb::handle k, nb::handle positions, float theta, int rotary_dim, bool neox, bool llama3,
         float factor, float low_freq_factor, float high_freq_factor, int original_max_position, float linear_factor) {
        Tensor qt = optional_tensor_arg(q, "q"), kt = optional_tensor_arg(k, "k");
        ops::rope(qt, kt, tensor_from_python(positions, "positions"),
                  rope_config(theta, rotary_dim, neox, llama3, factor, low_freq_factor, high_freq_factor,
                              original_max_position, linear_factor));
      },
      nb::arg("q").none(), nb::arg("k").none(), nb::arg("positions"), ROPE_CONFIG_ARGS,
      "Rotates q [T, Hq, D] and k [T, Hkv, D] (either may be None) in place at positions (int32 [T]). "
      "neox=True pairs (i, i + d/2) like HF rotate_half, False pairs (2i, 2i+1). llama3=True applies "
      "Llama-3 frequency scaling (factor, low/high_freq_factor, original_max_position); linear_factor "
      "divides positions.");

  m.def(
      "kv_write",
      [](KVCache& cache, int layer, nb::handle k, nb::handle v, const AttentionMeta& meta) {
        ops::kv_write(cache, layer, tensor_from_python(k, "k"), tensor_from_python(v, "v"), meta);
      },
      nb::arg("cache"), nb::arg("layer"), nb::arg("k"), nb::arg("v"), nb::arg("meta"),
      "Writes k, v [T, Hkv, D] into cache slots meta.slot_mapping (quantizing for u8/u4 caches)");

  m.def(
      "prepare_k_window",
      [](KVCache& cache, nb::handle slot_mapping) {
        ops::prepare_k_window(cache, tensor_from_python(slot_mapping, "slot_mapping"));
      },
      nb::arg("cache"), nb::arg("slot_mapping"),
      "Per-channel K on a GPU: before a step's kv_write and attention, give every block the step writes "
      "(host int32 slot_mapping [T]) an f16 window slot and upload the block -> slot map; a no-op otherwise");

  m.def(
      "rope_kv_write",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle positions, KVCache& cache, int layer,
         const AttentionMeta& meta, float theta, int rotary_dim, bool neox, bool llama3, float factor,
         float low_freq_factor, float high_freq_factor, int original_max_position, float linear_factor) {
        Tensor qt = optional_tensor_arg(q, "q"), kt = tensor_from_python(k, "k");
        ops::rope_kv_write(qt, kt, tensor_from_python(v, "v"), tensor_from_python(positions, "positions"),
                           rope_config(theta, rotary_dim, neox, llama3, factor, low_freq_factor, high_freq_factor,
                                       original_max_position, linear_factor),
                           cache, layer, meta);
      },
      nb::arg("q").none(), nb::arg("k"), nb::arg("v"), nb::arg("positions"), nb::arg("cache"), nb::arg("layer"),
      nb::arg("meta"), ROPE_CONFIG_ARGS,
      "rope(q, k, positions, ...) then kv_write(cache, layer, k, v, meta) as one op (one kernel on the GPU), "
      "with the same results: q (may be None) and k rotated in place, the rotated k and v in the cache.");

  m.def(
      "paged_attention",
      [](nb::handle q, const KVCache& cache, int layer, const AttentionMeta& meta, float scale, nb::handle out,
         const std::string& kernel, const std::map<std::string, std::string>& options, uintptr_t stream) {
        const kernels::ParsedKernelOptions parsed = kernels::parse_kernel_options(kernels::KernelOptions{options});
        LOWBIT_CHECK_KIND(ErrorKind::kValue, parsed.forced.empty(), "paged_attention: options take kernel tuning ",
                          "keys only; force a kernel with kernel=");
        Tensor qt = tensor_from_python(q, "q");
        Tensor ot = out.is_none() ? Tensor::empty(qt.shape(), qt.dtype(), qt.device()) : tensor_from_python(out, "out");
#ifdef LOWBIT_WITH_CUDA
        if (stream) {
          cuda::StreamScope scope(reinterpret_cast<cudaStream_t>(stream));
          ops::paged_attention(qt, cache, layer, meta, scale, ot, kernel, parsed.tuning);
          return out.is_none() ? nb::cast(ot) : nb::borrow(out);
        }
#endif
        LOWBIT_CHECK(stream == 0, "paged_attention: argument 'stream' needs a CUDA build of lowbit");
        ops::paged_attention(qt, cache, layer, meta, scale, ot, kernel, parsed.tuning);
        return out.is_none() ? nb::cast(ot) : nb::borrow(out);
      },
      nb::arg("q"), nb::arg("cache"), nb::arg("layer"), nb::arg("meta"), nb::arg("scale"),
      nb::arg("out") = nb::none(), nb::arg("kernel") = "", nb::arg("options") = std::map<std::string, std::string>{},
      nb::arg("stream") = 0,
      "out[T, Hq, D] = causal softmax(q kᵀ * scale) v over the paged cache (GQA when Hq > Hkv). "
      "Returns out (allocated like q when None). kernel: a registered attention kernel to force "
      "(lowbit._core.kernels.attention_kernels() lists them; one that cannot run raises with its reason), '' for "
      "the registry's choice. options: kernel tuning as kernel_overrides takes it (e.g. {'prefill_key_split': '4'}). "
      "stream: a cudaStream_t as an integer (torch.cuda.current_stream().cuda_stream) to launch on, 0 = lowbit's "
      "current stream; with meta.seq_info set, a GPU call can be captured in a CUDA graph on that stream.");
}

}  // namespace lowbit::bindings
