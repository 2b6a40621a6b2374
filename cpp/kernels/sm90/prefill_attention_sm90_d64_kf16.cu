// The Hopper prefill attention instances for head_dim 64 and f16 K, every V type (prefill_attention_sm90.cuh).
#include "kernels/sm90/prefill_attention_sm90.cuh"

namespace lowbit::cuda {

template void launch_prefill_attention_sm90<64, KvType::f16, KvType::f16>(const PrefillTcArgs&, dim3, cudaStream_t);
template void launch_prefill_attention_sm90<64, KvType::f16, KvType::u8>(const PrefillTcArgs&, dim3, cudaStream_t);
template void launch_prefill_attention_sm90<64, KvType::f16, KvType::u4>(const PrefillTcArgs&, dim3, cudaStream_t);
template void launch_prefill_attention_sm90<64, KvType::f16, KvType::u2>(const PrefillTcArgs&, dim3, cudaStream_t);

}  // namespace lowbit::cuda
