// QuantizedWeight shards (quant/shard.h): every format's row and column slices dequantize to exactly
// the matching slice of the whole weight; a cut through a quantization group is refused by name.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "lowbit/quant/shard.h"
#include "random_tensor.h"

namespace lowbit {
namespace {

using testing_data::random_tensor;

// Dequantized shard == the matching slice of the dequantized whole, for every format.
TEST(WeightShards, RowAndColumnSlicesDequantizeToTheSameValues) {
  std::mt19937 rng(3);
  const Tensor w = random_tensor({48, 256}, rng, -1.f, 1.f);
  struct Case {
    WeightFormat f;
    int group;
    bool symmetric;
  };
  for (const Case c : {Case{WeightFormat::w4, 64, false}, Case{WeightFormat::w4, 32, true},
                       Case{WeightFormat::w8, 0, false}, Case{WeightFormat::w8, 32, false},
                       Case{WeightFormat::qoq, 128, false}, Case{WeightFormat::liquid, 64, false},
                       Case{WeightFormat::e4m3, 0, false}, Case{WeightFormat::f16, 0, false}}) {
    const QuantizedWeight q = quantize_weight(w, c.f, c.group, c.symmetric);
    const Tensor full = dequantize_weight(q);
    const QuantizedWeight rows = slice_weight_rows(q, 16, 40, "w");
    validate_quantized_weight(rows, "test");
    const Tensor dr = dequantize_weight(rows);
    ASSERT_EQ(dr.shape(), (Shape{24, 256}));
    for (int64_t i = 0; i < 24; ++i)
      ASSERT_EQ(0, std::memcmp(dr.data<float>() + i * 256, full.data<float>() + (16 + i) * 256, 256 * 4))
          << name_of(c.f) << " row " << i;
    const QuantizedWeight cols = slice_weight_cols(q, 128, 256, "w");
    validate_quantized_weight(cols, "test");
    const Tensor dc = dequantize_weight(cols);
    ASSERT_EQ(dc.shape(), (Shape{48, 128}));
    for (int64_t i = 0; i < 48; ++i)
      ASSERT_EQ(0, std::memcmp(dc.data<float>() + i * 128, full.data<float>() + i * 256 + 128, 128 * 4))
          << name_of(c.f) << " row " << i;
  }
  // A cut inside a group names the weight and the group.
  const QuantizedWeight g128 = quantize_weight(w, WeightFormat::w4, 128);
  try {
    slice_weight_cols(g128, 64, 192, "model.layers.0.mlp.down_proj.weight");
    FAIL() << "a cut through a group must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("down_proj"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("multiple of 128"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lowbit
