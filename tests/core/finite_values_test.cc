// FindNonFinite: the first NaN or ±∞, wherever it falls relative to the scan's 1024-value blocks.
#include "core/forward/finite_values.h"

#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve::core {
namespace {

TEST(FindNonFiniteTest, AllFiniteOrEmptyIsMinusOne) {
  EXPECT_EQ(FindNonFinite({}), -1);
  std::vector<float> values(5000, 1.0f);
  values[17] = std::numeric_limits<float>::max();
  values[18] = -std::numeric_limits<float>::max();
  values[19] = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(FindNonFinite(values), -1);
}

TEST(FindNonFiniteTest, FindsTheFirstBadValueAtEveryPosition) {
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
  for (float bad : bad_values) {
    for (int64_t at : {0, 1, 1023, 1024, 1025, 2999, 4999}) {
      std::vector<float> values(5000, 0.5f);
      values[at] = bad;
      if (at + 7 < 5000) values[at + 7] = bad;  // A later one must not win.
      EXPECT_EQ(FindNonFinite(values), at) << "bad value " << bad << " at " << at;
    }
  }
}

}  // namespace
}  // namespace attnserve::core
