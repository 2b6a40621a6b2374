// make_tensor_parallel_models: the C++ counterpart of lowbit.LLM(..., tensor_parallel=N). Makes N models, rank r
// on its device with its communicator already set; give every one of them the whole weights (each keeps its
// shard), finalize each, then hand them to Engine(std::vector<const Model*>) in rank order:
//
//   auto ranks = make_tensor_parallel_models(config, "w4a16kv8", "cuda", "f16", 2);
//   for (auto& m : ranks) { for (auto& [name, t] : weights) m->set_weight(name, t); m->finalize(); }
//   Engine engine({ranks[0].get(), ranks[1].get()}, EngineConfig{});
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "lowbit/model/model.h"

namespace lowbit {

// device "cpu": `world` thread ranks on the host. device "cuda[:i]": backend "auto"/"nccl" puts rank r on
// cuda:(i + r) over NCCL (NotSupported naming the reason when this build has none); "threads" keeps every rank
// on cuda:i, exchanging through host memory (no CUDA graphs; for tests). Shape errors (heads, groups that do not
// split) are raised here, before any weight is read.
std::vector<std::unique_ptr<Model>> make_tensor_parallel_models(const ModelConfig& config, const std::string& recipe,
                                                                const std::string& device, const std::string& dtype,
                                                                int world, const std::string& backend = "auto");

}  // namespace lowbit
