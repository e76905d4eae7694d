// AttentionConfig: parameter counts, derived sizes, validation and the variant names.
#include "core/forward/attention_config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::core {
namespace {

using ::testing::HasSubstr;

TEST(AttentionConfigTest, ParameterCountsOfTheSeedConfigurations) {
  // d = 512, h = 8 multi-head without bias: 4·512² = 1,048,576.
  EXPECT_EQ((AttentionConfig{.d_model = 512, .num_heads = 8}).ParameterCount(), 1'048'576);
  // The native single head: 3·512² = 786,432.
  EXPECT_EQ(
      (AttentionConfig{.d_model = 512, .num_heads = 1, .variant = AttentionVariant::kSingleHead})
          .ParameterCount(),
      786'432);
  // Multi-head with one head still has W_O: 1,048,576.
  EXPECT_EQ((AttentionConfig{.d_model = 512, .num_heads = 1}).ParameterCount(), 1'048'576);
}

TEST(AttentionConfigTest, ParameterCountsWithBias) {
  // 4·d² + 4·d.
  EXPECT_EQ((AttentionConfig{.d_model = 512, .num_heads = 8, .bias = true}).ParameterCount(),
            1'048'576 + 2'048);
  // 3·d² + 3·d.
  EXPECT_EQ(
      (AttentionConfig{
           .d_model = 512, .num_heads = 1, .variant = AttentionVariant::kSingleHead, .bias = true})
          .ParameterCount(),
      786'432 + 1'536);
  EXPECT_EQ((AttentionConfig{.d_model = 768, .num_heads = 12, .bias = true}).ParameterCount(),
            4 * 768 * 768 + 4 * 768);
  EXPECT_EQ((AttentionConfig{.d_model = 8, .num_heads = 2, .bias = true}).ParameterCount(),
            4 * 64 + 32);
}

TEST(AttentionConfigTest, ParameterCountDoesNotDependOnHeads) {
  for (int64_t heads : {1, 2, 4, 8, 16}) {
    EXPECT_EQ((AttentionConfig{.d_model = 256, .num_heads = heads}).ParameterCount(), 4 * 256 * 256)
        << heads;
  }
}

TEST(AttentionConfigTest, DerivedSizes) {
  const AttentionConfig multi{.d_model = 768, .num_heads = 12};
  EXPECT_EQ(multi.HeadDim(), 64);
  EXPECT_TRUE(multi.HasOutputProjection());
  const AttentionConfig single{
      .d_model = 64, .num_heads = 1, .variant = AttentionVariant::kSingleHead};
  EXPECT_EQ(single.HeadDim(), 64);
  EXPECT_FALSE(single.HasOutputProjection());
}

TEST(AttentionConfigTest, DefaultAndTypicalConfigsAreValid) {
  EXPECT_TRUE(AttentionConfig{}.Validate().ok());
  EXPECT_TRUE((AttentionConfig{.d_model = 1, .num_heads = 1}).Validate().ok());
  EXPECT_TRUE((AttentionConfig{.d_model = 8, .num_heads = 8}).Validate().ok());
  EXPECT_TRUE((AttentionConfig{.d_model = 768, .num_heads = 12, .bias = true}).Validate().ok());
  EXPECT_TRUE(
      (AttentionConfig{.d_model = 512, .num_heads = 1, .variant = AttentionVariant::kSingleHead})
          .Validate()
          .ok());
}

struct InvalidCase {
  std::string name;
  AttentionConfig config;
  std::string field;  // Must appear in the error message.
};

class InvalidConfigTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidConfigTest, RejectedNamingTheField) {
  const absl::Status status = GetParam().config.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(GetParam().field));
}

INSTANTIATE_TEST_SUITE_P(
    Configs, InvalidConfigTest,
    ::testing::Values(
        InvalidCase{"d_model_zero", {.d_model = 0, .num_heads = 1}, "d_model"},
        InvalidCase{"d_model_negative", {.d_model = -8, .num_heads = 2}, "d_model"},
        InvalidCase{"d_model_huge", {.d_model = int64_t{1} << 40, .num_heads = 1}, "d_model"},
        InvalidCase{"heads_zero", {.d_model = 8, .num_heads = 0}, "num_heads"},
        InvalidCase{"heads_negative", {.d_model = 8, .num_heads = -2}, "num_heads"},
        InvalidCase{"heads_not_dividing", {.d_model = 10, .num_heads = 3}, "num_heads"},
        InvalidCase{"heads_more_than_d_model", {.d_model = 8, .num_heads = 16}, "num_heads"},
        InvalidCase{"single_head_with_two_heads",
                    {.d_model = 8, .num_heads = 2, .variant = AttentionVariant::kSingleHead},
                    "num_heads"},
        InvalidCase{"single_head_with_zero_heads",
                    {.d_model = 8, .num_heads = 0, .variant = AttentionVariant::kSingleHead},
                    "num_heads"},
        InvalidCase{"unknown_variant",
                    {.d_model = 8, .num_heads = 1, .variant = static_cast<AttentionVariant>(7)},
                    "variant"}),
    [](const ::testing::TestParamInfo<InvalidCase>& case_info) { return case_info.param.name; });

TEST(AttentionConfigTest, ErrorMessagesCarryTheReceivedValue) {
  const absl::Status status = AttentionConfig{.d_model = 10, .num_heads = 3}.Validate();
  EXPECT_THAT(std::string(status.message()), HasSubstr("3"));
  const absl::Status negative = AttentionConfig{.d_model = -8, .num_heads = 2}.Validate();
  EXPECT_THAT(std::string(negative.message()), HasSubstr("-8"));
}

TEST(AttentionConfigTest, VariantNamesRoundTrip) {
  for (AttentionVariant v : {AttentionVariant::kMultiHead, AttentionVariant::kSingleHead}) {
    const auto parsed = ParseVariant(VariantName(v));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, v);
  }
  EXPECT_EQ(VariantName(AttentionVariant::kMultiHead), "multi_head");
  EXPECT_EQ(VariantName(AttentionVariant::kSingleHead), "single_head");
  EXPECT_EQ(ComputeTypeName(ComputeType::kFloat32), "fp32");
}

TEST(AttentionConfigTest, UnknownVariantNameIsRejected) {
  for (const char* name : {"", "multihead", "Multi_Head", "single_head "}) {
    const auto parsed = ParseVariant(name);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("variant")) << name;
  }
}

}  // namespace
}  // namespace attnserve::core
