// ModelLimits: a model's config.json overrides replace exactly the defaults they set, and bad
// limits are named with the expected and received value.
#include "server/runtime/model_limits.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::server {
namespace {

using ::testing::HasSubstr;

ModelLimits Defaults() {
  ModelLimits limits;
  limits.batching = {.max_batch_sequences = 64,
                     .max_batch_tokens = 8192,
                     .max_queue_delay_us = 0,
                     .max_queue_size = 1024};
  limits.request = {.max_sequence_length = 4096, .max_response_bytes = 1 << 20};
  return limits;
}

TEST(ModelLimitsTest, AConfigWithoutOverridesKeepsTheDefaults) {
  const ModelLimits applied = ApplyModelConfig(Defaults(), model::ModelConfig{});
  EXPECT_EQ(applied.batching.max_batch_sequences, 64);
  EXPECT_EQ(applied.batching.max_batch_tokens, 8192);
  EXPECT_EQ(applied.batching.max_queue_delay_us, 0);
  EXPECT_EQ(applied.batching.max_queue_size, 1024);
  EXPECT_EQ(applied.batching.max_queued_bytes, 256 << 20);
  EXPECT_EQ(applied.request.max_sequence_length, 4096);
  EXPECT_EQ(applied.request.max_response_bytes, 1 << 20);
}

TEST(ModelLimitsTest, EachOverrideReplacesItsDefaultOnly) {
  model::ModelConfig config;
  config.max_sequence_length = 512;
  config.batching.max_batch_tokens = 100;
  config.batching.max_queue_delay_us = 250;
  const ModelLimits applied = ApplyModelConfig(Defaults(), config);
  EXPECT_EQ(applied.request.max_sequence_length, 512);
  EXPECT_EQ(applied.batching.max_batch_tokens, 100);
  EXPECT_EQ(applied.batching.max_queue_delay_us, 250);
  EXPECT_EQ(applied.batching.max_batch_sequences, 64);  // Not set: the default.
  EXPECT_EQ(applied.batching.max_queue_size, 1024);
  EXPECT_EQ(applied.request.max_response_bytes, 1 << 20);  // The server's, never the model's.

  config.batching.max_batch_sequences = 2;
  config.batching.max_queue_size = 7;
  config.batching.max_queued_bytes = 4096;
  const ModelLimits all = ApplyModelConfig(Defaults(), config);
  EXPECT_EQ(all.batching.max_batch_sequences, 2);
  EXPECT_EQ(all.batching.max_queue_size, 7);
  EXPECT_EQ(all.batching.max_queued_bytes, 4096);
}

TEST(ModelLimitsTest, ValidationNamesTheBadField) {
  EXPECT_TRUE(ValidateModelLimits(Defaults()).ok());
  ModelLimits bad = Defaults();
  bad.request.max_sequence_length = 0;
  absl::Status status = ValidateModelLimits(bad);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("max_sequence_length: expected >= 1, got 0"));

  bad = Defaults();
  bad.batching.max_queue_size = -2;
  status = ValidateModelLimits(bad);
  EXPECT_THAT(status.message(), HasSubstr("max_queue_size"));
  EXPECT_THAT(status.message(), HasSubstr("got -2"));

  bad = Defaults();
  bad.request.max_response_bytes = 0;
  EXPECT_THAT(ValidateModelLimits(bad).message(), HasSubstr("max_response_bytes"));
}

}  // namespace
}  // namespace attnserve::server
