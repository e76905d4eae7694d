// MemoryTrimmer: its own named thread while it lives, and a destructor that stops it at once,
// however long the interval (a server shutting down must not wait for the next trim). Whether
// trimming lowers resident memory is measured, not unit-tested:
// tests/benchmarks/run_burst_memory.sh.
#include "server/app/memory_trimmer.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "tests/support/thread_names.h"

namespace attnserve::server {
namespace {

TEST(MemoryTrimmerTest, RunsOnItsOwnThreadAndStopsAtOnceWhateverTheInterval) {
  ASSERT_EQ(testing::CountThreadsNamed("attnserve-trim"), 0);
  auto trimmer = std::make_unique<MemoryTrimmer>(absl::Hours(1));
  EXPECT_EQ(testing::CountThreadsNamed("attnserve-trim"), 1);
  trimmer.reset();  // Would take an hour if the wait were not interrupted (ctest's timeout).
  EXPECT_EQ(testing::CountThreadsNamed("attnserve-trim"), 0);
}

TEST(MemoryTrimmerTest, ShortIntervalsKeepTrimmingUntilStopped) {
  MemoryTrimmer trimmer(absl::Microseconds(1));  // Trims in a tight loop: must stay harmless.
  std::vector<std::unique_ptr<int[]>> churn;
  for (int i = 0; i < 10000; ++i) churn.push_back(std::make_unique<int[]>(1024));
  churn.clear();
  EXPECT_EQ(testing::CountThreadsNamed("attnserve-trim"), 1);
}

}  // namespace
}  // namespace attnserve::server
