// One instance of a tensor-core attention kernel, as the registry and the dispatchers see it: the
// (head_dim, K type, V type, K per channel) it was generated for, and whether the build compiled it. The lists are
// generated (instances/attention_instance_list.h, tools/generate_attention_instances.py); "extra"
// instances (the rare head dims) are compiled only with the CMake option LOWBIT_ATTN_ALL_INSTANCES.
// Host-only C++: the registry includes it in builds without CUDA too.
#pragma once
#include <cstddef>
#include <string>

#include "lowbit/core/dtype.h"

#ifndef LOWBIT_ATTN_ALL_INSTANCES  // CMakeLists.txt defines it (0 or 1) for every target
#define LOWBIT_ATTN_ALL_INSTANCES 0
#endif

namespace lowbit::cuda {

struct AttnInstance {
  int head_dim;
  ScalarType k, v;
  bool k_per_channel;  // K codes with a (scale, zero) per channel per block (KVCacheConfig::k_per_channel)
  bool extra;  // compiled only with LOWBIT_ATTN_ALL_INSTANCES=ON
};

inline constexpr bool kAttnAllInstances = LOWBIT_ATTN_ALL_INSTANCES != 0;
// What an error about an instance left out of the build tells the user to do.
inline constexpr const char* kAttnAllInstancesHint = "configure with -DLOWBIT_ATTN_ALL_INSTANCES=ON";

enum class InstanceState { none, not_built, built };

template <size_t N>
InstanceState instance_state(const AttnInstance (&list)[N], int head_dim, ScalarType k, ScalarType v,
                             bool k_per_channel = false) {
  for (const AttnInstance& i : list)
    if (i.head_dim == head_dim && i.k == k && i.v == v && i.k_per_channel == k_per_channel)
      return i.extra && !kAttnAllInstances ? InstanceState::not_built : InstanceState::built;
  return InstanceState::none;
}

// "64, 80, 96, 128, 256": the head dims of a list, built or not (for messages).
template <size_t N>
std::string head_dims_of(const AttnInstance (&list)[N]) {
  std::string out;
  int last = 0;
  for (const AttnInstance& i : list) {
    if (i.head_dim == last) continue;
    out += (out.empty() ? "" : ", ") + std::to_string(i.head_dim);
    last = i.head_dim;
  }
  return out;
}

}  // namespace lowbit::cuda
