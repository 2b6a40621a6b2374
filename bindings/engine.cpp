// Model + Engine bindings (the contract in docs/embedding.md and python/lowbit): ModelConfig,
// Model, Engine, TokenEvent. step() and logits() release the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings/bind.h"
#include "bindings/tensor_arg.h"
#include "lowbit/engine/engine.h"
#include "lowbit/model/model.h"

namespace nb = nanobind;

namespace lowbit::bindings {
namespace {

nb::dict info_dict(const Model& m) {
  const Model::Info i = m.info();
  nb::dict d, bytes;
  d["recipe"] = i.recipe;
  d["dtype"] = i.dtype;
  d["device"] = i.device;
  for (const auto& kv : i.parameter_bytes) bytes[kv.first.c_str()] = kv.second;
  d["parameter_bytes"] = bytes;
  d["kv_bytes_per_token"] = i.kv_bytes_per_token;
  d["kernels"] = i.kernels;
  return d;
}

nb::dict stats_dict(const Engine& e) {
  const EngineStats s = e.stats();
  nb::dict d;
  d["num_free_blocks"] = s.num_free_blocks;
  d["num_blocks"] = s.num_blocks;
  d["block_size"] = s.block_size;
  d["running"] = s.running;
  d["waiting"] = s.waiting;
  d["preemptions"] = s.preemptions;
  d["sessions"] = s.sessions;
  d["prefill_tokens"] = s.prefill_tokens;
  d["generated_tokens"] = s.generated_tokens;
  d["prefix_caching"] = s.prefix_caching;
  d["prefix_cache_query_tokens"] = s.prefix_cache_query_tokens;
  d["prefix_cache_hit_tokens"] = s.prefix_cache_hit_tokens;
  d["prefix_cache_hit_rate"] = s.prefix_cache_query_tokens > 0
                                   ? double(s.prefix_cache_hit_tokens) / double(s.prefix_cache_query_tokens)
                                   : 0.0;
  d["prefix_cache_blocks"] = s.prefix_cache_blocks;
  d["prefix_cache_evictions"] = s.prefix_cache_evictions;
  d["decode_graph_steps"] = s.decode_graph_steps;
  d["decode_graph_ms"] = s.decode_graph_ms;
  d["decode_upload_ms"] = s.decode_upload_ms;
  d["decode_step_wall_ms"] = s.decode_step_wall_ms;
  d["decode_ranks_wall_ms"] = s.decode_ranks_wall_ms;
  d["decode_rank0_wall_ms"] = s.decode_rank0_wall_ms;
  d["overlapped_steps"] = s.overlapped_steps;
  d["dropped_rows"] = s.dropped_rows;
  return d;
}

}  // namespace

void bind_engine(nb::module_& m) {
  nb::class_<ModelConfig>(m, "ModelConfig", "Architecture of a Llama-family decoder (llama, mistral, qwen2)")
      .def(nb::init<>())
      .def_rw("arch", &ModelConfig::arch)
      .def_rw("vocab_size", &ModelConfig::vocab_size)
      .def_rw("hidden_size", &ModelConfig::hidden_size)
      .def_rw("intermediate_size", &ModelConfig::intermediate_size)
      .def_rw("num_layers", &ModelConfig::num_layers)
      .def_rw("num_heads", &ModelConfig::num_heads)
      .def_rw("num_kv_heads", &ModelConfig::num_kv_heads)
      .def_rw("head_dim", &ModelConfig::head_dim)
      .def_rw("rope_theta", &ModelConfig::rope_theta)
      .def_rw("rope_scaling_type", &ModelConfig::rope_scaling_type)
      .def_rw("rope_factor", &ModelConfig::rope_factor)
      .def_rw("rope_low_freq_factor", &ModelConfig::rope_low_freq_factor)
      .def_rw("rope_high_freq_factor", &ModelConfig::rope_high_freq_factor)
      .def_rw("rope_original_max_position", &ModelConfig::rope_original_max_position)
      .def_rw("rope_neox", &ModelConfig::rope_neox)
      .def_rw("rms_norm_eps", &ModelConfig::rms_norm_eps)
      .def_rw("tie_word_embeddings", &ModelConfig::tie_word_embeddings)
      .def_rw("attention_bias", &ModelConfig::attention_bias)
      .def_rw("max_position_embeddings", &ModelConfig::max_position_embeddings)
      .def("validate", &ModelConfig::validate);

  nb::class_<Model>(m, "Model", "Packed weights of a Llama-family model and its batched forward")
      .def(nb::init<const ModelConfig&, const std::string&, const std::string&, const std::string&>(),
           nb::arg("config"), nb::arg("recipe"), nb::arg("device") = "cpu", nb::arg("dtype") = "f32")
      .def(
          "set_weight",
          [](Model& self, const std::string& name, nb::handle tensor) {
            Tensor t;
            try {
              t = tensor_from_python(tensor, name.c_str());
            } catch (nb::python_error& e) {
              // Read-only arrays (memory-mapped checkpoints) cannot be exported by older DLPack
              // versions; the weight is copied into packed storage anyway, so take a writable copy.
              if (!e.matches(PyExc_BufferError) || !nb::hasattr(tensor, "copy")) throw;
              nb::object copy = tensor.attr("copy")();
              t = tensor_from_python(copy, name.c_str());
              self.set_weight(name, t);  // while `copy` is alive
              return;
            }
            self.set_weight(name, t);
          },
          nb::arg("name"), nb::arg("tensor"),
          "Float weight by HF name (any DLPack array); linear weights are quantized per the recipe")
      .def("set_quantized_weight", &Model::set_quantized_weight, nb::arg("name"), nb::arg("weight"))
      .def("set_tensor_parallel", &Model::set_tensor_parallel, nb::arg("comm"),
           "Make this model one rank of a tensor-parallel group (before any weight; weights are then given whole)")
      .def_prop_ro("tp_rank", &Model::tp_rank)
      .def_prop_ro("tp_world", &Model::tp_world)
      .def_prop_ro(
          "tp_all_reduce",
          [](const Model& m) { return m.communicator() ? m.communicator()->all_reduce_name() : std::string(); },
          "What the tensor-parallel all-reduces run on ('' without tensor parallelism)")
      .def("set_head_format", &Model::set_head_format, nb::arg("format"),
           "lm_head's weight format (f32, f16, bf16, w8, w4) instead of the recipe's rule; before lm_head is given")
      .def(
          "set_input_permutation",
          [](Model& self, const std::string& name, nb::handle perm) {
            self.set_input_permutation(name, tensor_from_python(perm, "perm"));
          },
          nb::arg("name"), nb::arg("perm"), "FMPQ: feed x[:, perm] (int32/int64 [k]) to this linear")
      .def(
          "set_fmpq_block_bits",
          [](Model& self, const std::string& name, nb::handle bits) {
            self.set_fmpq_block_bits(name, tensor_from_python(bits, "block_bits"));
          },
          nb::arg("name"), nb::arg("block_bits"), "a4 recipes: uint8 [ceil(k/128)] of 4 or 8, per input block")
      .def(
          "set_kernel_options",
          [](Model& self, const std::map<std::string, std::string>& overrides, bool strict) {
            self.set_kernel_options(kernels::KernelOptions{overrides, strict});
          },
          nb::arg("overrides") = std::map<std::string, std::string>{}, nb::arg("strict") = false,
          "Kernel overrides and strict mode, before finalize() (which resolves the plans with them)")
      .def(
          "plan",
          [](const Model& self) {
            nb::list out;
            for (const kernels::PlanLine& l : self.plan()) {
              nb::dict d;
              d["role"] = l.role;
              d["desc"] = l.desc;
              d["kernel"] = l.kernel;
              d["why"] = l.why;
              d["fallback"] = l.fallback;
              out.append(d);
            }
            return out;
          },
          "The execution plan: one dict (role, desc, kernel, why, fallback) per linear role and token bucket and "
          "per attention phase")
      .def("finalize", &Model::finalize)
      .def_prop_ro("finalized", &Model::finalized)
      .def_prop_ro("config", &Model::config)
      .def("info", &info_dict);

  nb::class_<TokenEvent>(m, "TokenEvent")
      .def_ro("request_id", &TokenEvent::request_id)
      .def_ro("token", &TokenEvent::token)
      .def_ro("logprob", &TokenEvent::logprob)
      .def_ro("top_logprobs", &TokenEvent::top_logprobs)
      .def_ro("finished", &TokenEvent::finished)
      .def_prop_ro("finish_reason",
                   [](const TokenEvent& e) -> nb::object {
                     return e.finish_reason.empty() ? nb::none() : nb::cast(e.finish_reason);
                   })
      .def("__repr__", [](const TokenEvent& e) {
        return "TokenEvent(request_id=" + std::to_string(e.request_id) + ", token=" + std::to_string(e.token) +
               ", finished=" + (e.finished ? "True" : "False") +
               (e.finish_reason.empty() ? std::string() : ", finish_reason='" + e.finish_reason + "'") + ")";
      });

  nb::class_<Engine>(m, "Engine", "Continuous-batching decode engine over one Model or a tensor-parallel group")
      .def("__init__",
           [](Engine* self, nb::handle model, int64_t max_batch_tokens, int max_seqs, int block_size,
              int64_t kv_cache_bytes, int num_threads, double gpu_memory_fraction, bool cuda_graphs,
              bool prefix_caching, bool overlap_steps) {
             EngineConfig c;
             c.max_batch_tokens = max_batch_tokens;
             c.max_seqs = max_seqs;
             c.block_size = block_size;
             c.kv_cache_bytes = kv_cache_bytes;
             c.num_threads = num_threads;
             c.gpu_memory_fraction = gpu_memory_fraction;
             c.cuda_graphs = cuda_graphs;
             c.prefix_caching = prefix_caching;
             c.overlap_steps = overlap_steps;
             // One Model, or the ranks of a tensor-parallel group in rank order.
             std::vector<const Model*> ranks;
             if (nb::isinstance<Model>(model))
               ranks.push_back(nb::cast<const Model*>(model));
             else
               for (nb::handle item : model) ranks.push_back(nb::cast<const Model*>(item));
             new (self) Engine(ranks, c);
           },
           nb::arg("model"), nb::arg("max_batch_tokens") = 2048, nb::arg("max_seqs") = 64, nb::arg("block_size") = 16,
           nb::arg("kv_cache_bytes") = 0, nb::arg("num_threads") = 0, nb::arg("gpu_memory_fraction") = 0.9,
           nb::arg("cuda_graphs") = true, nb::arg("prefix_caching") = true, nb::arg("overlap_steps") = true,
           nb::keep_alive<1, 2>())
      .def(
          "add_request",
          [](Engine& e, int64_t request_id, const std::vector<int32_t>& prompt_ids, float temperature, int top_k,
             float top_p, float min_p, float repetition_penalty, float presence_penalty, float frequency_penalty,
             uint64_t seed, int max_tokens, int min_tokens, const std::vector<int32_t>& stop_token_ids, int logprobs,
             int64_t session_id) {
            RequestOptions o;
            o.temperature = temperature;
            o.top_k = top_k;
            o.top_p = top_p;
            o.min_p = min_p;
            o.repetition_penalty = repetition_penalty;
            o.presence_penalty = presence_penalty;
            o.frequency_penalty = frequency_penalty;
            o.seed = seed;
            o.max_tokens = max_tokens;
            o.min_tokens = min_tokens;
            o.stop_token_ids = stop_token_ids;
            o.logprobs = logprobs;
            o.session_id = session_id;
            e.add_request(request_id, prompt_ids, o);
          },
          nb::arg("request_id"), nb::arg("prompt_ids"), nb::kw_only(), nb::arg("temperature") = 1.0f,
          nb::arg("top_k") = 0, nb::arg("top_p") = 1.0f, nb::arg("min_p") = 0.0f, nb::arg("repetition_penalty") = 1.0f,
          nb::arg("presence_penalty") = 0.0f, nb::arg("frequency_penalty") = 0.0f, nb::arg("seed") = 0,
          nb::arg("max_tokens") = 16, nb::arg("min_tokens") = 0, nb::arg("stop_token_ids") = std::vector<int32_t>(),
          nb::arg("logprobs") = 0, nb::arg("session_id") = -1)
      .def_prop_ro("tensor_parallel", &Engine::tensor_parallel)
      .def("step", &Engine::step, nb::call_guard<nb::gil_scoped_release>())
      .def("abort", &Engine::abort, nb::arg("request_id"))
      .def("end_session", &Engine::end_session, nb::arg("session_id"))
      .def("has_unfinished", &Engine::has_unfinished)
      .def("logits", &Engine::logits, nb::arg("prompt_ids"), nb::call_guard<nb::gil_scoped_release>())
      .def("stats", &stats_dict);
}

}  // namespace lowbit::bindings
