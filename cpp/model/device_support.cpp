// GPU support of the model: recipe coverage, device packing, per-step copies (device_support.h).
#include "model/device_support.h"

#include "lowbit/kernels/registry.h"

#ifdef LOWBIT_WITH_CUDA
#include <cuda_runtime_api.h>

#include "lowbit/cuda/check.h"
#include "lowbit/cuda/forward_kernels.h"
#include "lowbit/cuda/stream.h"
#endif

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

namespace lowbit::model_detail {
void check_device_recipe(const Recipe& recipe, ScalarType dtype, const Device& device, const ModelConfig& cfg) {
  if (device.is_cpu()) return;
  // 2-bit KV (kv2, k4v2, kc2..) has GPU attention instances at head_dim 64 and 128 only.
  if (recipe.has_kv2())
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, cfg.head_dim == 64 || cfg.head_dim == 128, "Model: KV format '",
                      kv_format_name(recipe), "' of recipe '", recipe.text, "' (2-bit KV) has GPU attention kernels for "
                      "head_dim 64 and 128 only, this model has ", cfg.head_dim, "; use a 4- or 8-bit KV format or "
                      "device='cpu'");
  const int cap = kernels::compute_capability(device);
  const std::string arch = "sm_" + std::to_string(cap);
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, cap >= 80, "Model: device ", device.str(),
                    " is ", arch, "; the GPU kernels need sm_80 or newer");
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, dtype == ScalarType::f16, "Model: on ", device.str(), " (", arch,
                    ") the GPU kernels compute in f16; dtype ", name_of(dtype), " has none: pass dtype='f16'");
  // The registry answers for the recipe's linears (finalize plans every shape; this fails before any
  // weight is uploaded).
  kernels::GemmDesc d;
  d.device = DeviceKind::cuda;
  d.sm = cap;
  d.act = recipe.activation;
  d.x_type = d.y_type = ScalarType::f16;
  if (recipe.activation == ActivationMode::fmpq_mixed) d.x_type = ScalarType::s8;  // the codes quantize_fmpq makes
  d.weight = recipe.weight_bits == 16 ? WeightFormat::f16 : recipe.weight;
  d.packed = PackTarget::sm80;
  d.group = recipe.group;
  d.n = d.k = cfg.hidden_size;
  const kernels::GemmSelection s = kernels::try_select_gemm(d);
  if (s.kernel == nullptr)
    LOWBIT_NOT_SUPPORTED("Model: recipe '", recipe.text, "' (", name_of(recipe.weight), " weights, ",
                         name_of(recipe.activation), " activations) has no GPU kernel for ", arch, " on ",
                         device.str(), ": ", s.reasons(), ". Use device='cpu' for it.");
}

PackedWeight pack_for_device(const QuantizedWeight& w, const Device& device) {
  if (w.format == WeightFormat::w4 || w.format == WeightFormat::f16 || w.format == WeightFormat::qoq ||
      w.format == WeightFormat::liquid)
    return pack_weight(w, PackTarget::sm80, device);
  PackedWeight p = packed_header(w, PackTarget::sm80);
  // w8 (W8A8 and W8A16 read the same row-major s8 and f32 scales: [n], or [n, groups] grouped) and e4m3.
  if (w.format == WeightFormat::w8 || w.format == WeightFormat::e4m3) {
    LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, w.k % 64 == 0, "Model: ", name_of(w.format), " weight with k = ", w.k,
                      " has no 8-bit GPU GEMM (k must be a multiple of 64)");
    p.data = w.q.contiguous().to(device);
    p.scales = w.scales.contiguous().to(device);
    return p;
  }
  LOWBIT_NOT_SUPPORTED("Model: no GPU layout for ", name_of(w.format), " weights");
}

void upload_async(const Tensor& dst, const Tensor& src) {
  LOWBIT_CHECK(dst.nbytes() == src.nbytes() && dst.is_contiguous() && src.is_contiguous() && src.device().is_cpu(),
               "upload_async: expected a contiguous host source of ", dst.nbytes(), " bytes, got ", src.str());
#ifdef LOWBIT_WITH_CUDA
  LOWBIT_CUDA_CHECK("upload_async", cudaMemcpyAsync(const_cast<void*>(dst.data_ptr()), src.data_ptr(),
                                                    size_t(src.nbytes()), cudaMemcpyHostToDevice,
                                                    cuda::current_stream()));
#else
  LOWBIT_NOT_SUPPORTED("upload_async: CUDA tensors need a CUDA build of lowbit");
#endif
}

void download_sync(const Tensor& dst, const Tensor& src, const char* what) {
  LOWBIT_CHECK(dst.nbytes() == src.nbytes() && dst.is_contiguous() && src.is_contiguous() && dst.device().is_cpu(),
               "download_sync: expected a contiguous host destination of ", src.nbytes(), " bytes, got ", dst.str());
#ifdef LOWBIT_WITH_CUDA
  LOWBIT_CUDA_CHECK(what, cudaMemcpyAsync(const_cast<void*>(dst.data_ptr()), src.data_ptr(), size_t(src.nbytes()),
                                          cudaMemcpyDeviceToHost, cuda::current_stream()));
  LOWBIT_CUDA_CHECK(what, cudaStreamSynchronize(cuda::current_stream()));
#else
  LOWBIT_NOT_SUPPORTED("download_sync: CUDA tensors need a CUDA build of lowbit");
#endif
}

void sync_stream(const char* what) {
#ifdef LOWBIT_WITH_CUDA
  LOWBIT_CUDA_CHECK(what, cudaStreamSynchronize(cuda::current_stream()));
#else
  LOWBIT_NOT_SUPPORTED(what, ": CUDA tensors need a CUDA build of lowbit");
#endif
}

DeviceMemory device_memory(const Device& device) {
#ifdef LOWBIT_WITH_CUDA
  size_t free_bytes = 0, total = 0;
  LOWBIT_CUDA_CHECK("device_memory", cudaSetDevice(device.index));
  LOWBIT_CUDA_CHECK("device_memory", cudaMemGetInfo(&free_bytes, &total));
  return DeviceMemory{int64_t(free_bytes), int64_t(total)};
#else
  LOWBIT_NOT_SUPPORTED("device_memory: ", device.str(), " needs a CUDA build of lowbit");
#endif
}

void bind_thread_to_device(const Device& device) {
  if (device.is_cpu()) return;
#ifdef LOWBIT_WITH_CUDA
  LOWBIT_CUDA_CHECK("bind_thread_to_device", cudaSetDevice(device.index));
#else
  LOWBIT_NOT_SUPPORTED("bind_thread_to_device: ", device.str(), " needs a CUDA build of lowbit");
#endif
}

void upload_step(const ForwardBatch& b, ModelWorkspace& ws, Tensor& ids, Tensor& positions, Tensor& logit_rows) {
  const int64_t T = int64_t(b.token_ids.size()), n = int64_t(b.attn.q_len.size()), R = int64_t(b.logit_rows.size());
  LOWBIT_CHECK(n <= ws.max_tokens, "Model.forward: ", n, " sequences in a step of at most ", ws.max_tokens,
               " tokens");
  int32_t* h = ws.step_host.data<int32_t>();
  int32_t* p = std::copy(b.token_ids.begin(), b.token_ids.end(), h);
  p = std::copy(b.positions.begin(), b.positions.end(), p);
  p = std::copy(b.attn.q_start.begin(), b.attn.q_start.end(), p);
  p = std::copy(b.attn.q_len.begin(), b.attn.q_len.end(), p);
  p = std::copy(b.attn.kv_len.begin(), b.attn.kv_len.end(), p);
  p = std::copy(b.logit_rows.begin(), b.logit_rows.end(), p);
  // A mixed step's attention runs its leading decode sequences and the rest on two kernels
  // (ops::paged_attention): their rows again, each part contiguous.
  const int64_t d = int64_t(decode_prefix(b.attn));
  const bool mixed = d > 0 && d < n;
  const int64_t parts_at = p - h;
  if (mixed)
    for (const auto [first, end] : {std::pair<int64_t, int64_t>{0, d}, {d, n}})
      for (const std::vector<int32_t>* v : {&b.attn.q_start, &b.attn.q_len, &b.attn.kv_len})
        p = std::copy(v->begin() + first, v->begin() + end, p);
  const int64_t used = p - h;
  upload_async(ws.step_device.slice(0, 0, used), ws.step_host.slice(0, 0, used));
  ids = ws.step_device.slice(0, 0, T);
  positions = ws.step_device.slice(0, T, 2 * T);
  ws.attn = b.attn;  // vectors keep their capacity across steps
  ws.attn.seq_info = ws.step_device.slice(0, 2 * T, 2 * T + 3 * n).view({3, n});
  logit_rows = ws.step_device.slice(0, 2 * T + 3 * n, 2 * T + 3 * n + R);
  ws.attn.decode_seq_info = ws.attn.prefill_seq_info = Tensor();
  if (mixed) {
    ws.attn.decode_seq_info = ws.step_device.slice(0, parts_at, parts_at + 3 * d).view({3, d});
    ws.attn.prefill_seq_info = ws.step_device.slice(0, parts_at + 3 * d, parts_at + 3 * n).view({3, n - d});
  }
}

void place_vocab_slices(const Tensor& gathered, int world, int64_t R, int64_t stride, Tensor& logits) {
  const int64_t vocab = logits.size(1);
  const size_t es = size_t(bytes_for(logits.dtype(), 1));
  const size_t dst_pitch = size_t(logits.stride(0)) * es;
  for (int r = 0; r < world; ++r) {
    const int64_t v0 = r * stride, width = std::min(vocab, v0 + stride) - v0;
    if (width <= 0) continue;
    const char* src = static_cast<const char*>(gathered.data_ptr()) + size_t(r * R * stride) * es;
    char* dst = static_cast<char*>(logits.data_ptr()) + size_t(v0) * es;
    if (logits.device().is_cpu()) {
      for (int64_t i = 0; i < R; ++i)
        std::memcpy(dst + size_t(i) * dst_pitch, src + size_t(i * width) * es, size_t(width) * es);
      continue;
    }
#ifdef LOWBIT_WITH_CUDA
    LOWBIT_CUDA_CHECK("Model.forward (logits gather)",
                      cudaMemcpy2DAsync(dst, dst_pitch, src, size_t(width) * es, size_t(width) * es, size_t(R),
                                        cudaMemcpyDeviceToDevice, cuda::current_stream()));
#else
    LOWBIT_NOT_SUPPORTED("Model.forward: CUDA tensors need a CUDA build of lowbit");
#endif
  }
}

void download_logits(const Tensor& logits_compute, const Tensor& f32_scratch, const Tensor& logits) {
#ifdef LOWBIT_WITH_CUDA
  const Tensor& c = logits_compute;
  cuda::cast_rows_to_f32(cuda::Rows{c.data_ptr(), c.dtype(), c.size(0), c.size(1), c.stride(0)},
                         cuda::Rows{f32_scratch.data_ptr(), ScalarType::f32, f32_scratch.size(0), f32_scratch.size(1),
                                    f32_scratch.stride(0)},
                         cuda::current_stream());
  download_sync(logits, f32_scratch, "Model.forward");
#else
  LOWBIT_NOT_SUPPORTED("Model.forward: CUDA tensors need a CUDA build of lowbit");
#endif
}

}  // namespace lowbit::model_detail
