// The Hopper prefill attention instances for head_dim 128 and u4 K, every V type (prefill_attention_sm90.cuh).
#include "kernels/sm90/prefill_attention_sm90.cuh"

namespace lowbit::cuda {

template void launch_prefill_attention_sm90<128, KvType::u4, KvType::f16>(const PrefillTcArgs&, dim3, cudaStream_t);
template void launch_prefill_attention_sm90<128, KvType::u4, KvType::u8>(const PrefillTcArgs&, dim3, cudaStream_t);
template void launch_prefill_attention_sm90<128, KvType::u4, KvType::u4>(const PrefillTcArgs&, dim3, cudaStream_t);
template void launch_prefill_attention_sm90<128, KvType::u4, KvType::u2>(const PrefillTcArgs&, dim3, cudaStream_t);

}  // namespace lowbit::cuda
