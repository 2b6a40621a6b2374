// The K/V element types of the tensor-core attention kernels (decode_attention_sm80.cuh and
// prefill_attention_tc_sm80.cuh, their generated instances and tables): one enum, one mapping from the
// cache's ScalarType, so the kernels and their registry entries cannot disagree on what an instance means.
#pragma once
#include "lowbit/core/dtype.h"

namespace lowbit::cuda {

// u4c: K only, per-channel 4-bit K (KVCacheConfig::k_per_channel): u4 codes in the per-token row layout, one
// (scale, zero) pair per channel per block in k_params [blocks, Hkv, 2, D], and the f16 residual window for
// a block that is not yet complete (KVCache::k_window). V is always per token.
enum class KvType { f16, u8, u4, u4c };

template <KvType T>
constexpr int kv_bits() { return T == KvType::f16 ? 16 : T == KvType::u8 ? 8 : 4; }

// The KvType of a cache tensor's dtype (K per channel or not); false for one the kernels have no instance of.
inline bool kv_type_of(ScalarType s, KvType& t, bool per_channel = false) {
  if (per_channel) {
    if (s != ScalarType::u4) return false;
    t = KvType::u4c;
    return true;
  }
  switch (s) {
    case ScalarType::f16: t = KvType::f16; return true;
    case ScalarType::u8: t = KvType::u8; return true;
    case ScalarType::u4: t = KvType::u4; return true;
    default: return false;
  }
}

}  // namespace lowbit::cuda
