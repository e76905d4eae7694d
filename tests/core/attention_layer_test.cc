// AttentionLayer::Create: validation of config and weights, the packed projections it holds, and
// independence from the caller's weight buffers.
#include "core/forward/attention_layer.h"

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/forward/attention_executor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/core/attention_test_support.h"

namespace attnserve::core {
namespace {

using ::testing::HasSubstr;

void ExpectInvalid(const absl::StatusOr<std::shared_ptr<const AttentionLayer>>& layer,
                   const std::string& name) {
  EXPECT_EQ(layer.status().code(), absl::StatusCode::kInvalidArgument) << layer.status();
  EXPECT_THAT(std::string(layer.status().message()), HasSubstr(name));
}

TEST(AttentionLayerTest, InvalidConfigIsRejectedNamingTheField) {
  const AttentionWeights weights = MakeRandomWeights({.d_model = 8, .num_heads = 2}, 1);
  ExpectInvalid(AttentionLayer::Create({.d_model = 0, .num_heads = 1}, {}), "d_model");
  ExpectInvalid(AttentionLayer::Create({.d_model = -8, .num_heads = 2}, weights), "d_model");
  ExpectInvalid(AttentionLayer::Create({.d_model = 8, .num_heads = 3}, weights), "num_heads");
  ExpectInvalid(AttentionLayer::Create({.d_model = 8, .num_heads = 0}, weights), "num_heads");
  ExpectInvalid(
      AttentionLayer::Create(
          {.d_model = 8, .num_heads = 2, .variant = AttentionVariant::kSingleHead}, weights),
      "num_heads");
}

TEST(AttentionLayerTest, MisSizedWeightsAreRejectedNamingTheTensor) {
  const AttentionConfig config{.d_model = 8, .num_heads = 2, .bias = true};
  const AttentionWeights good = MakeRandomWeights(config, 1);
  {
    AttentionWeights w = good;
    w.w_qkv.resize(8 * 8 * 3 - 8);
    ExpectInvalid(AttentionLayer::Create(config, w), "w_qkv");
  }
  {
    AttentionWeights w = good;
    w.b_qkv.clear();
    ExpectInvalid(AttentionLayer::Create(config, w), "b_qkv");
  }
  {
    AttentionWeights w = good;
    w.w_o.push_back(0.5f);
    ExpectInvalid(AttentionLayer::Create(config, w), "w_o");
  }
  {
    AttentionWeights w = good;
    w.b_o.clear();
    ExpectInvalid(AttentionLayer::Create(config, w), "b_o");
  }
  // Weights of a multi-head layer for a single-head config: W_O must not be there.
  const AttentionConfig single{
      .d_model = 8, .num_heads = 1, .variant = AttentionVariant::kSingleHead, .bias = true};
  ExpectInvalid(AttentionLayer::Create(single, good), "w_o");
  // Biasless weights for a config with bias.
  ExpectInvalid(
      AttentionLayer::Create(config, MakeRandomWeights({.d_model = 8, .num_heads = 2}, 1)),
      "b_qkv");
}

TEST(AttentionLayerTest, NonFiniteWeightsAreRejectedNamingTheTensor) {
  const AttentionConfig config{.d_model = 8, .num_heads = 2, .bias = true};
  const AttentionWeights good = MakeRandomWeights(config, 1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  {
    AttentionWeights w = good;
    w.w_qkv[100] = nan;
    ExpectInvalid(AttentionLayer::Create(config, w), "w_qkv[100]");
  }
  {
    AttentionWeights w = good;
    w.b_qkv[23] = inf;
    ExpectInvalid(AttentionLayer::Create(config, w), "b_qkv[23]");
  }
  {
    AttentionWeights w = good;
    w.w_o[0] = -inf;
    ExpectInvalid(AttentionLayer::Create(config, w), "w_o[0]");
  }
  {
    AttentionWeights w = good;
    w.b_o[7] = nan;
    ExpectInvalid(AttentionLayer::Create(config, w), "b_o[7]");
  }
}

TEST(AttentionLayerTest, HoldsPackedProjectionsOfTheRightShapes) {
  const AttentionConfig config{.d_model = 24, .num_heads = 3, .bias = true};
  const auto layer = AttentionLayer::Create(config, MakeRandomWeights(config, 2));
  ASSERT_TRUE(layer.ok()) << layer.status();
  const AttentionLayer& l = **layer;
  EXPECT_EQ(l.config().d_model, 24);
  EXPECT_EQ(l.config().num_heads, 3);
  EXPECT_EQ(l.qkv().rows, 24);
  EXPECT_EQ(l.qkv().cols, 72);
  EXPECT_EQ(l.q().cols, 24);
  EXPECT_EQ(l.kv().cols, 48);
  EXPECT_EQ(l.o().rows, 24);
  EXPECT_EQ(l.o().cols, 24);
  EXPECT_EQ(l.qkv_bias().size(), 72u);
  EXPECT_EQ(l.q_bias().size(), 24u);
  EXPECT_EQ(l.kv_bias().size(), 48u);
  EXPECT_EQ(l.o_bias().size(), 24u);
}

TEST(AttentionLayerTest, SingleHeadWithoutBiasHasNoOutputProjectionOrBiases) {
  const AttentionConfig config{
      .d_model = 16, .num_heads = 1, .variant = AttentionVariant::kSingleHead};
  const auto layer = AttentionLayer::Create(config, MakeRandomWeights(config, 2));
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_EQ((*layer)->o().cols, 0);
  EXPECT_TRUE((*layer)->qkv_bias().empty());
  EXPECT_TRUE((*layer)->q_bias().empty());
  EXPECT_TRUE((*layer)->kv_bias().empty());
  EXPECT_TRUE((*layer)->o_bias().empty());
}

TEST(AttentionLayerTest, KeepsItsOwnCopyOfTheWeights) {
  const AttentionConfig config{.d_model = 16, .num_heads = 4, .bias = true};
  const AttentionWeights reference_weights = MakeRandomWeights(config, 3);
  std::shared_ptr<const AttentionLayer> layer;
  {
    auto temporary = std::make_unique<AttentionWeights>(reference_weights);
    auto created = AttentionLayer::Create(config, *temporary);
    ASSERT_TRUE(created.ok()) << created.status();
    layer = *std::move(created);
    // Overwrite and free the source: the layer must not have borrowed it.
    std::fill(temporary->w_qkv.begin(), temporary->w_qkv.end(), 7.0f);
    std::fill(temporary->b_qkv.begin(), temporary->b_qkv.end(), 7.0f);
    std::fill(temporary->w_o.begin(), temporary->w_o.end(), 7.0f);
    std::fill(temporary->b_o.begin(), temporary->b_o.end(), 7.0f);
  }
  AttentionExecutor executor;
  testing::TestBatch batch = testing::MakeBatch(16, {5, 9}, {}, 4);
  batch.causal = true;
  testing::ExpectMatchesReference(executor, *layer, reference_weights, batch);
}

TEST(AttentionLayerTest, CrossAttentionWeightsShareTheFusedPackingWhenTheyCan) {
  // d_model = 128 is a whole number of oneDNN's 64-column blocks: where oneDNN packs weights in
  // column blocks (brgemm, AVX-512), packed W_Q and W_KV are byte ranges of the packed W_QKV and
  // must not be stored twice. Where it keeps them row-major (gemm, AVX2) their columns are not
  // contiguous in W_QKV's rows, so each keeps its own copy.
  const AttentionConfig config{.d_model = 128, .num_heads = 4, .bias = true};
  const AttentionWeights weights = MakeRandomWeights(config, 5);
  const auto layer = AttentionLayer::Create(config, weights);
  ASSERT_TRUE(layer.ok()) << layer.status();
  const AttentionLayer& l = **layer;
  if (l.qkv().desc.data.format_desc.blocking.inner_nblks > 0) {
    EXPECT_EQ(l.q().storage, l.qkv().storage);
    EXPECT_EQ(l.kv().storage, l.qkv().storage);
    EXPECT_EQ(l.q().data(), l.qkv().data());
    EXPECT_EQ(l.kv().data(), l.qkv().data() + l.q().bytes() / sizeof(float));
    EXPECT_EQ(l.q().bytes() + l.kv().bytes(), l.qkv().bytes());
  } else {
    EXPECT_NE(l.q().storage, l.qkv().storage);
    EXPECT_NE(l.kv().storage, l.qkv().storage);
  }
  // And cross-attention through the shared bytes is still right.
  AttentionExecutor executor;
  testing::TestBatch batch = testing::MakeBatch(128, {7, 30}, {19, 4}, 6);
  testing::ExpectMatchesReference(executor, l, weights, batch);
}

TEST(PackedMatrixTest, ShareIfIdenticalKeepsAPartWhoseBytesDiffer) {
  const std::vector<float> plain(64 * 192, 0.5f);
  auto whole = PackMatrix(plain, 64, 192, 192);
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::vector<float> other(plain);
  other[3] = -1.0f;  // Row 0, column 3: inside the first column block.
  auto part = PackMatrix(other, 64, 64, 192);
  ASSERT_TRUE(part.ok()) << part.status();
  const float* own = part->data();
  const PackedMatrix kept = ShareIfIdentical(*part, *whole, 0);
  EXPECT_EQ(kept.data(), own);
  EXPECT_NE(kept.storage, whole->storage);
  // Past the end of `whole` is never shared either.
  const PackedMatrix beyond = ShareIfIdentical(*part, *whole, whole->bytes() / sizeof(float));
  EXPECT_EQ(beyond.data(), own);
}

}  // namespace
}  // namespace attnserve::core
