// The Hopper prefill attention instances with the previous per-channel K extraction (each code shifted and masked)
// at head_dim 128, u4c K with u4 V and u2c K with u2 V (V the previous way too): the kernel option
// prefill_ref_dequant selects them for the bit-identity tests against the placed-field dequantization
// (prefill_attention_sm90.cuh, store_channel_codes). A file of their own so the build compiles them beside the rest.
#include "kernels/sm90/prefill_attention_sm90.cuh"

namespace lowbit::cuda {
template void launch_prefill_attention_sm90<128, KvType::u4c, KvType::u4, true>(const PrefillTcArgs&, dim3,
                                                                                 cudaStream_t);
template void launch_prefill_attention_sm90<128, KvType::u2c, KvType::u2, true>(const PrefillTcArgs&, dim3,
                                                                                 cudaStream_t);
}  // namespace lowbit::cuda
