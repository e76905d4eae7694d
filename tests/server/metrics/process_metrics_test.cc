#include "server/metrics/process_metrics.h"

#include <chrono>

#include "gtest/gtest.h"

namespace attnserve::server::metrics {
namespace {

// A real /proc/<pid>/stat line (proc(5) fields), with a command name holding a space and a ')'.
constexpr char kStat[] =
    "4242 (attn serve) x) S 1 4242 4242 0 -1 4194560 5000 0 0 0 250 50 0 0 20 0 9 0 "
    "1000 123456789 2048 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";

TEST(ProcessMetricsTest, ParsesTheStatLineAfterTheLastParenthesis) {
  absl::StatusOr<ProcessSample> sample = ParseProcStat(kStat, /*ticks_per_second=*/100,
                                                       /*page_bytes=*/4096,
                                                       /*boot_time_seconds=*/1'700'000'000);
  ASSERT_TRUE(sample.ok()) << sample.status();
  EXPECT_DOUBLE_EQ(sample->cpu_seconds, (250 + 50) / 100.0);
  EXPECT_DOUBLE_EQ(sample->virtual_memory_bytes, 123456789);
  EXPECT_DOUBLE_EQ(sample->resident_memory_bytes, 2048.0 * 4096);
  EXPECT_DOUBLE_EQ(sample->start_time_seconds, 1'700'000'000 + 1000 / 100.0);
}

TEST(ProcessMetricsTest, RefusesTextThatIsNotAStatLine) {
  EXPECT_EQ(ParseProcStat("no parenthesis here", 100, 4096, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseProcStat("1 (short) S 1 2 3", 100, 4096, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string garbled = kStat;
  garbled.replace(garbled.find(" 250 "), 5, " x50 ");
  EXPECT_EQ(ParseProcStat(garbled, 100, 4096, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ProcessMetricsTest, ThisProcessLooksLikeThisProcess) {
  absl::StatusOr<ProcessSample> sample = ReadProcessSample();
  ASSERT_TRUE(sample.ok()) << sample.status();
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_GT(sample->resident_memory_bytes, 1 << 20);
  EXPECT_GE(sample->virtual_memory_bytes, sample->resident_memory_bytes);
  EXPECT_GE(sample->cpu_seconds, 0);
  // Started within the last hour (a test binary), not in the future.
  EXPECT_LE(sample->start_time_seconds, now + 1);
  EXPECT_GT(sample->start_time_seconds, now - 3600);
  EXPECT_GE(sample->open_fds, 3);  // stdin, stdout, stderr.
  EXPECT_GE(sample->max_fds, sample->open_fds);
}

}  // namespace
}  // namespace attnserve::server::metrics
