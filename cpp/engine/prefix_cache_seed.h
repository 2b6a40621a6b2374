// The root key of an engine's prefix cache: everything besides the tokens that changes a block's K/V.
#pragma once
#include <cstdint>

#include "lowbit/kv/kv_cache.h"
#include "lowbit/model/model.h"

namespace lowbit::engine_detail {

// Hashes the model's architecture (every ModelConfig field), recipe, compute dtype, device type and
// the cache's K/V formats and block size. Two engines agree on it exactly when equal token prefixes
// give them the same K/V (given the same weights: the cache lives inside one engine, whose model
// never changes).
uint64_t prefix_cache_seed(const Model& model, const KVCacheConfig& cache);

}  // namespace lowbit::engine_detail
