// The reference itself, against values worked out by hand — so that agreement between the core
// and the reference means both follow the formula, not that they share a mistake.
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/reference/reference_attention.h"

namespace attnserve::reference {
namespace {

using core::AttentionConfig;
using core::AttentionVariant;
using core::AttentionWeights;

constexpr double kExact = 1e-12;

// w_qkv [d, 3d] from three d×d input-major matrices.
std::vector<float> Fuse(int64_t d, const std::vector<float>& q, const std::vector<float>& k,
                        const std::vector<float>& v) {
  std::vector<float> w(static_cast<size_t>(3 * d * d));
  for (int64_t r = 0; r < d; ++r) {
    for (int64_t c = 0; c < d; ++c) {
      w[r * 3 * d + c] = q[r * d + c];
      w[r * 3 * d + d + c] = k[r * d + c];
      w[r * 3 * d + 2 * d + c] = v[r * d + c];
    }
  }
  return w;
}

// AttentionWeights has no member initialisers, so build it field by field.
AttentionWeights Weights(std::vector<float> w_qkv, std::vector<float> b_qkv = {},
                         std::vector<float> w_o = {}, std::vector<float> b_o = {}) {
  AttentionWeights w;
  w.w_qkv = std::move(w_qkv);
  w.b_qkv = std::move(b_qkv);
  w.w_o = std::move(w_o);
  w.b_o = std::move(b_o);
  return w;
}

// d = 2 weights with W_Q = W_K = 0 and W_V = I: every score is 0, so each head averages the values
// it may see. `output_identity` adds W_O = I (multi-head); otherwise no W_O (single head).
AttentionWeights AveragingWeights(bool output_identity) {
  const std::vector<float> zero(4, 0.0f), identity{1, 0, 0, 1};
  return Weights(Fuse(2, zero, zero, identity), {},
                 output_identity ? identity : std::vector<float>{});
}

core::AttentionInputs SelfInputs(const std::vector<float>& x, const std::vector<int64_t>& offsets) {
  core::AttentionInputs in;
  in.query = {.data = x, .offsets = offsets};
  return in;
}

TEST(ReferenceSanityTest, ZeroScoresAverageTheValues) {
  // W_Q = W_K = 0: every score is 0, so attention is uniform and the output is the mean of V.
  const AttentionConfig config{
      .d_model = 2, .num_heads = 1, .variant = AttentionVariant::kSingleHead};
  const AttentionWeights weights = AveragingWeights(/*output_identity=*/false);
  const std::vector<float> x{1, 2, 3, 4, 5, 9};
  const std::vector<int64_t> offsets{0, 3};
  const auto r = Attention(config, weights, SelfInputs(x, offsets));
  ASSERT_TRUE(r.ok()) << r.status();
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(r->output[i * 2 + 0], 3.0, kExact);
    EXPECT_NEAR(r->output[i * 2 + 1], 5.0, kExact);
    for (int64_t j = 0; j < 3; ++j) EXPECT_NEAR(r->weights[i * 3 + j], 1.0 / 3, kExact);
  }
}

TEST(ReferenceSanityTest, CausalAveragesThePrefix) {
  const AttentionConfig config{
      .d_model = 2, .num_heads = 1, .variant = AttentionVariant::kSingleHead};
  const AttentionWeights weights = AveragingWeights(/*output_identity=*/false);
  const std::vector<float> x{1, 2, 3, 4, 5, 9};
  const std::vector<int64_t> offsets{0, 3};
  core::AttentionInputs in = SelfInputs(x, offsets);
  in.mask.causal = true;
  const auto r = Attention(config, weights, in);
  ASSERT_TRUE(r.ok()) << r.status();
  // Row 0 sees x0; row 1 the mean of x0, x1; row 2 all three.
  const double expected[3][2] = {{1, 2}, {2, 3}, {3, 5}};
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(r->output[i * 2 + 0], expected[i][0], kExact);
    EXPECT_NEAR(r->output[i * 2 + 1], expected[i][1], kExact);
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_NEAR(r->weights[i * 3 + j], j <= i ? 1.0 / (i + 1) : 0.0, kExact);
    }
  }
}

TEST(ReferenceSanityTest, TwoHeadsSoftmaxProjectionsAndBiases) {
  // d = 2, h = 2, d_k = 1. W_Q = W_K = a·I, W_V = I, W_O swaps the two features, b_O = (10, 20).
  // Head 0 sees feature 0 only: score(i, j) = a²·x_i0·x_j0 / √1.
  const double a = 1.5;
  const AttentionConfig config{.d_model = 2, .num_heads = 2, .bias = true};
  const std::vector<float> scaled{static_cast<float>(a), 0, 0, static_cast<float>(a)};
  const std::vector<float> identity{1, 0, 0, 1};
  const AttentionWeights weights = Weights(Fuse(2, scaled, scaled, identity),
                                           std::vector<float>(6, 0.0f), {0, 1, 1, 0}, {10, 20});
  const std::vector<float> x{1, 0, 0, 1};  // Two tokens: e0 and e1.
  const std::vector<int64_t> offsets{0, 2};
  const auto r = Attention(config, weights, SelfInputs(x, offsets));
  ASSERT_TRUE(r.ok()) << r.status();

  const double e = std::exp(a * a);
  // Head 0, token 0: scores (a², 0) → p = (e, 1)/(e+1); values of feature 0: (1, 0).
  // Head 0, token 1: scores (0, 0) → uniform.
  // Head 1 mirrors it on feature 1.
  const double p = e / (e + 1);
  const double head0[2] = {p, 0.5};  // Head 0 output for tokens 0, 1.
  const double head1[2] = {0.5, p};  // Head 1 output for tokens 0, 1.
  for (int64_t i = 0; i < 2; ++i) {
    // concat = (head0, head1); W_O swaps: out = (head1 + 10, head0 + 20).
    EXPECT_NEAR(r->output[i * 2 + 0], head1[i] + 10, kExact) << i;
    EXPECT_NEAR(r->output[i * 2 + 1], head0[i] + 20, kExact) << i;
  }
  // Weights [h, T, S]: head 0 row 0 = (p, 1-p); head 1 row 1 = (1-p, p).
  EXPECT_NEAR(r->weights[0], p, kExact);
  EXPECT_NEAR(r->weights[1], 1 - p, kExact);
  EXPECT_NEAR(r->weights[2], 0.5, kExact);
  EXPECT_NEAR(r->weights[4 + 0], 0.5, kExact);
  EXPECT_NEAR(r->weights[4 + 2], 1 - p, kExact);
  EXPECT_NEAR(r->weights[4 + 3], p, kExact);
}

TEST(ReferenceSanityTest, ScoresAreScaledByTheHeadWidth) {
  // d = 4, one head of width 4: Q = K = x, score(i, j) = x_i·x_j / 2.
  const AttentionConfig config{
      .d_model = 4, .num_heads = 1, .variant = AttentionVariant::kSingleHead};
  std::vector<float> identity(16, 0.0f);
  for (int i = 0; i < 4; ++i) identity[i * 5] = 1;
  const AttentionWeights weights = Weights(Fuse(4, identity, identity, identity));
  const std::vector<float> x{1, 1, 1, 1, 0, 0, 0, 0};
  const std::vector<int64_t> offsets{0, 2};
  const auto r = Attention(config, weights, SelfInputs(x, offsets));
  ASSERT_TRUE(r.ok()) << r.status();
  // Token 0: scores (4/2, 0) = (2, 0).
  EXPECT_NEAR(r->weights[0], std::exp(2.0) / (std::exp(2.0) + 1), kExact);
  EXPECT_NEAR(r->weights[2], 0.5, kExact);
}

TEST(ReferenceSanityTest, CrossAttentionExplicitMaskAndSequenceLayout) {
  // Two sequences with T = (1, 2), S = (3, 1): weights are [h, T, S] blocks of 3 and 2 values.
  const AttentionConfig config{
      .d_model = 1, .num_heads = 1, .variant = AttentionVariant::kSingleHead, .bias = true};
  const AttentionWeights weights = Weights({0, 0, 1}, {0, 0, 0.5f});
  const std::vector<float> query{7, 8, 9};
  const std::vector<int64_t> query_offsets{0, 1, 3};
  const std::vector<float> memory{1, 2, 4, 10};
  const std::vector<int64_t> memory_offsets{0, 3, 4};
  // Sequence 0 blocks key 1; sequence 1 blocks its only key for row 0.
  const std::vector<uint8_t> mask{1, 0, 1, 0, 1};
  core::AttentionInputs in;
  in.query = {.data = query, .offsets = query_offsets};
  in.memory = core::RaggedBatch{.data = memory, .offsets = memory_offsets};
  in.mask.explicit_mask = mask;
  const auto r = Attention(config, weights, in);
  ASSERT_TRUE(r.ok()) << r.status();
  // Scores are all 0 (W_Q = W_K = 0): uniform over the visible keys; V = memory + 0.5.
  ASSERT_EQ(r->weights.size(), 5u);
  EXPECT_NEAR(r->weights[0], 0.5, kExact);
  EXPECT_NEAR(r->weights[1], 0.0, kExact);
  EXPECT_NEAR(r->weights[2], 0.5, kExact);
  EXPECT_NEAR(r->output[0], (1.5 + 4.5) / 2, kExact);
  // Sequence 1, row 0: every key blocked → zero weights and output; row 1 sees key 0.
  EXPECT_EQ(r->weights[3], 0.0);
  EXPECT_EQ(r->output[1], 0.0);
  EXPECT_NEAR(r->weights[4], 1.0, kExact);
  EXPECT_NEAR(r->output[2], 10.5, kExact);
}

TEST(ReferenceSanityTest, HeadMaskZeroesTheHeadSlice) {
  const AttentionConfig config{.d_model = 2, .num_heads = 2};
  const AttentionWeights weights = AveragingWeights(/*output_identity=*/true);
  const std::vector<float> x{1, 2, 3, 4};
  const std::vector<int64_t> offsets{0, 2};
  const bool head_mask[2] = {true, false};
  core::AttentionInputs in = SelfInputs(x, offsets);
  in.head_mask = head_mask;
  const auto r = Attention(config, weights, in);
  ASSERT_TRUE(r.ok()) << r.status();
  // W_O = I: output = concat; head 0 (feature 0) averages 1 and 3, head 1 is disabled.
  EXPECT_NEAR(r->output[0], 2.0, kExact);
  EXPECT_EQ(r->output[1], 0.0);
  EXPECT_NEAR(r->output[2], 2.0, kExact);
  EXPECT_EQ(r->output[3], 0.0);
  for (int j = 4; j < 8; ++j) EXPECT_EQ(r->weights[j], 0.0);
}

TEST(ReferenceSanityTest, RejectsInconsistentInputs) {
  const AttentionConfig config{.d_model = 2, .num_heads = 2};
  const AttentionWeights weights = AveragingWeights(/*output_identity=*/true);
  const std::vector<float> x{1, 2, 3, 4};
  const std::vector<int64_t> offsets{0, 2};
  const std::vector<uint8_t> short_mask(3, 1);
  core::AttentionInputs in = SelfInputs(x, offsets);
  in.mask.explicit_mask = short_mask;
  EXPECT_EQ(Attention(config, weights, in).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int64_t> bad_offsets{0, 3};
  EXPECT_EQ(Attention(config, weights, SelfInputs(x, bad_offsets)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Attention(config, AttentionWeights{}, SelfInputs(x, offsets)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attnserve::reference
