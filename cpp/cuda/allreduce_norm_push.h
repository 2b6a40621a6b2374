// The all-reduce after a row-parallel linear, fused with the residual add and the RMSNorm that follow it, for the
// ranks of one process (dist/peer_communicator.cpp): one kernel per rank instead of all-reduce + add_rms_norm.
//
// The protocol pushes instead of pulling: each rank writes its partial rows straight into every peer's inbox (its
// own GPU memory, reached through peer pointers), each 4-byte word of data stored beside a 4-byte flag holding the
// call's step, 16 bytes at a time (the low-latency line format NCCL's LL protocol uses: an aligned 8-byte half of a
// 16-byte store lands whole, so a reader that sees the step in a flag sees the data word beside it). A rank then
// polls only its own memory until every peer's lines carry the step. No flag words, no fence, no remote reads: the
// peer's data costs one NVLink write, where the one-shot kernel's pull costs a flag round trip and remote loads.
//
// Why it is safe: the step is one per group and call (every block of a call reads the same counter; the last block
// to read it advances it), and calls alternate between two halves of the inbox by step parity. A sender writes call
// e + 2 into the half of call e only after it has received the peer's lines of call e + 1, which the peer writes in
// a later kernel than the one that read call e (stream order). Flags only grow, so a stale line never matches the
// awaited step (until the 32-bit step wraps, after 2^32 calls of the group: a line would have to stay unwritten
// for all of them).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/allreduce_oneshot.h"
#include "lowbit/core/dtype.h"

namespace lowbit::cuda {

// Every rank's kernel needs these (device pointers; `inbox` is indexed by rank).
struct PushNormArgs {
  void* inbox[kOneShotMaxWorld] = {};   // per rank: [2 halves][world senders][2 * capacity bytes] of LL lines
  void* own_inbox = nullptr;            // inbox[rank] (the kernel indexes inbox only statically: no local copy)
  uint32_t* counters = nullptr;         // this rank's 2 words: the call's step, the blocks done with it (start at 0)
  const volatile int* abort = nullptr;  // host-mapped; nonzero stops every wait (the group failed)
  int rank = 0, world = 0;
  int64_t capacity = 0;                 // data bytes of one call's rows (LL lines take twice that)
};
// Bytes of device memory one rank's inbox takes for a group of `world` ranks and `capacity` data bytes per call.
int64_t push_norm_inbox_bytes(int world, int64_t capacity);

// residual += round(sum over ranks of partial, in rank order), rounded to the rows' dtype exactly as an all-reduce +
// add_rms_norm round it; then out = rms_norm(residual) * weight, or the per-token codes of that out (q_type s8 /
// e4m3, f16 rows only; as the norm that quantizes, rms_norm_quantize). One block per row.
struct ReduceNormRows {
  const void* partial = nullptr;  // this rank's [rows, cols], row stride ld_partial (elements)
  void* residual = nullptr;       // [rows, cols], updated in place
  const void* weight = nullptr;   // [cols], f32 or the rows' dtype
  void* out = nullptr;            // [rows, cols] normed rows, or nullptr when q is set
  void* q = nullptr;              // [rows, ldq] codes and scales [rows] instead of out
  float* scales = nullptr;
  int64_t ld_partial = 0, ld_residual = 0, ld_out = 0, ldq = 0;
  int64_t rows = 0, cols = 0;
  ScalarType dtype = ScalarType::f16, weight_dtype = ScalarType::f16, q_type = ScalarType::s8;
  float eps = 0.f;
};
// Whether push_add_rms_norm takes these rows (shapes, dtypes and strides only, so every rank of a group answers the
// same): rows * row bytes <= capacity, at most 64 rows, whole 16-byte packs per row, cols <= 2048 packs. `why` gets
// the reason.
bool push_add_rms_norm_fits(const PushNormArgs& args, const ReduceNormRows& n, const char** why = nullptr);
// Every rank calls it with the same shapes; the pointers must be 16-byte aligned (an error otherwise).
void push_add_rms_norm(const PushNormArgs& args, const ReduceNormRows& n, cudaStream_t stream);

}  // namespace lowbit::cuda
