// A host f32 tensor of U(lo, hi) values, shared by the C++ tests.
#pragma once
#include <random>

#include "lowbit/core/tensor.h"

namespace lowbit::testing_data {

inline Tensor random_tensor(const Shape& shape, std::mt19937& rng, float lo, float hi) {
  Tensor t = Tensor::empty(shape, ScalarType::f32);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

}  // namespace lowbit::testing_data
