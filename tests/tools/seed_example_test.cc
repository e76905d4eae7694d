// The demo's data must be the seed article's data: NumPy's legacy stream, bit for bit, and the
// core's answer on it must match the independent reference.
#include "tools/seed_example.h"

#include <cmath>
#include <vector>

#include "core/forward/attention_executor.h"
#include "core/forward/attention_layer.h"
#include "gtest/gtest.h"
#include "tests/reference/reference_attention.h"
#include "tools/numpy_random.h"

namespace attnserve::tools {
namespace {

// Known values of NumPy's legacy stream: np.random.seed(42); np.random.randn(4) and
// np.random.seed(0); np.random.random_sample(2) (NumPy 1.24, any platform).
TEST(NumpyLegacyRandomTest, NormalMatchesNumpySeed42) {
  NumpyLegacyRandom random(42);
  const double expected[] = {0.4967141530112327, -0.13826430117118466, 0.6476885381006925,
                             1.5230298564080254};
  for (double e : expected) EXPECT_DOUBLE_EQ(random.Normal(), e);
}

TEST(NumpyLegacyRandomTest, UniformMatchesNumpySeed0) {
  NumpyLegacyRandom random(0);
  EXPECT_DOUBLE_EQ(random.Uniform(), 0.5488135039273248);
  EXPECT_DOUBLE_EQ(random.Uniform(), 0.7151893663724195);
}

TEST(SeedExampleTest, ShapesAndConfigMatchTheArticle) {
  const SeedExample example = MakeSeedExample();
  EXPECT_EQ(example.tokens, 4);
  EXPECT_EQ(example.config.d_model, 8);
  EXPECT_EQ(example.config.num_heads, 2);
  EXPECT_EQ(example.x.size(), 32u);
  // X is drawn first: its first element is randn's first value for seed 42.
  EXPECT_FLOAT_EQ(example.x[0], 0.4967141530112327f);
  EXPECT_TRUE(example.weights.ValidateFor(example.config).ok());
}

TEST(SeedExampleTest, CoreMatchesReferenceOnTheSeedExample) {
  const SeedExample example = MakeSeedExample();
  auto layer = core::AttentionLayer::Create(example.config, example.weights);
  ASSERT_TRUE(layer.ok()) << layer.status();
  const std::vector<int64_t> offsets{0, example.tokens};
  const core::AttentionInputs in{.query = {.data = example.x, .offsets = offsets}};
  const int64_t h = example.config.num_heads, t = example.tokens;
  std::vector<float> output(example.x.size()), weights(h * t * t);
  core::AttentionExecutor executor;
  ASSERT_TRUE(executor.Forward(**layer, in, {.output = output, .weights = weights}).ok());

  const absl::StatusOr<reference::ReferenceOutputs> result =
      reference::Attention(example.config, example.weights, in);
  ASSERT_TRUE(result.ok()) << result.status();
  const reference::ReferenceOutputs& expected = *result;
  ASSERT_EQ(expected.output.size(), output.size());
  ASSERT_EQ(expected.weights.size(), weights.size());
  for (size_t i = 0; i < output.size(); ++i) EXPECT_NEAR(output[i], expected.output[i], 1e-6);
  for (size_t i = 0; i < weights.size(); ++i) EXPECT_NEAR(weights[i], expected.weights[i], 1e-6);
  // Each head's weights are a distribution over the 4 tokens.
  for (int64_t row = 0; row < h * t; ++row) {
    double sum = 0;
    for (int64_t j = 0; j < t; ++j) sum += weights[row * t + j];
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
}

}  // namespace
}  // namespace attnserve::tools
