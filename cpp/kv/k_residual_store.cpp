// KResidualStore: f16 K rows of partly filled per-channel K blocks (see k_residual_store.h).
#include "lowbit/kv/k_residual_store.h"

namespace lowbit {

uint16_t* KResidualStore::acquire(int32_t block) {
  std::vector<uint16_t>& rows = rows_[block];
  if (rows.empty()) rows.assign(std::size_t(block_elems_), 0);
  return rows.data();
}

const uint16_t* KResidualStore::find(int32_t block) const {
  const auto it = rows_.find(block);
  return it == rows_.end() ? nullptr : it->second.data();
}

void KResidualStore::release(int32_t block) { rows_.erase(block); }

void KResidualStore::release_retired() {
  for (const int32_t b : retired_) rows_.erase(b);
  retired_.clear();
}

void KResidualStore::copy(int32_t src, int32_t dst) {
  if (src == dst) return;
  const auto it = rows_.find(src);
  if (it == rows_.end()) {
    rows_.erase(dst);
    return;
  }
  rows_[dst] = it->second;
}

}  // namespace lowbit
