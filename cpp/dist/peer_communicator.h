// The one-shot all-reduce group over peer memory (peer_communicator.cpp); internal to lowbit_dist.
#pragma once
#include <memory>
#include <vector>

#include "lowbit/dist/communicator.h"

namespace lowbit {

// The bound make_nccl_communicators(devices, requested) uses: requested >= 0 as given, -1 the default or the
// environment's (LOWBIT_TP_ONESHOT=0, LOWBIT_TP_ONESHOT_MAX_BYTES=n). Throws on a bound out of [0, capacity].
int64_t oneshot_bound(int64_t requested);

// `nccl` (one rank per GPU of `devices`, rank order) with all-reduces of <= max_bytes moved to the one-shot kernel,
// or `nccl` itself when max_bytes is 0, the group has 1 or more than 8 ranks, or a pair of GPUs lacks peer access
// (said once on stderr). Builds with NCCL and CUDA only.
std::vector<std::shared_ptr<Communicator>> with_oneshot_all_reduce(std::vector<std::shared_ptr<Communicator>> nccl,
                                                                   const std::vector<int>& devices, int64_t max_bytes);

}  // namespace lowbit
