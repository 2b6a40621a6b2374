// The f16 GEMM on cuBLASLt, at every token count (the registry's rule: cpp/kernels/registry/gemm_cublaslt_entries.cpp).
//
// Why a vendor library: lowbit's f16 GEMM (gemm_f16_mma_sm80.cu) runs on mma.sync, which on Hopper tops out
// near 320 TFLOPS while the f16 wgmma kernels cuBLAS ships reach ~650; and at one token cuBLAS's GEMV reads the
// weight faster than lowbit's f16 GEMV. The f16 GEMMs are the w16a16 linears and the f16 lm_head of every recipe
// (QServe keeps it in f16): at the peak-throughput batch it is one of the largest GEMMs of a step (8B shape, 1536
// rows: 1.6 TFLOP), at batch 1 the largest weight read (1 GB). A hand-written f16 kernel would only re-derive
// cuBLAS's; the quantized GEMMs stay lowbit's own.
//
// The product in cuBLAS's column-major terms: y row-major [m, n] is D column-major n x m (ld = ldy); w row-major
// [n, k] is a column-major k x n matrix (ld = ldw) taken transposed; x row-major [m, k] is column-major k x m
// (ld = ldx). So D = op(A) · B with A = w (transa = T), B = x (transb = N), and the bias, one value per row of D,
// is one per output column of y: cuBLASLt's BIAS epilogue.
//
// Each thread keeps its own handle and plan cache (the engine's rank threads each drive one device; nothing is
// shared on the launch path). A plan holds the descriptors and the heuristic's first algorithm for one device,
// shape, row strides and pointer alignments (the heuristic excludes algorithms that need more alignment than
// the pointers have). The algorithm's workspace comes from lowbit's allocator per call, so under graph capture
// it is the graph pool's memory like any other scratch.
#include "kernels/cublaslt/gemm_f16_cublaslt.h"

#include <cublasLt.h>

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "lowbit/cuda/check.h"

namespace lowbit::cuda {
namespace {

constexpr const char* kOp = "gemm_f16_cublaslt";
// The most workspace an algorithm may ask for (what torch grants cuBLASLt on Hopper); most large-M algorithms
// take none, split-K ones a few MB.
constexpr uint64_t kMaxWorkspaceBytes = 32ull << 20;
// A cache that outgrows this (eager decoding over many batch sizes) starts over rather than grow without bound.
constexpr size_t kMaxPlans = 1024;

void check_status(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  LOWBIT_FAIL(status == CUBLAS_STATUS_ALLOC_FAILED ? ErrorKind::kOutOfMemory : ErrorKind::kRuntime, kOp, ": ", call,
              " failed: ", cublasLtGetStatusName(status), " (", cublasLtGetStatusString(status), ")");
}
#define LOWBIT_CUBLASLT_CHECK(call) check_status((call), #call)

// The largest power of two up to 256 that divides the address (cuBLASLt's alignment preferences).
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 2 && a % al != 0) al /= 2;
  return al;
}

struct PlanKey {
  int device;
  int64_t m, n, k, ldx, ldw, ldy;
  uint32_t align_x, align_w, align_y;
  bool bias;
  bool operator==(const PlanKey& o) const {
    return device == o.device && m == o.m && n == o.n && k == o.k && ldx == o.ldx && ldw == o.ldw && ldy == o.ldy &&
           align_x == o.align_x && align_w == o.align_w && align_y == o.align_y && bias == o.bias;
  }
};
struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const {
    size_t h = static_cast<size_t>(key.device);
    for (int64_t v : {key.m, key.n, key.k, key.ldx, key.ldw, key.ldy,
                      static_cast<int64_t>(key.align_x) << 20 | static_cast<int64_t>(key.align_w) << 10 | key.align_y,
                      static_cast<int64_t>(key.bias)})
      h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};

// The descriptors of one product and the algorithm the heuristic chose for it.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, y = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_bytes = 0;
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (y) cublasLtMatrixLayoutDestroy(y);
    if (x) cublasLtMatrixLayoutDestroy(x);
    if (w) cublasLtMatrixLayoutDestroy(w);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() { LOWBIT_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&p)); }
  ~Preference() { cublasLtMatmulPreferenceDestroy(p); }
  void set(cublasLtMatmulPreferenceAttributes_t attr, const void* value, size_t bytes) {
    LOWBIT_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, value, bytes));
  }
};

struct ThreadState {
  cublasLtHandle_t handle = nullptr;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;
  ~ThreadState() {
    plans.clear();
    if (handle) cublasLtDestroy(handle);
  }
};
ThreadState& thread_state() {
  thread_local ThreadState state;
  if (!state.handle) LOWBIT_CUBLASLT_CHECK(cublasLtCreate(&state.handle));
  return state;
}

std::unique_ptr<Plan> make_plan(cublasLtHandle_t handle, const PlanKey& key) {
  auto plan = std::make_unique<Plan>();
  LOWBIT_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
  LOWBIT_CUBLASLT_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)));
  LOWBIT_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)));
  if (key.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_16F;
    LOWBIT_CUBLASLT_CHECK(
        cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    LOWBIT_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                         sizeof(bias_type)));
  }
  const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
  LOWBIT_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&plan->w, CUDA_R_16F, u(key.k), u(key.n), key.ldw));
  LOWBIT_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&plan->x, CUDA_R_16F, u(key.k), u(key.m), key.ldx));
  LOWBIT_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&plan->y, CUDA_R_16F, u(key.n), u(key.m), key.ldy));

  Preference pref;
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kMaxWorkspaceBytes, sizeof(kMaxWorkspaceBytes));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.align_w, sizeof(key.align_w));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.align_x, sizeof(key.align_x));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.align_y, sizeof(key.align_y));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.align_y, sizeof(key.align_y));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  LOWBIT_CUBLASLT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, plan->op, plan->w, plan->x, plan->y, plan->y, pref.p,
                                                       1, &result, &found));
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, found > 0 && result.state == CUBLAS_STATUS_SUCCESS, kOp,
                    ": cuBLASLt has no algorithm for m=", key.m, " n=", key.n, " k=", key.k, " (row strides x ",
                    key.ldx, ", w ", key.ldw, ", y ", key.ldy, "; alignments ", key.align_x, "/", key.align_w, "/",
                    key.align_y, " bytes)");
  plan->algo = result.algo;
  plan->workspace_bytes = result.workspaceSize;
  return plan;
}

void check_f16_matrix(const Tensor& t, const char* arg) {
  check_cuda_tensor(t, kOp, arg);
  LOWBIT_CHECK_TYPE(t.dtype() == ScalarType::f16, kOp, ": ", arg, " must be float16, got ", name_of(t.dtype()));
  LOWBIT_CHECK(t.dim() == 2, kOp, ": ", arg, " must be 2-D, got ", t.dim(), "-D");
  LOWBIT_CHECK(t.size(1) <= 1 || t.stride(1) == 1, kOp, ": ", arg, " rows must be contiguous (column stride 1), got ",
               t.stride(1));
  LOWBIT_CHECK(t.size(0) <= 1 || t.stride(0) >= t.size(1), kOp, ": ", arg, " row stride ", t.stride(0),
               " is below its row length ", t.size(1));
  LOWBIT_CHECK(t.size(0) < (1LL << 31) && t.size(1) < (1LL << 31), kOp, ": ", arg, " is too large");
}

}  // namespace

void gemm_f16_cublaslt(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, cudaStream_t stream) {
  check_f16_matrix(x, "x");
  check_f16_matrix(w, "w");
  check_f16_matrix(y, "y");
  check_same_device(w, x, kOp, "w");
  check_same_device(y, x, kOp, "y");
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  LOWBIT_CHECK(w.size(1) == k, kOp, ": x has k=", k, " columns but w [", n, ", ", w.size(1), "] has ", w.size(1));
  LOWBIT_CHECK(y.size(0) == m && y.size(1) == n, kOp, ": y must be [", m, ", ", n, "], got [", y.size(0), ", ",
               y.size(1), "]");
  if (bias.defined()) {
    check_same_device(bias, x, kOp, "bias");
    LOWBIT_CHECK_TYPE(bias.dtype() == ScalarType::f16, kOp, ": bias must be float16, got ", name_of(bias.dtype()));
    LOWBIT_CHECK(bias.numel() == n && bias.is_contiguous(), kOp, ": bias must be a contiguous [", n, "], got ",
                 bias.numel(), " values");
  }
  LOWBIT_CHECK_KIND(ErrorKind::kNotSupported, k > 0, kOp, ": k = 0 (an empty product) is not a GEMM cuBLASLt runs");
  if (m == 0 || n == 0) return;
  const int device = x.device().index;
  LOWBIT_CUDA_CHECK(kOp, cudaSetDevice(device));
  // A single row (or column) may carry any stride: cuBLASLt still wants ld >= rows of the column-major view.
  const PlanKey key{device,
                    m,
                    n,
                    k,
                    m > 1 ? x.stride(0) : k,
                    n > 1 ? w.stride(0) : k,
                    m > 1 ? y.stride(0) : n,
                    alignment_of(x.data_ptr()),
                    alignment_of(w.data_ptr()),
                    alignment_of(y.data_ptr()),
                    bias.defined()};
  ThreadState& state = thread_state();
  auto it = state.plans.find(key);
  if (it == state.plans.end()) {
    if (state.plans.size() >= kMaxPlans) state.plans.clear();
    it = state.plans.emplace(key, make_plan(state.handle, key)).first;
  }
  const Plan& plan = *it->second;
  if (bias.defined()) {
    const void* bias_ptr = bias.data_ptr();
    LOWBIT_CUBLASLT_CHECK(
        cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof(bias_ptr)));
  }
  Tensor workspace;
  if (plan.workspace_bytes > 0)
    workspace = Tensor::empty({static_cast<int64_t>(plan.workspace_bytes)}, ScalarType::u8, x.device());
  const float alpha = 1.f, beta = 0.f;
  LOWBIT_CUBLASLT_CHECK(cublasLtMatmul(state.handle, plan.op, &alpha, w.data_ptr(), plan.w, x.data_ptr(), plan.x,
                                       &beta, y.data_ptr(), plan.y, y.data_ptr(), plan.y, &plan.algo,
                                       workspace.defined() ? workspace.data_ptr() : nullptr, plan.workspace_bytes,
                                       stream));
  LOWBIT_CUDA_CHECK_LAUNCH(kOp);
}

}  // namespace lowbit::cuda
