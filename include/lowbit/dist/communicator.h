// Communicator: the collectives tensor parallelism needs, on lowbit tensors.
//
// One Communicator object per rank; the ranks of a group are made together by a factory and each
// rank's object is used by one host thread at a time (lowbit runs one thread per rank, engine.h).
// Every rank must call the same collectives in the same order with the same shapes; a rank that
// stops (an exception) aborts the group so that the others raise instead of waiting forever.
//
// Two implementations:
//   - threads (make_thread_communicators): the ranks are threads of this process and the tensors
//     live on the host or on a GPU (staged through host memory). Synchronous; for tests and for
//     sharded runs on one GPU. Not capturable into CUDA graphs.
//   - NCCL (make_nccl_communicators, builds with NCCL only): one GPU per rank, the collectives are
//     enqueued on the calling thread's current stream (cuda/stream.h) and can be captured in graphs.
//     When every pair of the GPUs has peer access, small all-reduces (a decode step's) take a one-shot
//     kernel over peer memory instead (dist/peer_communicator.cpp); everything else stays on NCCL. That group
//     also fuses the all-reduce after a row-parallel linear with the residual add and the RMSNorm, pushing each
//     rank's rows into its peers' memory (all_reduce_add_rms_norm; LOWBIT_TP_FUSED_NORM=0 turns it off).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lowbit/core/tensor.h"

namespace lowbit {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // "threads" or "nccl"
  virtual std::string backend() const = 0;
  // What all_reduce_sum runs on, for logs and `lowbit info` (e.g. "nccl" or "one-shot peer <= 512 KiB, nccl above").
  virtual std::string all_reduce_name() const { return backend(); }
  // Whether the collectives may run inside CUDA graph capture.
  virtual bool capturable() const = 0;

  // In place: t = sum over ranks of t (f32, f16 or bf16; contiguous).
  virtual void all_reduce_sum(Tensor& t) = 0;
  // out (contiguous, world_size * in.numel() elements of in's dtype) = the ranks' `in`, rank 0 first.
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // t on every rank = t of rank `root`.
  virtual void broadcast(Tensor& t, int root) = 0;
  // What follows a row-parallel linear, in one kernel where the group has one: residual += sum over ranks of
  // `partial`, then `out` = rms_norm(residual) * weight (ops::add_rms_norm), or, when `out` is undefined, the per-token
  // codes `q` (s8 / e4m3) and `scales` of that output (ops::rms_norm_quantize). Returns false when this group does not
  // fuse these shapes (the default): the caller then runs all_reduce_sum(partial) and the op itself
  // (Model::reduce_add_rms_norm in model/forward.cpp does both). The answer depends only on the group and the
  // tensors' shapes and dtypes, so every rank takes the same path. `partial` is left summed or unchanged.
  virtual bool all_reduce_add_rms_norm(const Tensor& partial, Tensor& residual, const Tensor& weight, float eps,
                                       Tensor& out, Tensor& q, Tensor& scales) {
    (void)partial, (void)residual, (void)weight, (void)eps, (void)out, (void)q, (void)scales;
    return false;
  }
  // Marks the group failed (another rank raised): waiting and later collectives raise instead of
  // blocking. Safe to call from any thread.
  virtual void abort(const std::string& why) = 0;
};

// `world` ranks over threads of this process (world >= 1).
std::vector<std::shared_ptr<Communicator>> make_thread_communicators(int world);

// One NCCL rank per CUDA device of `devices` (distinct ordinals), all in this process.
// Throws NotSupported naming the reason when this build has no NCCL.
// oneshot_max_bytes: all-reduces of at most this many bytes take the one-shot peer-memory kernel when the GPUs
// have peer access (2..8 ranks); 0 = NCCL only; -1 = the default (kOneShotDefaultBytes), which the environment
// overrides: LOWBIT_TP_ONESHOT=0 turns the one-shot path off, LOWBIT_TP_ONESHOT_MAX_BYTES=n sets the bound.
// Without peer access the group is NCCL only and says so once on stderr.
std::vector<std::shared_ptr<Communicator>> make_nccl_communicators(const std::vector<int>& devices,
                                                                   int64_t oneshot_max_bytes = -1);
// The default bound of the one-shot all-reduce (measured on 2x H200: docs/benchmarks_gpu.md, issue 20).
constexpr int64_t kOneShotDefaultBytes = 512 << 10;
// Its largest accepted bound (the staging each rank allocates per half).
constexpr int64_t kOneShotCapacityBytes = 4 << 20;
// Whether make_nccl_communicators can work in this build; `why` says what is missing when not.
bool nccl_available(std::string* why = nullptr);

}  // namespace lowbit
