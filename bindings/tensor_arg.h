// Helpers every binding file uses to accept tensors from Python: a lowbit.Tensor, or anything that
// speaks DLPack (torch, numpy, jax) converted zero-copy.
#pragma once
#include <nanobind/nanobind.h>

#include "lowbit/core/tensor.h"

namespace lowbit::bindings {
// Zero-copy import of any object with __dlpack__ (or an unconsumed "dltensor" capsule).
Tensor tensor_from_python(nanobind::handle obj, const char* arg = "tensor");
}  // namespace lowbit::bindings
