// sm80-family (mma.sync) packing. Placeholder until the GPU W4A16 kernel lands.
#include "lowbit/quant/pack.h"

namespace lowbit {

PackedWeight pack_sm80(const QuantizedWeight& w, const Device&) {
  LOWBIT_NOT_SUPPORTED("pack_sm80: format ", name_of(w.format), " has no sm80 layout yet");
}
QuantizedWeight unpack_sm80(const PackedWeight& p) {
  LOWBIT_NOT_SUPPORTED("unpack_sm80: format ", name_of(p.format), " has no sm80 layout yet");
}

}  // namespace lowbit
