#include "tools/seed_example.h"

#include "tools/numpy_random.h"

namespace attnserve::tools {
namespace {

std::vector<float> Randn(NumpyLegacyRandom& random, size_t count, double scale) {
  std::vector<float> values(count);
  for (float& v : values) v = static_cast<float>(random.Normal() * scale);
  return values;
}

}  // namespace

SeedExample MakeSeedExample() {
  SeedExample example;
  example.tokens = 4;
  example.config = {.d_model = 8, .num_heads = 2, .bias = false};
  const size_t d = 8, dd = d * d;
  NumpyLegacyRandom random(42);
  example.x = Randn(random, example.tokens * d, 1.0);
  const std::vector<float> w_q = Randn(random, dd, 0.1);
  const std::vector<float> w_k = Randn(random, dd, 0.1);
  const std::vector<float> w_v = Randn(random, dd, 0.1);
  const std::vector<float> w_o = Randn(random, dd, 0.1);
  // Sizes match the config by construction, so packing cannot fail.
  example.weights =
      *core::PackWeights(example.config, {.orientation = core::WeightOrientation::kInputMajor,
                                          .w_q = w_q,
                                          .w_k = w_k,
                                          .w_v = w_v,
                                          .w_o = w_o});
  return example;
}

}  // namespace attnserve::tools
