// KvBlockPool's high-water mark and Prefault: the ids handed out are always a prefix of the
// arena, Prefault writes the pages of never-used blocks only (checked with mincore, which reports
// which pages the kernel has mapped), within its bounds, and leaves the rows of blocks in use
// alone.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/kv_cache/kv_block_pool.h"
#include "gtest/gtest.h"
#include "tests/core/kv_cache/kv_pool_test_support.h"

namespace attnserve::core {
namespace {

constexpr AttentionConfig kSmall{.d_model = 16, .num_heads = 2};
// 2 (K, V) × 4 tokens × 16 floats × 4 bytes.
constexpr int64_t kSmallBlockBytes = 512;
// d_model 512, 16 tokens: 64 KiB blocks, 16 pages each.
constexpr AttentionConfig kWide{.d_model = 512, .num_heads = 8};
constexpr int64_t kWideBlockBytes = int64_t{64} << 10;
// 40 MiB: above glibc's largest mmap threshold (32 MiB), so the arena is always a fresh mapping
// whose pages the kernel maps only when written.
constexpr int64_t kWideBlocks = 640;

using ::attnserve::testing::AppendTokens;

struct PageCount {
  int64_t resident = 0;
  int64_t total = 0;
};

// The pages wholly inside [data, data + bytes), and how many of them the kernel has mapped.
PageCount PagesInside(const void* data, int64_t bytes) {
  const uintptr_t page = sysconf(_SC_PAGESIZE);
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
  if (end <= begin) return {};
  std::vector<unsigned char> vec((end - begin) / page);
  EXPECT_EQ(mincore(reinterpret_cast<void*>(begin), end - begin, vec.data()), 0);
  return {std::count_if(vec.begin(), vec.end(), [](unsigned char v) { return (v & 1) != 0; }),
          static_cast<int64_t>(vec.size())};
}

// The same for blocks [first, last).
PageCount PagesOfBlocks(const KvBlockPool& pool, int64_t first, int64_t last) {
  return PagesInside(pool.key_data(static_cast<int32_t>(first), 0),
                     (last - first) * pool.block_bytes());
}

TEST(KvPrefaultTest, HandedOutIdsAreAlwaysAPrefixBelowTheHighWaterMark) {
  auto pool =
      KvBlockPool::Create(kSmall, {.block_tokens = 4, .budget_bytes = 64 * kSmallBlockBytes});
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::mt19937 rng(7);
  std::vector<KvSequence> seqs(6);
  std::set<int32_t> ever;
  for (int op = 0; op < 2000; ++op) {
    KvSequence& seq = seqs[rng() % seqs.size()];
    if (rng() % 4 == 0) {
      (*pool)->Release(seq);
    } else {
      (void)AppendTokens(**pool, seq, 1 + rng() % 9);
    }
    for (const KvSequence& s : seqs) ever.insert(s.blocks.begin(), s.blocks.end());
    const int64_t high_water = (*pool)->high_water_blocks();
    ASSERT_EQ(static_cast<int64_t>(ever.size()), high_water) << "op " << op;
    if (!ever.empty()) {
      ASSERT_EQ(*ever.rbegin(), high_water - 1) << "op " << op;
    }
    ASSERT_EQ((*pool)->touched_blocks(), high_water);
  }
  EXPECT_GT((*pool)->high_water_blocks(), 32);  // The walk did reach deep into the arena.
}

TEST(KvPrefaultTest, PrefaultStopsAtEachBoundAndThenDoesNothing) {
  auto pool =
      KvBlockPool::Create(kSmall, {.block_tokens = 4, .budget_bytes = 10 * kSmallBlockBytes});
  ASSERT_TRUE(pool.ok()) << pool.status();
  KvBlockPool& p = **pool;
  KvSequence seq;
  ASSERT_TRUE(AppendTokens(p, seq, 9).ok());  // Blocks 0..2.
  EXPECT_EQ(p.high_water_blocks(), 3);
  EXPECT_EQ(p.Prefault(/*until_block=*/8, /*max_blocks=*/2), 2);  // max_blocks: 3, 4.
  EXPECT_EQ(p.touched_blocks(), 5);
  EXPECT_EQ(p.high_water_blocks(), 3);
  EXPECT_EQ(p.Prefault(8, 100), 3);  // until_block: 5, 6, 7.
  EXPECT_EQ(p.Prefault(8, 100), 0);
  EXPECT_EQ(p.Prefault(100, 100), 2);  // total_blocks: 8, 9.
  EXPECT_EQ(p.Prefault(100, 100), 0);
  EXPECT_EQ(p.Prefault(3, 100), 0);  // A bound below the touched blocks is not an error.
  EXPECT_EQ(p.touched_blocks(), 10);
  // Handing the prefaulted blocks out raises the high-water mark, not what was touched.
  ASSERT_TRUE(AppendTokens(p, seq, 8).ok());
  EXPECT_EQ(p.high_water_blocks(), 5);
  EXPECT_EQ(p.touched_blocks(), 10);
}

TEST(KvPrefaultTest, PrefaultMapsThePagesOfTheBlocksItTouchesAndNoOthers) {
  // 4 KiB pages: a huge page would map the blocks around the ones touched.
  auto pool = KvBlockPool::Create(
      kWide, {.budget_bytes = kWideBlocks * kWideBlockBytes, .huge_pages = false});
  ASSERT_TRUE(pool.ok()) << pool.status();
  KvBlockPool& p = **pool;
  ASSERT_EQ(p.block_bytes(), kWideBlockBytes);
  // A fresh arena is unmapped, but for its first page or so: AddressSanitizer fills the first
  // 4 KiB of an allocation.
  ASSERT_EQ(PagesOfBlocks(p, 1, kWideBlocks).resident, 0) << "a fresh arena should be unmapped";

  EXPECT_EQ(p.Prefault(/*until_block=*/40, /*max_blocks=*/32), 32);
  const PageCount first = PagesOfBlocks(p, 0, 32);
  EXPECT_GE(first.total, 32 * kWideBlockBytes / sysconf(_SC_PAGESIZE) - 1);
  EXPECT_EQ(first.resident, first.total);
  EXPECT_EQ(PagesOfBlocks(p, 32, kWideBlocks).resident, 0);

  EXPECT_EQ(p.Prefault(40, 32), 8);
  const PageCount second = PagesOfBlocks(p, 32, 40);
  EXPECT_EQ(second.resident, second.total);
  EXPECT_EQ(PagesOfBlocks(p, 40, kWideBlocks).resident, 0);
}

TEST(KvPrefaultTest, PrefaultAskedToStopTouchesNothingAndLaterGoesOn) {
  auto pool = KvBlockPool::Create(
      kWide, {.budget_bytes = kWideBlocks * kWideBlockBytes, .huge_pages = false});
  ASSERT_TRUE(pool.ok()) << pool.status();
  KvBlockPool& p = **pool;
  ASSERT_EQ(PagesOfBlocks(p, 1, kWideBlocks).resident, 0) << "a fresh arena should be unmapped";
  std::atomic<bool> stop{true};
  EXPECT_EQ(p.Prefault(/*until_block=*/8, /*max_blocks=*/8, &stop), 0);
  EXPECT_EQ(p.touched_blocks(), 0);
  EXPECT_EQ(PagesOfBlocks(p, 1, kWideBlocks).resident, 0);

  stop = false;
  EXPECT_EQ(p.Prefault(8, 8, &stop), 8);
  EXPECT_EQ(p.touched_blocks(), 8);
  const PageCount touched = PagesOfBlocks(p, 0, 8);
  EXPECT_EQ(touched.resident, touched.total);
  EXPECT_EQ(PagesOfBlocks(p, 8, kWideBlocks).resident, 0);
}

TEST(KvPrefaultTest, PrefaultLeavesTheRowsOfBlocksInUseAlone) {
  auto pool =
      KvBlockPool::Create(kSmall, {.block_tokens = 4, .budget_bytes = 16 * kSmallBlockBytes});
  ASSERT_TRUE(pool.ok()) << pool.status();
  KvBlockPool& p = **pool;
  KvSequence seq;
  ASSERT_TRUE(p.Reserve(seq, 10).ok());  // Blocks 0..2, every token of them written below.
  std::vector<float> k(10 * 16), v(10 * 16);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = 1.0f + static_cast<float>(i);
    v[i] = -1.0f - static_cast<float>(i);
  }
  p.Write(seq, 10, k.data(), 16, v.data(), 16);
  p.Commit(seq, 10);
  ASSERT_EQ(p.Prefault(16, 16), 13);
  for (int64_t t = 0; t < 10; ++t) {
    for (int64_t head = 0; head < 2; ++head) {
      for (int64_t c = 0; c < 8; ++c) {
        const int64_t slot = (t % 4) * 8 + c;
        ASSERT_EQ(p.keys(seq.blocks[t / 4], head)[slot], k[t * 16 + head * 8 + c]);
        ASSERT_EQ(p.values(seq.blocks[t / 4], head)[slot], v[t * 16 + head * 8 + c]);
      }
    }
  }
}

// Free blocks give their pages back (the least recently released first); blocks in use, and
// their rows, are left alone; a discarded block handed out again holds what is written to it.
class KvDiscardTest : public ::testing::TestWithParam<bool> {};

TEST_P(KvDiscardTest, DiscardGivesBackThePagesOfFreeBlocksOnly) {
  auto pool = KvBlockPool::Create(
      kWide, {.budget_bytes = kWideBlocks * kWideBlockBytes, .huge_pages = GetParam()});
  ASSERT_TRUE(pool.ok()) << pool.status();
  KvBlockPool& p = **pool;
  KvSequence kept, freed;
  ASSERT_TRUE(AppendTokens(p, kept, 16 * 8).ok());    // Blocks 0..7.
  ASSERT_TRUE(AppendTokens(p, freed, 16 * 24).ok());  // Blocks 8..31.
  std::vector<float> k(512), v(512);  // The kept sequence's rows, written one by one.
  for (int64_t t = 0; t < kept.length; ++t) {
    for (int64_t c = 0; c < 512; ++c) {
      k[c] = static_cast<float>(t) + 0.001f * c;
      v[c] = -k[c];
    }
    KvSequence at = kept;
    at.length = t;
    p.Write(at, 1, k.data(), 512, v.data(), 512);
  }
  // Touch the freed blocks' pages, then free them.
  for (int64_t b = 8; b < 32; ++b) {
    std::memset(const_cast<void*>(p.key_data(static_cast<int32_t>(b), 0)), 1, kWideBlockBytes);
  }
  p.Release(freed);
  EXPECT_EQ(p.resident_blocks(), 32);
  EXPECT_EQ(PagesOfBlocks(p, 8, 32).resident, PagesOfBlocks(p, 8, 32).total);

  EXPECT_EQ(p.DiscardFreeBlocks(10), 10);
  EXPECT_EQ(p.resident_blocks(), 22);
  EXPECT_EQ(p.DiscardFreeBlocks(100), 14);  // Only the touched free ones.
  EXPECT_EQ(p.resident_blocks(), 8);
  EXPECT_EQ(p.DiscardFreeBlocks(100), 0);
  EXPECT_EQ(PagesOfBlocks(p, 8, 32).resident, 0);
  const PageCount in_use = PagesOfBlocks(p, 0, 8);
  EXPECT_EQ(in_use.resident, in_use.total);
  for (int64_t t = 0; t < kept.length; ++t) {
    ASSERT_EQ(p.keys(kept.blocks[t / 16], 0)[(t % 16) * 64 + 3], static_cast<float>(t) + 0.003f);
  }

  // Handed out again, a discarded block counts as resident and holds its new rows.
  KvSequence again;
  ASSERT_TRUE(p.Reserve(again, 16).ok());
  EXPECT_EQ(p.resident_blocks(), 9);
  p.Write(again, 1, k.data(), 512, v.data(), 512);
  EXPECT_EQ(p.keys(again.blocks[0], 0)[3], k[3]);
}

INSTANTIATE_TEST_SUITE_P(PageSizes, KvDiscardTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& param) {
                           return param.param ? "HugePages" : "SmallPages";
                         });

// The system's transparent huge page mode: "always", "madvise" or "never" ("" when unknown).
std::string ThpMode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(in, line);
  const size_t open = line.find('['), close = line.find(']');
  return open == std::string::npos || close == std::string::npos
             ? ""
             : line.substr(open + 1, close - open - 1);
}

// The "THPeligible" field of /proc/self/smaps for the mapping that holds `address`: whether the
// kernel may back it with huge pages. -1 when not found.
int ThpEligible(const void* address) {
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " ", &begin, &end) == 2 &&
        line.find(':') > line.find(' ')) {
      inside = begin <= at && at < end;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return std::atoi(line.c_str() + std::strlen("THPeligible:"));
    }
  }
  return -1;
}

TEST(KvPrefaultTest, AHugePageArenaIsAlignedAsksForHugePagesAndADiscardedBlockNoLonger) {
  auto pool = KvBlockPool::Create(kWide, {.budget_bytes = kWideBlocks * kWideBlockBytes});
  ASSERT_TRUE(pool.ok()) << pool.status();
  KvBlockPool& p = **pool;
  const void* arena = p.key_data(0, 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(arena) % (uintptr_t{2} << 20), 0u);
  const std::string mode = ThpMode();
  if (mode != "always" && mode != "madvise") GTEST_SKIP() << "THP mode \"" << mode << "\"";
  const int eligible = ThpEligible(arena);
  if (eligible < 0) GTEST_SKIP() << "no THPeligible field in /proc/self/smaps (kernel < 5.0)";
  EXPECT_EQ(eligible, 1);

  KvSequence freed;
  ASSERT_TRUE(AppendTokens(p, freed, 16 * 4).ok());  // Blocks 0..3, then free again.
  p.Release(freed);
  ASSERT_EQ(p.DiscardFreeBlocks(1), 1);  // Block 0: released longest ago.
  EXPECT_EQ(ThpEligible(p.key_data(0, 0)), 0);
  EXPECT_EQ(ThpEligible(p.key_data(40, 0)), 1);  // In the next 2 MiB.

  if (mode == "madvise") {
    auto small = KvBlockPool::Create(
        kWide, {.budget_bytes = kWideBlocks * kWideBlockBytes, .huge_pages = false});
    ASSERT_TRUE(small.ok()) << small.status();
    EXPECT_EQ(ThpEligible((*small)->key_data(0, 0)), 0);
  }
}

}  // namespace
}  // namespace attnserve::core
