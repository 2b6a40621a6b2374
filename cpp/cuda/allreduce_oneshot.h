// One-shot all-reduce over peer memory, for the ranks of one process (dist/peer_communicator.cpp).
//
// Every rank owns a staging buffer (two halves, picked by step parity), a flag array written by its peers and
// per-block step counters, all in its own GPU memory; peers reach them through peer pointers (UVA, peer access
// enabled). Block b of each rank's kernel: copies its chunk of the input into staging, tells block b of every
// peer "step e is staged" (a release store into the peer's flag array), waits for the same word from every peer
// (acquire loads), then sums chunk b of all ranks' staging in rank order into the output. Every rank adds the same
// values in the same order, so all ranks get bit-identical results.
//
// Why no second barrier: block b's step counter e lives in device memory and advances inside the kernel, so CUDA
// graphs replay it correctly. A rank can be at most one step of block b ahead of a peer (step e+1 needs the peer's
// flag for e+1, which the peer writes only after its kernel of step e finished), and steps e and e+1 stage into
// different halves, so a rank never overwrites staging a slow peer still reads. Each block owns a fixed slot of
// each half, so messages of different sizes in a row keep that argument per block.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "lowbit/core/dtype.h"

namespace lowbit::cuda {

constexpr int kOneShotMaxWorld = 8;
constexpr int kOneShotMaxBlocks = 64;

// Everything one rank's kernel needs (device pointers; `staging` and `flags` are indexed by rank).
struct OneShotArgs {
  void* staging[kOneShotMaxWorld] = {};    // per rank: 2 halves of `capacity` bytes
  uint32_t* flags[kOneShotMaxWorld] = {};  // per rank: [kOneShotMaxBlocks][kOneShotMaxWorld], peer q writes column q
  uint32_t* counters = nullptr;         // this rank's [kOneShotMaxBlocks] step counters (start at 0)
  const volatile int* abort = nullptr;  // host-mapped; nonzero stops every wait (the group failed)
  int rank = 0, world = 0;
  int max_blocks = 1;                   // the same on every rank (the smallest SM count, <= kOneShotMaxBlocks)
  int64_t capacity = 0;                 // bytes per half, >= 4096 * max_blocks (a block's slot: capacity / max_blocks)
};

// Bytes of the largest message oneshot_all_reduce accepts with these args.
int64_t oneshot_max_message_bytes(const OneShotArgs& args);
// In place on `stream`: data (n elements of f32/f16/bf16 on this rank's GPU) = sum over ranks. Every rank must call
// it with the same n and dtype. n * element size must be <= oneshot_max_message_bytes(args); n == 0 is a no-op.
void oneshot_all_reduce(const OneShotArgs& args, void* data, int64_t n, ScalarType dtype, cudaStream_t stream);

}  // namespace lowbit::cuda
