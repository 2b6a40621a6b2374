// Sampling on the GPU (cuda::sample_rows): per-row parameters staged on the host and uploaded, the sampled
// tokens and their logprobs brought back with one sync. The decode graphs and eager steps each hold one, so
// neither downloads [rows, vocab] f32 logits for rows the device can answer.
#pragma once
#include <cstdint>
#include <vector>

#include "lowbit/core/tensor.h"
#include "lowbit/model/model.h"

namespace lowbit {

struct DeviceSampler {
  DeviceSampler() = default;
  DeviceSampler(int64_t max_rows, const Device& device);

  // Checks and uploads (current stream) the parameters of rows [0, rows): sampling[i] for i < sampling.size(),
  // greedy for the padding rows after them.
  void stage(const std::vector<RowSampling>& sampling, int64_t rows, const char* op);
  // The same from a caller's page-locked host buffer of max_rows x 5 f64 (the upload then never waits for the
  // stream's earlier work).
  void stage(const std::vector<RowSampling>& sampling, int64_t rows, double* host, const char* op);
  // Samples rows [0, logits.size(0)) of `logits` (device, any float dtype) on the current stream.
  void sample(const Tensor& logits) const;
  // Copies the first n tokens and logprobs back and synchronizes the current stream (the step's one sync).
  void fetch(int64_t n, std::vector<int32_t>& tokens, std::vector<float>& logprobs, const char* op) const;
  // Queues the copy of the first n tokens and logprobs into page-locked host buffers (current stream, no sync).
  void download_async(int64_t n, int32_t* tokens, float* logprobs, const char* op) const;

  int64_t max_rows = 0;
  Tensor params_host, params_device;      // [max_rows, 5] f64 bits (s64 storage): RowSampling per row
  Tensor tokens_device, logprobs_device;  // s32 / f32 [max_rows]
  Tensor tokens_host, logprobs_host;
};

}  // namespace lowbit
