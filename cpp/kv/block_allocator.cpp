// Paged KV bookkeeping: a LIFO free list, per-sequence block tables and reference counts so that
// forked sequences share their prefix blocks until one of them appends into a shared, partially
// filled last block (copy-on-write).
#include <algorithm>

#include "lowbit/kv/kv_cache.h"

namespace lowbit {

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

BlockAllocator::BlockAllocator(int64_t num_blocks, int block_size) : num_blocks_(num_blocks), block_size_(block_size) {
  LOWBIT_CHECK(num_blocks > 0 && num_blocks <= INT32_MAX,
               "BlockAllocator: argument 'num_blocks' must be in [1, 2^31), got ", num_blocks);
  LOWBIT_CHECK(block_size > 0, "BlockAllocator: argument 'block_size' must be positive, got ", block_size);
  refs_.assign(static_cast<size_t>(num_blocks), 0);
  free_.reserve(static_cast<size_t>(num_blocks));
  // Reverse order so that blocks are handed out 0, 1, 2, ... from a fresh pool.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

const BlockAllocator::Seq& BlockAllocator::get(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) LOWBIT_FAIL(ErrorKind::kIndex, "BlockAllocator: unknown sequence id ", seq);
  return it->second;
}

BlockAllocator::Seq& BlockAllocator::get(SeqId seq) {
  return const_cast<Seq&>(static_cast<const BlockAllocator*>(this)->get(seq));
}

int BlockAllocator::ref_count(int32_t block) const {
  if (block < 0 || block >= num_blocks_)
    LOWBIT_FAIL(ErrorKind::kIndex, "BlockAllocator: block ", block, " out of range [0, ", num_blocks_, ")");
  return refs_[static_cast<size_t>(block)];
}

int32_t BlockAllocator::take_block() {
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

void BlockAllocator::release_block(int32_t b) {
  int& r = refs_[static_cast<size_t>(b)];
  LOWBIT_CHECK_KIND(ErrorKind::kRuntime, r > 0, "BlockAllocator: double free of block ", b);
  if (--r == 0) free_.push_back(b);
}

SeqId BlockAllocator::create_sequence() {
  const SeqId id = next_id_++;
  seqs_.emplace(id, Seq{});
  return id;
}

SeqId BlockAllocator::fork(SeqId parent) {
  Seq child = get(parent);  // copy of the parent's table
  for (int32_t b : child.blocks) ++refs_[static_cast<size_t>(b)];
  const SeqId id = next_id_++;
  seqs_.emplace(id, std::move(child));
  return id;
}

void BlockAllocator::free_sequence(SeqId seq) {
  const Seq& s = get(seq);
  for (int32_t b : s.blocks) release_block(b);
  seqs_.erase(seq);
}

int64_t BlockAllocator::blocks_needed(SeqId seq, int64_t n) const {
  LOWBIT_CHECK(n >= 0, "BlockAllocator: argument 'n' (tokens to append to sequence ", seq,
               ") must be >= 0, got ", n);
  const Seq& s = get(seq);
  if (n == 0) return 0;
  const int64_t have = static_cast<int64_t>(s.blocks.size());
  int64_t need = std::max<int64_t>(0, ceil_div(s.tokens + n, block_size_) - have);
  // Writing into a partially filled last block that another sequence also references needs a private copy.
  if (s.tokens % block_size_ != 0 && refs_[static_cast<size_t>(s.blocks.back())] > 1) ++need;
  return need;
}

bool BlockAllocator::append_tokens(SeqId seq, int64_t n, std::vector<std::pair<int32_t, int32_t>>* copies) {
  const int64_t need = blocks_needed(seq, n);
  if (need > num_free_blocks()) return false;
  if (n == 0) return true;
  Seq& s = get(seq);
  if (s.tokens % block_size_ != 0 && refs_[static_cast<size_t>(s.blocks.back())] > 1) {
    const int32_t src = s.blocks.back();
    const int32_t dst = take_block();
    release_block(src);
    s.blocks.back() = dst;
    if (copies) copies->emplace_back(src, dst);
  }
  s.tokens += n;
  while (static_cast<int64_t>(s.blocks.size()) < ceil_div(s.tokens, block_size_)) s.blocks.push_back(take_block());
  return true;
}

const std::vector<int32_t>& BlockAllocator::block_table(SeqId seq) const { return get(seq).blocks; }

int64_t BlockAllocator::num_tokens(SeqId seq) const { return get(seq).tokens; }

int64_t BlockAllocator::slot_of(SeqId seq, int64_t token_index) const {
  const Seq& s = get(seq);
  if (token_index < 0 || token_index >= s.tokens)
    LOWBIT_FAIL(ErrorKind::kIndex, "BlockAllocator: token index ", token_index, " out of range for sequence ", seq,
                " holding ", s.tokens, " tokens");
  return static_cast<int64_t>(s.blocks[static_cast<size_t>(token_index / block_size_)]) * block_size_ +
         token_index % block_size_;
}

void BlockAllocator::check_invariants() const {
  std::vector<int> counted(static_cast<size_t>(num_blocks_), 0);
  for (const auto& [id, s] : seqs_) {
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, static_cast<int64_t>(s.blocks.size()) == ceil_div(s.tokens, block_size_),
                      "BlockAllocator invariant: sequence ", id, " holds ", s.blocks.size(), " blocks for ", s.tokens,
                      " tokens");
    for (int32_t b : s.blocks) {
      LOWBIT_CHECK_KIND(ErrorKind::kRuntime, b >= 0 && b < num_blocks_, "BlockAllocator invariant: sequence ", id,
                        " holds out-of-range block ", b);
      ++counted[static_cast<size_t>(b)];
    }
  }
  std::vector<char> in_free(static_cast<size_t>(num_blocks_), 0);
  for (int32_t b : free_) {
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, b >= 0 && b < num_blocks_ && !in_free[static_cast<size_t>(b)],
                      "BlockAllocator invariant: free list holds block ", b, " twice or out of range");
    in_free[static_cast<size_t>(b)] = 1;
  }
  for (int64_t b = 0; b < num_blocks_; ++b) {
    const size_t i = static_cast<size_t>(b);
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, counted[i] == refs_[i], "BlockAllocator invariant: block ", b,
                      " has reference count ", refs_[i], " but ", counted[i], " sequences hold it");
    LOWBIT_CHECK_KIND(ErrorKind::kRuntime, (refs_[i] == 0) == (in_free[i] != 0), "BlockAllocator invariant: block ",
                      b, " with reference count ", refs_[i], (in_free[i] ? " is" : " is not"), " on the free list");
  }
}

}  // namespace lowbit
