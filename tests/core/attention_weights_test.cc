// AttentionWeights: the internal layout PackWeights produces (both orientations), size and
// finiteness validation, and MakeRandomWeights' determinism and distribution.
#include "core/forward/attention_weights.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/forward/attention_layer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/attention_test_support.h"

namespace attnserve::core {
namespace {

using attnserve::testing::UniformValues;
using ::testing::HasSubstr;

// Separate d×d projections with distinct values, plus their transposes.
struct Projections {
  int64_t d;
  std::vector<float> w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o;

  Projections(int64_t d_model, bool bias, bool output_projection) : d(d_model) {
    const size_t dd = static_cast<size_t>(d * d);
    w_q = UniformValues(dd, 1);
    w_k = UniformValues(dd, 2);
    w_v = UniformValues(dd, 3);
    if (output_projection) w_o = UniformValues(dd, 4);
    if (bias) {
      b_q = UniformValues(static_cast<size_t>(d), 5);
      b_k = UniformValues(static_cast<size_t>(d), 6);
      b_v = UniformValues(static_cast<size_t>(d), 7);
      if (output_projection) b_o = UniformValues(static_cast<size_t>(d), 8);
    }
  }

  std::vector<float> Transposed(const std::vector<float>& w) const {
    if (w.empty()) return {};
    std::vector<float> t(w.size());
    for (int64_t r = 0; r < d; ++r) {
      for (int64_t c = 0; c < d; ++c) t[c * d + r] = w[r * d + c];
    }
    return t;
  }

  SeparateProjections View(WeightOrientation orientation) const {
    return {.orientation = orientation,
            .w_q = w_q,
            .w_k = w_k,
            .w_v = w_v,
            .w_o = w_o,
            .b_q = b_q,
            .b_k = b_k,
            .b_v = b_v,
            .b_o = b_o};
  }
};

TEST(PackWeightsTest, InputMajorPlacesQKVColumnBlocks) {
  const AttentionConfig config{.d_model = 6, .num_heads = 2, .bias = true};
  const Projections p(6, true, true);
  const auto packed = PackWeights(config, p.View(WeightOrientation::kInputMajor));
  ASSERT_TRUE(packed.ok()) << packed.status();
  const int64_t d = 6;
  ASSERT_EQ(packed->w_qkv.size(), static_cast<size_t>(3 * d * d));
  for (int64_t r = 0; r < d; ++r) {
    for (int64_t c = 0; c < d; ++c) {
      EXPECT_EQ(packed->w_qkv[r * 3 * d + c], p.w_q[r * d + c]) << r << "," << c;
      EXPECT_EQ(packed->w_qkv[r * 3 * d + d + c], p.w_k[r * d + c]) << r << "," << c;
      EXPECT_EQ(packed->w_qkv[r * 3 * d + 2 * d + c], p.w_v[r * d + c]) << r << "," << c;
    }
  }
  std::vector<float> b_qkv = p.b_q;
  b_qkv.insert(b_qkv.end(), p.b_k.begin(), p.b_k.end());
  b_qkv.insert(b_qkv.end(), p.b_v.begin(), p.b_v.end());
  EXPECT_EQ(packed->b_qkv, b_qkv);
  EXPECT_EQ(packed->w_o, p.w_o);
  EXPECT_EQ(packed->b_o, p.b_o);
  EXPECT_TRUE(packed->ValidateFor(config).ok());
}

TEST(PackWeightsTest, OutputMajorEqualsInputMajorWithTransposedMatrices) {
  for (const AttentionConfig& config :
       {AttentionConfig{.d_model = 8, .num_heads = 2, .bias = true},
        AttentionConfig{.d_model = 8, .num_heads = 4, .bias = false},
        AttentionConfig{.d_model = 5,
        .num_heads = 1,
        .variant = AttentionVariant::kSingleHead,
        .bias = true}}) {
    SCOPED_TRACE(absl::StrCat(config.d_model, " ", std::string(VariantName(config.variant))));
    const Projections p(config.d_model, config.bias, config.HasOutputProjection());
    // PyTorch orientation: W is [d_out, d_in], applied as x Wᵀ — the transpose of X @ W's W.
    Projections torch = p;
    torch.w_q = p.Transposed(p.w_q);
    torch.w_k = p.Transposed(p.w_k);
    torch.w_v = p.Transposed(p.w_v);
    torch.w_o = p.Transposed(p.w_o);
    const auto from_input_major = PackWeights(config, p.View(WeightOrientation::kInputMajor));
    const auto from_output_major = PackWeights(config, torch.View(WeightOrientation::kOutputMajor));
    ASSERT_TRUE(from_input_major.ok()) << from_input_major.status();
    ASSERT_TRUE(from_output_major.ok()) << from_output_major.status();
    EXPECT_EQ(from_output_major->w_qkv, from_input_major->w_qkv);
    EXPECT_EQ(from_output_major->b_qkv, from_input_major->b_qkv);
    EXPECT_EQ(from_output_major->w_o, from_input_major->w_o);
    EXPECT_EQ(from_output_major->b_o, from_input_major->b_o);
    // Not trivially equal: the orientation really matters for non-symmetric matrices.
    const auto misread = PackWeights(config, p.View(WeightOrientation::kOutputMajor));
    ASSERT_TRUE(misread.ok());
    EXPECT_NE(misread->w_qkv, from_input_major->w_qkv);
  }
}

TEST(PackWeightsTest, SingleHeadHasNoOutputProjection) {
  const AttentionConfig config{
      .d_model = 4, .num_heads = 1, .variant = AttentionVariant::kSingleHead, .bias = true};
  const Projections p(4, true, false);
  const auto packed = PackWeights(config, p.View(WeightOrientation::kInputMajor));
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_TRUE(packed->w_o.empty());
  EXPECT_TRUE(packed->b_o.empty());
  EXPECT_EQ(packed->b_qkv.size(), 12u);
  EXPECT_TRUE(packed->ValidateFor(config).ok());
}

struct MisSized {
  std::string tensor;
  // Breaks one tensor of an otherwise valid set.
  void (*mutate)(Projections&);
};

class PackWeightsMisSizedTest : public ::testing::TestWithParam<MisSized> {};

TEST_P(PackWeightsMisSizedTest, RejectedNamingTheTensor) {
  const AttentionConfig config{.d_model = 8, .num_heads = 2, .bias = true};
  Projections p(8, true, true);
  GetParam().mutate(p);
  for (WeightOrientation o : {WeightOrientation::kInputMajor, WeightOrientation::kOutputMajor}) {
    const auto packed = PackWeights(config, p.View(o));
    EXPECT_EQ(packed.status().code(), absl::StatusCode::kInvalidArgument) << packed.status();
    EXPECT_THAT(std::string(packed.status().message()), HasSubstr(GetParam().tensor));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tensors, PackWeightsMisSizedTest,
    ::testing::Values(MisSized{"w_q", [](Projections& p) { p.w_q.pop_back(); }},
                      MisSized{"w_k", [](Projections& p) { p.w_k.push_back(0.f); }},
                      MisSized{"w_v", [](Projections& p) { p.w_v.clear(); }},
                      MisSized{"w_o", [](Projections& p) { p.w_o.resize(8); }},
                      MisSized{"b_q", [](Projections& p) { p.b_q.pop_back(); }},
                      MisSized{"b_k", [](Projections& p) { p.b_k.clear(); }},
                      MisSized{"b_v", [](Projections& p) { p.b_v.resize(64); }},
                      MisSized{"b_o", [](Projections& p) { p.b_o.push_back(1.f); }}),
    [](const ::testing::TestParamInfo<MisSized>& case_info) { return case_info.param.tensor; });

TEST(PackWeightsTest, BiasGivenForABiaslessConfigIsRejected) {
  const AttentionConfig config{.d_model = 8, .num_heads = 2, .bias = false};
  const Projections p(8, /*bias=*/true, true);
  const auto packed = PackWeights(config, p.View(WeightOrientation::kInputMajor));
  EXPECT_EQ(packed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(packed.status().message()), HasSubstr("b_q"));
}

TEST(PackWeightsTest, OutputProjectionGivenForSingleHeadIsRejected) {
  const AttentionConfig config{
      .d_model = 8, .num_heads = 1, .variant = AttentionVariant::kSingleHead};
  const Projections p(8, false, /*output_projection=*/true);
  const auto packed = PackWeights(config, p.View(WeightOrientation::kInputMajor));
  EXPECT_EQ(packed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(packed.status().message()), HasSubstr("w_o"));
}

TEST(PackWeightsTest, NonFiniteWeightsNeverReachALayer) {
  // PackWeights only checks sizes; AttentionLayer::Create checks values. Either way a NaN in
  // W_K must be rejected with InvalidArgument naming the tensor it ended up in.
  const AttentionConfig config{.d_model = 8, .num_heads = 2};
  Projections p(8, false, true);
  p.w_k[3] = std::numeric_limits<float>::quiet_NaN();
  const auto packed = PackWeights(config, p.View(WeightOrientation::kInputMajor));
  if (!packed.ok()) {
    EXPECT_EQ(packed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(packed.status().message()), HasSubstr("w_k"));
    return;
  }
  const auto layer = AttentionLayer::Create(config, *packed);
  EXPECT_EQ(layer.status().code(), absl::StatusCode::kInvalidArgument) << layer.status();
  // w_k[0][3] lands in w_qkv row 0, column d + 3 = 11.
  EXPECT_THAT(std::string(layer.status().message()), HasSubstr("w_qkv[11]"));
}

TEST(ValidateForTest, RandomWeightsAreValid) {
  for (const AttentionConfig& config :
       {AttentionConfig{.d_model = 16, .num_heads = 4, .bias = true},
        AttentionConfig{.d_model = 16, .num_heads = 4},
        AttentionConfig{.d_model = 16, .num_heads = 1, .variant = AttentionVariant::kSingleHead},
        AttentionConfig{.d_model = 16,
        .num_heads = 1,
        .variant = AttentionVariant::kSingleHead,
        .bias = true}}) {
    EXPECT_TRUE(MakeRandomWeights(config, 1).ValidateFor(config).ok());
  }
}

TEST(ValidateForTest, MisSizedTensorsAreNamed) {
  const AttentionConfig config{.d_model = 16, .num_heads = 4, .bias = true};
  const AttentionWeights good = MakeRandomWeights(config, 1);
  struct Case {
    const char* name;
    std::vector<float> AttentionWeights::*member;
  };
  for (const Case& c :
       {Case{"w_qkv", &AttentionWeights::w_qkv}, Case{"b_qkv", &AttentionWeights::b_qkv},
        Case{"w_o", &AttentionWeights::w_o}, Case{"b_o", &AttentionWeights::b_o}}) {
    AttentionWeights w = good;
    (w.*c.member).pop_back();
    const absl::Status status = w.ValidateFor(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.name));
  }
}

TEST(ValidateForTest, NonFiniteValuesAreNamedWithTheirIndex) {
  const AttentionConfig config{.d_model = 16, .num_heads = 4, .bias = true};
  const AttentionWeights good = MakeRandomWeights(config, 1);
  {
    AttentionWeights w = good;
    w.w_qkv[123] = std::numeric_limits<float>::quiet_NaN();
    const absl::Status status = w.ValidateFor(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr("w_qkv[123]"));
  }
  {
    AttentionWeights w = good;
    w.b_o[15] = -std::numeric_limits<float>::infinity();
    const absl::Status status = w.ValidateFor(config);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr("b_o[15]"));
  }
}

TEST(MakeRandomWeightsTest, SameSeedGivesIdenticalWeights) {
  const AttentionConfig config{.d_model = 64, .num_heads = 8, .bias = true};
  const AttentionWeights a = MakeRandomWeights(config, 42);
  const AttentionWeights b = MakeRandomWeights(config, 42);
  EXPECT_EQ(a.w_qkv, b.w_qkv);
  EXPECT_EQ(a.b_qkv, b.b_qkv);
  EXPECT_EQ(a.w_o, b.w_o);
  EXPECT_EQ(a.b_o, b.b_o);
}

TEST(MakeRandomWeightsTest, DifferentSeedsGiveDifferentWeights) {
  const AttentionConfig config{.d_model = 64, .num_heads = 8, .bias = true};
  const AttentionWeights a = MakeRandomWeights(config, 42);
  const AttentionWeights b = MakeRandomWeights(config, 43);
  EXPECT_NE(a.w_qkv, b.w_qkv);
  EXPECT_NE(a.b_qkv, b.b_qkv);
  EXPECT_NE(a.w_o, b.w_o);
  EXPECT_NE(a.b_o, b.b_o);
  // Not just one differing value: essentially every element differs.
  size_t equal = 0;
  for (size_t i = 0; i < a.w_qkv.size(); ++i) equal += a.w_qkv[i] == b.w_qkv[i];
  EXPECT_LT(equal, a.w_qkv.size() / 100);
}

TEST(MakeRandomWeightsTest, SizesMatchTheConfigAndItsParameterCount) {
  for (const AttentionConfig& config :
       {AttentionConfig{.d_model = 32, .num_heads = 4, .bias = true},
        AttentionConfig{.d_model = 32, .num_heads = 4},
        AttentionConfig{.d_model = 32, .num_heads = 1, .variant = AttentionVariant::kSingleHead},
        AttentionConfig{.d_model = 32,
        .num_heads = 1,
        .variant = AttentionVariant::kSingleHead,
        .bias = true}}) {
    const AttentionWeights w = MakeRandomWeights(config, 3);
    const int64_t total =
        static_cast<int64_t>(w.w_qkv.size() + w.b_qkv.size() + w.w_o.size() + w.b_o.size());
    EXPECT_EQ(total, config.ParameterCount());
    EXPECT_EQ(w.w_o.empty(), !config.HasOutputProjection());
    EXPECT_EQ(w.b_qkv.empty(), !config.bias);
  }
}

TEST(MakeRandomWeightsTest, UniformWithVarianceOneOverDModel) {
  const AttentionConfig config{.d_model = 512, .num_heads = 8, .bias = true};
  const AttentionWeights w = MakeRandomWeights(config, 9);
  const double half_width = std::sqrt(3.0 / 512.0);
  double sum = 0, sum_sq = 0;
  for (float v : w.w_qkv) {
    ASSERT_LE(std::abs(v), half_width * (1 + 1e-6));
    sum += v;
    sum_sq += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(w.w_qkv.size());
  EXPECT_NEAR(sum / n, 0.0, 1e-3);
  EXPECT_NEAR(sum_sq / n * 512.0, 1.0, 0.02);  // Variance 1/d within 2%.

  double bias_sq = 0;
  for (float v : w.b_qkv) bias_sq += static_cast<double>(v) * v;
  EXPECT_NEAR(bias_sq / static_cast<double>(w.b_qkv.size()), 0.01, 0.0015);  // Variance 0.01.
}

}  // namespace
}  // namespace attnserve::core
