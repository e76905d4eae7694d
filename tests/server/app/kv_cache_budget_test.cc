// The KV-cache budget's default is derived from the memory this process may use: a fake cgroup
// root stands in for /sys/fs/cgroup (v2 limit, v2 "max", v1 limit, v1 "unlimited", none), and
// an explicit --kv-cache-budget-mb wins over all of them.
#include "server/app/kv_cache_budget.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "server/runtime/memory_limit.h"
#include "tests/support/temp_folder.h"

namespace attnserve::testing {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kRam = int64_t{16} << 30;  // The fake machine's physical RAM.

void Write(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

TEST(MemoryLimitTest, CgroupV2LimitIsUsed) {
  TempFolder root;
  Write(root.path() / "memory.max", "2147483648\n");
  const server::MemoryLimit limit = server::AvailableMemory(root.path().string(), kRam);
  EXPECT_EQ(limit.bytes, int64_t{2} << 30);
  EXPECT_EQ(limit.source, "cgroup v2 memory.max");
}

TEST(MemoryLimitTest, CgroupV2MaxMeansPhysicalRam) {
  TempFolder root;
  Write(root.path() / "memory.max", "max\n");
  const server::MemoryLimit limit = server::AvailableMemory(root.path().string(), kRam);
  EXPECT_EQ(limit.bytes, kRam);
  EXPECT_EQ(limit.source, "physical RAM");
}

TEST(MemoryLimitTest, CgroupV1LimitIsUsedAndItsUnlimitedIsNot) {
  TempFolder root;
  Write(root.path() / "memory" / "memory.limit_in_bytes", "1073741824\n");
  server::MemoryLimit limit = server::AvailableMemory(root.path().string(), kRam);
  EXPECT_EQ(limit.bytes, int64_t{1} << 30);
  EXPECT_EQ(limit.source, "cgroup v1 memory.limit_in_bytes");

  Write(root.path() / "memory" / "memory.limit_in_bytes", "9223372036854771712\n");
  limit = server::AvailableMemory(root.path().string(), kRam);
  EXPECT_EQ(limit.bytes, kRam);
  EXPECT_EQ(limit.source, "physical RAM");
}

TEST(MemoryLimitTest, LimitAboveRamOrUnreadableMeansPhysicalRam) {
  TempFolder root;
  Write(root.path() / "memory.max", std::to_string(kRam * 2));
  EXPECT_EQ(server::AvailableMemory(root.path().string(), kRam).bytes, kRam);
  Write(root.path() / "memory.max", "garbage");
  EXPECT_EQ(server::AvailableMemory(root.path().string(), kRam).source, "physical RAM");
}

TEST(MemoryLimitTest, NoCgroupMeansThisMachinesRam) {
  TempFolder root;  // Empty: no cgroup files at all.
  const server::MemoryLimit limit =
      server::AvailableMemory(root.path().string(), server::PhysicalMemoryBytes());
  EXPECT_GT(server::PhysicalMemoryBytes(), 0);
  EXPECT_EQ(limit.bytes, server::PhysicalMemoryBytes());
  EXPECT_EQ(limit.source, "physical RAM");
  // This process: bounded by RAM whatever its cgroup says.
  EXPECT_GT(server::AvailableMemory().bytes, 0);
  EXPECT_LE(server::AvailableMemory().bytes, server::PhysicalMemoryBytes());
}

TEST(KvCacheBudgetTest, AnEighthOfTheContainerLimit) {
  // The deployment's 2 GiB limit gives the 256 MiB the "Memory" worst case of SERVER.md counts.
  const server::KvCacheBudget budget = server::ResolveKvCacheBudget(
      0, {.bytes = int64_t{2} << 30, .source = "cgroup v2 memory.max"});
  EXPECT_EQ(budget.bytes, 256 * kMiB);
  EXPECT_EQ(budget.source, "1/8 of cgroup v2 memory.max (2048 MiB)");
}

TEST(KvCacheBudgetTest, AnEighthOfRamInWholeMibAtLeastOne) {
  EXPECT_EQ(server::ResolveKvCacheBudget(0, {.bytes = kRam, .source = "physical RAM"}).bytes,
            2048 * kMiB);
  // 100 MiB / 8 = 12.5 MiB: rounded down to whole MiB.
  EXPECT_EQ(server::ResolveKvCacheBudget(0, {.bytes = 100 * kMiB, .source = "x"}).bytes, 12 * kMiB);
  EXPECT_EQ(server::ResolveKvCacheBudget(0, {.bytes = 0, .source = "physical RAM"}).bytes, kMiB);
}

TEST(KvCacheBudgetTest, AnExplicitBudgetWins) {
  const server::KvCacheBudget budget =
      server::ResolveKvCacheBudget(64 * kMiB, {.bytes = int64_t{2} << 30, .source = "x"});
  EXPECT_EQ(budget.bytes, 64 * kMiB);
  EXPECT_EQ(budget.source, "--kv-cache-budget-mb");
}

}  // namespace
}  // namespace attnserve::testing
