// Block keys for prefix caching: splitmix64 finalizer over each value, chained through the seed.
#include "lowbit/kv/block_hash.h"

namespace lowbit {

namespace {
uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t hash_combine(uint64_t seed, uint64_t value) {
  // Mixing the seed too keeps the combination order-dependent (a plain xor would be symmetric).
  return mix64(mix64(seed) ^ value);
}

uint64_t hash_string(uint64_t seed, const std::string& text) {
  uint64_t h = hash_combine(seed, text.size());  // the length keeps "ab"+"c" apart from "a"+"bc"
  for (unsigned char c : text) h = hash_combine(h, c);
  return h;
}

uint64_t hash_block(uint64_t parent, const int32_t* tokens, int64_t n) {
  uint64_t h = hash_combine(parent, static_cast<uint64_t>(n));
  for (int64_t i = 0; i < n; ++i) h = hash_combine(h, static_cast<uint32_t>(tokens[i]));
  return h;
}

}  // namespace lowbit
