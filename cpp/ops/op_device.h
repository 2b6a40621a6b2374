// Which kernel family an op runs: every operand on the CPU, or every operand on one CUDA device.
// Mixed placements are a TypeError naming both arguments; a CUDA device this build or machine
// cannot use is refused by require_device with its reason.
#pragma once
#include <initializer_list>
#include <utility>

#include "lowbit/core/tensor.h"

namespace lowbit::ops {

using NamedTensor = std::pair<const char*, const Tensor*>;

inline Device op_device(const char* op, std::initializer_list<NamedTensor> args) {
  const NamedTensor* first = nullptr;
  for (const NamedTensor& a : args) {
    if (!a.second->defined()) continue;
    if (!first) {
      first = &a;
      continue;
    }
    LOWBIT_CHECK_TYPE(a.second->device() == first->second->device(), op, ": argument '", a.first, "' is on ",
                      a.second->device().str(), " but argument '", first->first, "' is on ",
                      first->second->device().str(), "; all operands must be on one device");
  }
  const Device d = first ? first->second->device() : Device::cpu();
  require_device(d, op);
  return d;
}

}  // namespace lowbit::ops
