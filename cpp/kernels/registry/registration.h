// The registration functions of every kernel family's files, called once (in this order) when a
// registry is first used. Order is the tie-break of the automatic choice: CPU, then by arch.
#pragma once
#include <vector>

#include "lowbit/kernels/registry.h"

namespace lowbit::kernels {

void register_gemm_cpu(std::vector<GemmKernel>& out);   // gemm_cpu_entries.cpp
void register_gemm_sm80(std::vector<GemmKernel>& out);  // gemm_sm80_entries.cpp
void register_gemm_sm90(std::vector<GemmKernel>& out);  // gemm_sm90_entries.cpp
void register_gemm_cublaslt(std::vector<GemmKernel>& out);  // gemm_cublaslt_entries.cpp
void register_attention_cpu(std::vector<AttnKernel>& out);   // attention_cpu_entries.cpp
void register_attention_sm80(std::vector<AttnKernel>& out);  // attention_sm80_entries.cpp
void register_attention_sm90(std::vector<AttnKernel>& out);  // attention_sm90_entries.cpp

// can_run helpers: set *why (when given) and answer.
inline Fit refuse(std::string* why, std::string reason) {
  if (why) *why = std::move(reason);
  return Fit::no;
}
inline Fit slow(std::string* why, std::string reason) {
  if (why) *why = std::move(reason);
  return Fit::fallback;
}
inline Fit fits(std::string* why, std::string reason = "") {
  if (why) *why = std::move(reason);
  return Fit::yes;
}

// The first check of every can_run: the kernel's device kind (the reason starts "runs on ", which
// keeps it out of the listed reasons: such a kernel was never a candidate).
inline bool on_device(DeviceKind kernel, DeviceKind desc, std::string* why) {
  if (kernel == desc) return true;
  if (why) *why = kernel == DeviceKind::cpu ? "runs on cpu" : "runs on cuda";
  return false;
}

}  // namespace lowbit::kernels
