// config.json parsing: every key, defaults, and one clear error per kind of mistake.
#include "core/model/model_config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::model {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ModelConfigTest, ParsesEveryKey) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(R"({
    "d_model": 768, "num_heads": 12, "variant": "multi_head", "bias": true, "dtype": "fp32",
    "max_sequence_length": 2048,
    "batching": {"max_batch_sequences": 32, "max_batch_tokens": 4096,
                 "max_queue_delay_us": 0, "max_queue_size": 100, "max_queued_bytes": 0}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attention.d_model, 768);
  EXPECT_EQ(c->attention.num_heads, 12);
  EXPECT_EQ(c->attention.variant, core::AttentionVariant::kMultiHead);
  EXPECT_TRUE(c->attention.bias);
  EXPECT_EQ(c->max_sequence_length, 2048);
  EXPECT_EQ(c->batching.max_batch_sequences, 32);
  EXPECT_EQ(c->batching.max_batch_tokens, 4096);
  EXPECT_EQ(c->batching.max_queue_delay_us, 0);
  EXPECT_EQ(c->batching.max_queue_size, 100);
  EXPECT_EQ(c->batching.max_queued_bytes, 0);
}

TEST(ModelConfigTest, OptionalKeysHaveDocumentedDefaults) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(R"({"d_model": 64, "num_heads": 4})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attention.variant, core::AttentionVariant::kMultiHead);
  EXPECT_FALSE(c->attention.bias);
  EXPECT_EQ(c->attention.compute_type, core::ComputeType::kFloat32);
  EXPECT_FALSE(c->max_sequence_length.has_value());
  EXPECT_EQ(c->batching, BatchingOverrides{});
}

TEST(ModelConfigTest, KvCacheDtypeIsUnsetUnlessGivenAndRoundTrips) {
  absl::StatusOr<ModelConfig> plain = ParseModelConfig(R"({"d_model": 64, "num_heads": 4})");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->kv_cache_dtype.has_value());
  EXPECT_EQ(KvCacheStorageName(*plain), "fp32");
  for (const auto& [text, dtype] :
       {std::pair{"auto", KvCacheDtype::kAuto}, std::pair{"int8", KvCacheDtype::kInt8}}) {
    absl::StatusOr<ModelConfig> c = ParseModelConfig(
        std::string(R"({"d_model": 64, "num_heads": 4, "kv_cache_dtype": ")") + text + "\"}");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->kv_cache_dtype, dtype);
    absl::StatusOr<ModelConfig> again = ParseModelConfig(ModelConfigToJson(*c));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->kv_cache_dtype, dtype);
  }
  ModelConfig bf16_int8;
  bf16_int8.attention.compute_type = core::ComputeType::kBFloat16;
  EXPECT_EQ(KvCacheStorageName(bf16_int8), "bf16");
  bf16_int8.kv_cache_dtype = KvCacheDtype::kInt8;
  EXPECT_EQ(KvCacheStorageName(bf16_int8), "int8");
}

TEST(ModelConfigTest, SingleHeadVariant) {
  absl::StatusOr<ModelConfig> c =
      ParseModelConfig(R"({"d_model": 64, "num_heads": 1, "variant": "single_head"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->attention.variant, core::AttentionVariant::kSingleHead);
  EXPECT_EQ(c->attention.ParameterCount(), 3 * 64 * 64);
}

TEST(ModelConfigTest, JsonRoundTrip) {
  ModelConfig config;
  config.attention = {
      .d_model = 96, .num_heads = 3, .variant = core::AttentionVariant::kMultiHead, .bias = true};
  config.max_sequence_length = 512;
  config.batching.max_queue_delay_us = 250;
  config.batching.max_batch_tokens = 1000;
  config.batching.max_queued_bytes = 1 << 20;
  absl::StatusOr<ModelConfig> back = ParseModelConfig(ModelConfigToJson(config));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->attention.d_model, 96);
  EXPECT_EQ(back->attention.num_heads, 3);
  EXPECT_TRUE(back->attention.bias);
  EXPECT_EQ(back->max_sequence_length, 512);
  EXPECT_EQ(back->batching, config.batching);
  EXPECT_THAT(ModelConfigToJson(config), Not(HasSubstr("max_batch_sequences")));
}

TEST(ModelConfigTest, WeightsSha256IsOptionalAndReadInEitherCase) {
  const std::string digest = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  absl::StatusOr<ModelConfig> c =
      ParseModelConfig(R"({"d_model": 64, "num_heads": 4, "weights_sha256": ")" + digest + "\"}");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->weights_sha256, digest);
  // Capitals (as some tools print digests) are the same digest, kept in sha256sum's spelling.
  c = ParseModelConfig(
      R"({"d_model": 64, "num_heads": 4, "weights_sha256": "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->weights_sha256, digest);

  ModelConfig config = *c;
  absl::StatusOr<ModelConfig> back = ParseModelConfig(ModelConfigToJson(config));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->weights_sha256, digest);
  EXPECT_THAT(ModelConfigToJson(config), HasSubstr("\"weights_sha256\": \"" + digest + "\""));
  config.weights_sha256.reset();
  EXPECT_THAT(ModelConfigToJson(config), Not(HasSubstr("weights_sha256")));
}

struct BadConfig {
  const char* name;
  const char* json;
  std::vector<std::string> fragments;  // Every one must appear in the message.
};

class BadConfigTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(BadConfigTest, IsRejectedWithAMessageNamingTheProblem) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(GetParam().json);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& fragment : GetParam().fragments) {
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(fragment));
  }
}

const BadConfig kBadConfigs[] = {
    {"NotJson", R"({"d_model": 64,)", {"not valid JSON"}},
    {"Empty", "", {"not valid JSON"}},
    {"NotAnObject", "[64, 4]", {"must be an object", "[64,4]"}},
    {"MissingDModel", R"({"num_heads": 4})", {"missing required key \"d_model\""}},
    {"MissingHeads", R"({"d_model": 64})", {"missing required key \"num_heads\""}},
    {"UnknownKey",
     R"({"d_model": 64, "num_heads": 4, "heads": 4})",
     {"unknown key \"heads\"", "expected d_model, num_heads", "kv_cache_dtype or weights_sha256"}},
    {"KvCacheDtypeUnknown",
     R"({"d_model": 64, "num_heads": 4, "kv_cache_dtype": "fp8"})",
     {"\"kv_cache_dtype\" must be \"auto\" or \"int8\"", "got \"fp8\""}},
    {"KvCacheDtypeNotAString",
     R"({"d_model": 64, "num_heads": 4, "kv_cache_dtype": 8})",
     {"\"kv_cache_dtype\" must be", "got 8"}},
    {"UnknownBatchingKey",
     R"({"d_model": 64, "num_heads": 4, "batching": {"max_delay": 5}})",
     {"unknown key \"batching.max_delay\"", "max_queue_delay_us"}},
    {"DModelString",
     R"({"d_model": "64", "num_heads": 4})",
     {"\"d_model\" must be an integer >= 1", "got \"64\""}},
    {"DModelFloat", R"({"d_model": 64.5, "num_heads": 4})", {"\"d_model\"", "got 64.5"}},
    {"DModelZero", R"({"d_model": 0, "num_heads": 4})", {"\"d_model\" must be", "got 0"}},
    // nlohmann reports a number out of double's range as out_of_range, not parse_error.
    {"NumberOutOfRange",
     R"({"d_model": 1e400, "num_heads": 4})",
     {"not valid JSON", "number overflow parsing '1e400'"}},
    {"DModelHuge",
     R"({"d_model": 18446744073709551615, "num_heads": 4})",
     {"\"d_model\"", "18446744073709551615"}},
    {"HeadsNegative", R"({"d_model": 64, "num_heads": -2})", {"\"num_heads\"", "got -2"}},
    {"HeadsDoNotDivide", R"({"d_model": 64, "num_heads": 5})", {"num_heads", "5"}},
    {"SingleHeadWithHeads",
     R"({"d_model": 64, "num_heads": 4, "variant": "single_head"})",
     {"num_heads"}},
    {"BadVariant",
     R"({"d_model": 64, "num_heads": 4, "variant": "multihead"})",
     {"\"variant\" must be \"multi_head\" or \"single_head\"", "got \"multihead\""}},
    {"BiasString",
     R"({"d_model": 64, "num_heads": 4, "bias": "yes"})",
     {"\"bias\" must be true or false", "got \"yes\""}},
    {"DtypeF16",
     R"({"d_model": 64, "num_heads": 4, "dtype": "f16"})",
     {"\"dtype\" must be \"fp32\"", "got \"f16\""}},
    {"MaxSequenceLengthZero",
     R"({"d_model": 64, "num_heads": 4, "max_sequence_length": 0})",
     {"\"max_sequence_length\"", "got 0"}},
    {"BatchingNotObject",
     R"({"d_model": 64, "num_heads": 4, "batching": 8})",
     {"\"batching\" must be an object", "got 8"}},
    {"QueueSizeZero",
     R"({"d_model": 64, "num_heads": 4, "batching": {"max_queue_size": 0}})",
     {"\"batching.max_queue_size\" must be an integer >= 1", "got 0"}},
    {"Sha256TooShort",
     R"({"d_model": 64, "num_heads": 4, "weights_sha256": "ba7816bf"})",
     {"\"weights_sha256\" must be 64 hex digits (the SHA-256 of weights.safetensors, as "
      "sha256sum prints it)",
      "got \"ba7816bf\""}},
    {"Sha256NotHex",
     R"({"d_model": 64, "num_heads": 4, "weights_sha256": "zz7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"})",
     {"\"weights_sha256\" must be 64 hex digits"}},
    {"Sha256TooLong",
     R"({"d_model": 64, "num_heads": 4, "weights_sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad0"})",
     {"\"weights_sha256\" must be 64 hex digits"}},
    {"Sha256Prefixed",
     R"({"d_model": 64, "num_heads": 4, "weights_sha256": "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"})",
     {"\"weights_sha256\" must be 64 hex digits"}},
    {"Sha256NotAString",
     R"({"d_model": 64, "num_heads": 4, "weights_sha256": 12345})",
     {"\"weights_sha256\" must be 64 hex digits", "got 12345"}},
    {"Sha256Null",
     R"({"d_model": 64, "num_heads": 4, "weights_sha256": null})",
     {"\"weights_sha256\" must be 64 hex digits", "got null"}},
    {"DelayNegative",
     R"({"d_model": 64, "num_heads": 4, "batching": {"max_queue_delay_us": -1}})",
     {"\"batching.max_queue_delay_us\" must be an integer >= 0", "got -1"}},
    {"QueuedBytesNegative",
     R"({"d_model": 64, "num_heads": 4, "batching": {"max_queued_bytes": -1}})",
     {"\"batching.max_queued_bytes\" must be an integer >= 0", "got -1"}},
};

INSTANTIATE_TEST_SUITE_P(All, BadConfigTest, ::testing::ValuesIn(kBadConfigs),
                         [](const auto& p) { return std::string(p.param.name); });

// Deep nesting is refused before parsing (dump() of a 500,000-level value overflowed the stack).
TEST(ModelConfigTest, DeepNestingIsRefusedBeforeParsing) {
  constexpr size_t kDepth = 500'000;
  const std::string nested = std::string(kDepth, '[') + std::string(kDepth, ']');
  for (const std::string& text :
       {nested, R"({"num_heads": 4, "d_model": )" + nested + "}",
        R"({"d_model": 64, "num_heads": 4, "batching": {"max_queue_size": )" + nested + "}}"}) {
    absl::StatusOr<ModelConfig> c = ParseModelConfig(text);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.status().message()), HasSubstr("nests deeper than 64 levels"));
  }
}

TEST(ModelConfigTest, DuplicateKeysAreRefused) {
  absl::StatusOr<ModelConfig> c =
      ParseModelConfig(R"({"d_model": 64, "num_heads": 4, "d_model": 8})");
  EXPECT_THAT(c.status().message(), HasSubstr("duplicate key \"d_model\""));
  c = ParseModelConfig(
      R"({"d_model": 64, "num_heads": 4, "batching": {"max_queue_size": 1, "max_queue_size": 2}})");
  EXPECT_THAT(c.status().message(),
              HasSubstr("duplicate key \"max_queue_size\" inside \"batching\""));
}

}  // namespace
}  // namespace attnserve::model
