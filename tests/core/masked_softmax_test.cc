// MaskedSoftmaxRow against a double-precision softmax: probabilities, exact zeros for blocked
// keys and fully blocked rows, the bf16 output, and row lengths that are not a multiple of the
// kernel's 16 lanes.
#include "core/forward/masked_softmax.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace attnserve::testing {
namespace {

using core::MaskedSoftmaxRow;
using core::RowMask;

// softmax over the keys j < limit whose mask byte is set (all when `mask` is empty).
std::vector<double> ReferenceSoftmax(const std::vector<float>& scores, int64_t limit,
                                     const std::vector<uint8_t>& mask) {
  std::vector<double> p(scores.size(), 0.0);
  double max_score = -std::numeric_limits<double>::infinity();
  auto open = [&](int64_t j) { return j < limit && (mask.empty() || mask[j] != 0); };
  for (size_t j = 0; j < scores.size(); ++j) {
    if (open(j)) max_score = std::max(max_score, double{scores[j]});
  }
  double sum = 0.0;
  for (size_t j = 0; j < scores.size(); ++j) {
    if (open(j)) sum += p[j] = std::exp(double{scores[j]} - max_score);
  }
  for (double& v : p) v = sum > 0 ? v / sum : 0.0;
  return p;
}

std::vector<float> RandomScores(int64_t n, float spread, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, spread);
  std::vector<float> s(n);
  for (float& v : s) v = dist(rng);
  return s;
}

TEST(MaskedSoftmaxRowTest, MatchesDoubleSoftmaxForEveryLengthAndLimit) {
  for (int64_t keys : {1, 7, 16, 17, 33, 100, 2048}) {
    for (int64_t limit : {int64_t{1}, keys / 2 + 1, keys}) {
      const std::vector<float> scores = RandomScores(keys, 4.0f, keys * 31 + limit);
      std::vector<float> row = scores;
      EXPECT_EQ(MaskedSoftmaxRow(row.data(), keys, RowMask{.visible_limit = limit}, nullptr),
                limit);
      const std::vector<double> expected = ReferenceSoftmax(scores, limit, {});
      double sum = 0.0;
      for (int64_t j = 0; j < keys; ++j) {
        EXPECT_NEAR(row[j], expected[j], 2e-6 * expected[j] + 1e-30) << keys << " " << j;
        if (j >= limit) {
          EXPECT_EQ(std::bit_cast<uint32_t>(row[j]), 0u);  // +0, exactly.
        }
        sum += row[j];
      }
      EXPECT_NEAR(sum, 1.0, 1e-5);
    }
  }
}

TEST(MaskedSoftmaxRowTest, ExplicitMaskGivesExactZerosAndCountsVisibleKeys) {
  const int64_t keys = 53;
  const std::vector<float> scores = RandomScores(keys, 10.0f, 5);
  std::vector<uint8_t> mask(keys);
  for (int64_t j = 0; j < keys; ++j) mask[j] = (j % 3) != 0;
  std::vector<float> row = scores;
  const int64_t visible = MaskedSoftmaxRow(
      row.data(), keys, RowMask{.visible_limit = 40, .explicit_row = mask.data()}, nullptr);
  EXPECT_EQ(visible, 26);  // j < 40 with j % 3 != 0.
  const std::vector<double> expected = ReferenceSoftmax(scores, 40, mask);
  for (int64_t j = 0; j < keys; ++j) {
    if (expected[j] == 0.0) {
      EXPECT_EQ(row[j], 0.0f) << j;
    } else {
      EXPECT_NEAR(row[j], expected[j], 2e-6 * expected[j]) << j;
    }
  }
}

TEST(MaskedSoftmaxRowTest, FullyBlockedRowIsAllZerosNotNan) {
  const int64_t keys = 37;
  std::vector<uint8_t> closed(keys, 0);
  std::vector<float> row = RandomScores(keys, 1.0f, 6);
  EXPECT_EQ(
      MaskedSoftmaxRow(row.data(), keys,
                       RowMask{.visible_limit = keys, .explicit_row = closed.data()}, nullptr),
      0);
  for (float v : row) EXPECT_EQ(std::bit_cast<uint32_t>(v), 0u);
  std::vector<uint16_t> bf16(keys, 0xffff);
  row = RandomScores(keys, 1.0f, 7);
  EXPECT_EQ(MaskedSoftmaxRow(row.data(), keys, RowMask{.visible_limit = 0}, bf16.data()), 0);
  for (uint16_t v : bf16) EXPECT_EQ(v, 0u);
}

TEST(MaskedSoftmaxRowTest, Bf16OutputIsTheRoundedProbabilities) {
  const int64_t keys = 130, limit = 100;
  const std::vector<float> scores = RandomScores(keys, 3.0f, 8);
  std::vector<float> row = scores;
  std::vector<uint16_t> bf16(keys, 0xffff);
  MaskedSoftmaxRow(row.data(), keys, RowMask{.visible_limit = limit}, bf16.data());
  const std::vector<double> expected = ReferenceSoftmax(scores, limit, {});
  for (int64_t j = 0; j < keys; ++j) {
    const float widened = std::bit_cast<float>(static_cast<uint32_t>(bf16[j]) << 16);
    EXPECT_NEAR(widened, expected[j], expected[j] * (1.0 / 256) + 1e-30) << j;  // bf16: 8 bits.
    if (j >= limit) {
      EXPECT_EQ(bf16[j], 0u);
    }
  }
}

TEST(MaskedSoftmaxRowTest, LargeScoreGapsUnderflowToZeroWithoutNan) {
  std::vector<float> row = {0.0f, -200.0f, -1e30f, 50.0f, -std::numeric_limits<float>::infinity()};
  MaskedSoftmaxRow(row.data(), 5, RowMask{.visible_limit = 5}, nullptr);
  EXPECT_FLOAT_EQ(row[3], 1.0f);
  EXPECT_EQ(row[1], 0.0f);
  EXPECT_EQ(row[2], 0.0f);
  EXPECT_EQ(row[4], 0.0f);
  EXPECT_NEAR(row[0], std::exp(-50.0), 1e-27);
}

}  // namespace
}  // namespace attnserve::testing
