// Chained content hashes of KV blocks, the keys of the prefix cache (see block_allocator.h).
//
// A full block's key is hash(parent key, its token ids): the chain from the root makes the key stand
// for every token before the block and for the block's position, which together with the root (the
// model, its recipe and the K/V formats: everything else that changes the KV) fixes its K/V content.
// 64-bit keys: the allocator also compares a hit's tokens and parent key, so a collision is a miss.
#pragma once
#include <cstdint>
#include <string>

namespace lowbit {

// Mixes `value` into `seed` (order matters: combine(combine(s, a), b) != combine(combine(s, b), a)).
uint64_t hash_combine(uint64_t seed, uint64_t value);
uint64_t hash_string(uint64_t seed, const std::string& text);
// Key of a full block of `n` tokens whose predecessor has key `parent` (the root for the first block).
uint64_t hash_block(uint64_t parent, const int32_t* tokens, int64_t n);

}  // namespace lowbit
