// make_tensor_parallel_models (model/tensor_parallel_group.h).
#include "lowbit/model/tensor_parallel_group.h"

namespace lowbit {

std::vector<std::unique_ptr<Model>> make_tensor_parallel_models(const ModelConfig& config, const std::string& recipe,
                                                                const std::string& device, const std::string& dtype,
                                                                int world, const std::string& backend) {
  constexpr const char* op = "make_tensor_parallel_models";
  LOWBIT_CHECK(world >= 1, op, ": argument 'world' must be >= 1, got ", world);
  LOWBIT_CHECK(backend == "auto" || backend == "nccl" || backend == "threads", op,
               ": argument 'backend' must be auto, nccl or threads, got '", backend, "'");
  const Device first = Device::parse(device);
  LOWBIT_CHECK(backend != "nccl" || first.is_cuda(), op, ": backend 'nccl' needs a CUDA device, got ", device);
  const bool nccl = first.is_cuda() && backend != "threads";
  std::vector<std::shared_ptr<Communicator>> comms;
  std::vector<std::string> devices;
  if (nccl) {
    std::vector<int> ordinals;
    for (int r = 0; r < world; ++r) {
      ordinals.push_back(first.index + r);
      devices.push_back("cuda:" + std::to_string(first.index + r));
    }
    comms = make_nccl_communicators(ordinals);
  } else {
    comms = make_thread_communicators(world);
    devices.assign(size_t(world), first.str());
  }
  std::vector<std::unique_ptr<Model>> models;
  for (int r = 0; r < world; ++r) {
    models.push_back(std::make_unique<Model>(config, recipe, devices[size_t(r)], dtype));
    models.back()->set_tensor_parallel(comms[size_t(r)]);
  }
  return models;
}

}  // namespace lowbit
