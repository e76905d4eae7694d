// AlignedBuffer: alignment, growth, and EndWindow's release policy (free only storage of at least
// 1 MiB holding more than twice the window's largest request; steady use never reallocates), and
// ScratchWindow's count of uses per window.
#include "core/util/aligned_buffer.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve::core {
namespace {

constexpr size_t kMiBFloats = (size_t{1} << 20) / sizeof(float);

TEST(AlignedBufferTest, ReserveIsAlignedAndGrowsOnlyWhenAskedForMore) {
  AlignedBuffer buffer;
  EXPECT_EQ(buffer.capacity(), 0u);
  float* first = buffer.Reserve(100);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % AlignedBuffer::kAlignment, 0u);
  EXPECT_GE(buffer.capacity(), 100u);
  EXPECT_EQ(buffer.Reserve(50), first);  // Smaller: the same storage.
  float* grown = buffer.Reserve(10'000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(grown) % AlignedBuffer::kAlignment, 0u);
  EXPECT_GE(buffer.capacity(), 10'000u);
}

TEST(AlignedBufferTest, EndWindowFreesLargeStorageThatTheWindowNeededLessThanHalfOf) {
  AlignedBuffer buffer;
  buffer.Reserve(8 * kMiBFloats);  // A burst: 32 MiB.
  EXPECT_FALSE(buffer.EndWindow()) << "the window that grew it used all of it";
  buffer.Reserve(kMiBFloats);  // A quarter of it since then.
  EXPECT_TRUE(buffer.EndWindow());
  EXPECT_EQ(buffer.capacity(), 0u);
  EXPECT_EQ(buffer.data(), nullptr);
  float* again = buffer.Reserve(kMiBFloats);  // Allocated at the size needed now.
  ASSERT_NE(again, nullptr);
  EXPECT_GE(buffer.capacity(), kMiBFloats);
  EXPECT_LT(buffer.capacity(), 2 * kMiBFloats);
}

TEST(AlignedBufferTest, EndWindowKeepsStorageTheWindowUsedMoreThanHalfOf) {
  AlignedBuffer buffer;
  buffer.Reserve(4 * kMiBFloats);
  for (int window = 0; window < 5; ++window) {
    buffer.Reserve(2 * kMiBFloats + 1);  // Just over half.
    EXPECT_FALSE(buffer.EndWindow()) << "window " << window;
  }
  EXPECT_GE(buffer.capacity(), 4 * kMiBFloats);
}

TEST(AlignedBufferTest, EndWindowFreesUnusedLargeStorageButNeverSmallStorage) {
  AlignedBuffer large, small;
  large.Reserve(2 * kMiBFloats);
  small.Reserve(kMiBFloats / 2);  // 512 KiB: below kMinReleaseBytes.
  EXPECT_FALSE(large.EndWindow());
  EXPECT_FALSE(small.EndWindow());
  // A window without any Reserve(): the large one goes, the small one stays.
  EXPECT_TRUE(large.EndWindow());
  EXPECT_FALSE(small.EndWindow());
  EXPECT_EQ(large.capacity(), 0u);
  EXPECT_GE(small.capacity(), kMiBFloats / 2);
  EXPECT_FALSE(large.EndWindow()) << "nothing left to free";
}

TEST(ScratchWindowTest, EndsAWindowEveryNUsesAndNeverWhenOff) {
  ScratchWindow every_three(3);
  std::vector<bool> ends;
  for (int use = 0; use < 7; ++use) ends.push_back(every_three.CountUse());
  EXPECT_EQ(ends, (std::vector<bool>{false, false, true, false, false, true, false}));
  for (int period : {0, -1}) {
    ScratchWindow off(period);
    for (int use = 0; use < 10; ++use) EXPECT_FALSE(off.CountUse()) << period;
  }
}

}  // namespace
}  // namespace attnserve::core
