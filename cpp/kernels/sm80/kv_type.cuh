// The K/V element types of the tensor-core attention kernels (decode_attention_sm80.cuh and
// prefill_attention_tc_sm80.cuh, their generated instances and tables): one enum, one mapping from the
// cache's ScalarType, so the kernels and their registry entries cannot disagree on what an instance means.
#pragma once
#include "lowbit/core/dtype.h"

namespace lowbit::cuda {

// u4c / u2c: K only, per-channel 4- or 2-bit K (KVCacheConfig::k_per_channel): codes in the per-token row
// layout, one (scale, zero) pair per channel per block in k_params [blocks, Hkv, 2, D], and the f16 residual
// window for a block that is not yet complete (KVCache::k_window). V is always per token.
// u2 packs dim 4i + j in bits 2j..2j+1 of byte i (the CPU cache's order).
enum class KvType { f16, u8, u4, u4c, u2, u2c };

template <KvType T>
constexpr int kv_bits() {
  return T == KvType::f16 ? 16 : T == KvType::u8 ? 8 : T == KvType::u4 || T == KvType::u4c ? 4 : 2;
}
constexpr bool kv_per_channel_type(KvType t) { return t == KvType::u4c || t == KvType::u2c; }
template <KvType T>
constexpr bool kv_per_channel() { return kv_per_channel_type(T); }

// The KvType of a cache tensor's dtype (K per channel or not); false for one the kernels have no instance of.
inline bool kv_type_of(ScalarType s, KvType& t, bool per_channel = false) {
  if (per_channel) {
    if (s != ScalarType::u4 && s != ScalarType::u2) return false;
    t = s == ScalarType::u4 ? KvType::u4c : KvType::u2c;
    return true;
  }
  switch (s) {
    case ScalarType::f16: t = KvType::f16; return true;
    case ScalarType::u8: t = KvType::u8; return true;
    case ScalarType::u4: t = KvType::u4; return true;
    case ScalarType::u2: t = KvType::u2; return true;
    default: return false;
  }
}

}  // namespace lowbit::cuda
