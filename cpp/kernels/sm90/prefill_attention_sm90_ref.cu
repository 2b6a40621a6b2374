// The Hopper prefill attention instances with the previous u4 / u2 dequantization (shift and mask per code), K and
// V both u4 or both u2: the kernel option prefill_ref_dequant selects them for the A/B timing and the bit-identity
// tests against the placed-field dequantization (prefill_attention_sm90.cuh, store_codes_f32).
#include "kernels/sm90/prefill_attention_sm90.cuh"

namespace lowbit::cuda {
template void launch_prefill_attention_sm90<64, KvType::u4, KvType::u4, true>(const PrefillTcArgs&, dim3, cudaStream_t);
template void launch_prefill_attention_sm90<64, KvType::u2, KvType::u2, true>(const PrefillTcArgs&, dim3, cudaStream_t);
template void launch_prefill_attention_sm90<128, KvType::u4, KvType::u4, true>(const PrefillTcArgs&, dim3,
                                                                                cudaStream_t);
template void launch_prefill_attention_sm90<128, KvType::u2, KvType::u2, true>(const PrefillTcArgs&, dim3,
                                                                                cudaStream_t);
}  // namespace lowbit::cuda
