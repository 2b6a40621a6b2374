// The K/V element types of the tensor-core attention kernels (decode_attention_sm80.cuh and
// prefill_attention_tc_sm80.cuh, their generated instances and tables): one enum, one mapping from the
// cache's ScalarType, so the kernels and their registry entries cannot disagree on what an instance means.
#pragma once
#include "lowbit/core/dtype.h"

namespace lowbit::cuda {

enum class KvType { f16, u8, u4 };

template <KvType T>
constexpr int kv_bits() { return T == KvType::f16 ? 16 : T == KvType::u8 ? 8 : 4; }

// The KvType of a cache tensor's dtype; false for a dtype the kernels have no instance of.
inline bool kv_type_of(ScalarType s, KvType& t) {
  switch (s) {
    case ScalarType::f16: t = KvType::f16; return true;
    case ScalarType::u8: t = KvType::u8; return true;
    case ScalarType::u4: t = KvType::u4; return true;
    default: return false;
  }
}

}  // namespace lowbit::cuda
