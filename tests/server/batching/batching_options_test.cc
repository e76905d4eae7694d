// BatchingOptions: the defaults are valid, and each bad field is named with its value.
#include "server/batching/batching_options.h"

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::batching {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(BatchingOptionsTest, DefaultsAreValid) {
  BatchingOptions options;
  EXPECT_TRUE(ValidateBatchingOptions(options).ok());
  EXPECT_EQ(options.max_batch_sequences, 64);
  EXPECT_EQ(options.max_batch_tokens, 8192);
  EXPECT_EQ(options.max_queue_delay_us, 0);
  EXPECT_EQ(options.max_queue_size, 1024);
  EXPECT_EQ(options.max_queued_bytes, 256 << 20);
}

TEST(BatchingOptionsTest, SmallestValidValuesPass) {
  BatchingOptions options{.max_batch_sequences = 1,
                          .max_batch_tokens = 1,
                          .max_queue_delay_us = 0,
                          .max_queue_size = 1,
                          .max_queued_bytes = 0};
  EXPECT_TRUE(ValidateBatchingOptions(options).ok());
}

struct BadField {
  std::string field;
  std::function<void(BatchingOptions&)> spoil;
  std::string expected;  // The expectation and received value, as the message prints them.
};

TEST(BatchingOptionsTest, EachBadFieldIsNamedWithExpectedAndReceivedValue) {
  const BadField cases[] = {
      {"max_batch_sequences", [](BatchingOptions& o) { o.max_batch_sequences = 0; },
       "expected >= 1, got 0"},
      {"max_batch_tokens", [](BatchingOptions& o) { o.max_batch_tokens = -5; },
       "expected >= 1, got -5"},
      {"max_queue_delay_us", [](BatchingOptions& o) { o.max_queue_delay_us = -1; },
       "expected >= 0, got -1"},
      {"max_queue_size", [](BatchingOptions& o) { o.max_queue_size = 0; }, "expected >= 1, got 0"},
      {"max_queued_bytes", [](BatchingOptions& o) { o.max_queued_bytes = -1; },
       "expected >= 0, got -1"},
  };
  for (const BadField& bad : cases) {
    SCOPED_TRACE(bad.field);
    BatchingOptions options;
    bad.spoil(options);
    absl::Status status = ValidateBatchingOptions(options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), AllOf(HasSubstr(bad.field), HasSubstr(bad.expected)));
  }
}

}  // namespace
}  // namespace attnserve::batching
