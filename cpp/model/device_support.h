// What the model needs to run on a CUDA device: which recipes have GPU kernels (checked at load,
// never a silent CPU fallback), device packing of the linears, and the per-step host<->device copies
// (one stream: the default one; uploads are asynchronous, the logits download is the step's sync).
#pragma once
#include "lowbit/core/tensor.h"
#include "lowbit/model/model.h"
#include "lowbit/quant/pack.h"
#include "lowbit/quant/recipe.h"

namespace lowbit::model_detail {

// Throws NotSupported naming the recipe (or dtype), the device's arch and every GEMM kernel's reason
// unless a registered GPU kernel runs the recipe's linears (compute dtype f16).
void check_device_recipe(const Recipe& recipe, ScalarType dtype, const Device& device, const ModelConfig& cfg);
// A linear packed for the sm80 kernel family on `device`: f16 as is ([n, k]), w8 as s8 [n, k] and
// e4m3 as e4m3 [n, k] with f32 scales [n] (k a multiple of 64), w4 through pack_sm80.
PackedWeight pack_for_device(const QuantizedWeight& w, const Device& device);
// dst (device, contiguous) <- src (host, contiguous, same bytes), asynchronous on the default stream.
void upload_async(const Tensor& dst, const Tensor& src);
// dst (host, contiguous) <- src (device, contiguous); waits for the stream, so any asynchronous
// kernel fault of the step surfaces here, named by `what`.
void download_sync(const Tensor& dst, const Tensor& src, const char* what);

// Waits for the current stream; an asynchronous kernel fault of the step surfaces here, named by `what`.
void sync_stream(const char* what);

// Free and total bytes of a CUDA device (cudaMemGetInfo), for sizing the KV pool.
struct DeviceMemory {
  int64_t free_bytes = 0, total_bytes = 0;
};
DeviceMemory device_memory(const Device& device);
// Makes `device` the calling thread's current CUDA device (a no-op for the CPU): the engine's rank threads.
void bind_thread_to_device(const Device& device);
// Stages the step's s32 metadata in ws.step_host (ids | positions | q_start | q_len | kv_len |
// logit rows), uploads it with one asynchronous copy, and points ids, positions, logit_rows and
// ws.attn (b.attn plus seq_info) at the device copy.
void upload_step(const ForwardBatch& b, ModelWorkspace& ws, Tensor& ids, Tensor& positions, Tensor& logit_rows);
// Tensor parallel logits: `gathered` holds `world` slots of [R, width_r] (contiguous, `stride` * R
// elements apart; width_r = rank r's vocabulary slice); they go side by side into logits [R, vocab]
// (rank r's at column r * stride). Host memcpy on the CPU, 2-D copies on the current stream on a GPU.
void place_vocab_slices(const Tensor& gathered, int world, int64_t R, int64_t stride, Tensor& logits);
// logits (host f32 [R, V]) <- logits_compute (device, compute dtype) through f32 scratch on the device.
void download_logits(const Tensor& logits_compute, const Tensor& f32_scratch, const Tensor& logits);

}  // namespace lowbit::model_detail
