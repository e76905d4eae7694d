// ProjectionRunner: results against a double-precision product for row counts that split into
// several pieces, and a number of primitives bounded by the piece sizes, not by the variety of
// row counts it is called with.
#include "core/forward/projection_runner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/forward/bf16_conversion.h"
#include "core/forward/onednn_support.h"
#include "core/forward/packed_matrix.h"

namespace attnserve::core {
namespace {

using dt = dnnl::memory::data_type;

std::vector<float> Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = uniform(rng);
  return v;
}

TEST(FirstRowPieceTest, PiecesSumToTheRowsAndComeFromTheFixedSet) {
  for (int64_t m = 1; m <= 8192; ++m) {
    int64_t left = m;
    int pieces = 0;
    while (left > 0) {
      const int64_t piece = FirstRowPiece(left);
      ASSERT_GE(piece, 1) << "m=" << m;
      ASSERT_LE(piece, left) << "m=" << m;
      const bool remainder = piece < 64;
      const bool multiple = piece % (piece >= 4096 ? 1024 : piece >= 1024 ? 256 : 64) == 0;
      ASSERT_TRUE(remainder || multiple) << "m=" << m << " piece=" << piece;
      left -= piece;
      ++pieces;
    }
    ASSERT_LE(pieces, 4) << "m=" << m;
  }
  EXPECT_EQ(FirstRowPiece(63), 63);
  EXPECT_EQ(FirstRowPiece(200), 192);
  EXPECT_EQ(FirstRowPiece(2000), 1792);
  EXPECT_EQ(FirstRowPiece(5000), 4096);
}

class ProjectionRunnerTest : public ::testing::TestWithParam<dt> {
 protected:
  void SetUp() override {
    // Below avx512_core oneDNN 2.6 has no bf16 matmul at all (layers refuse bf16 there).
    if (GetParam() == dt::bf16 && !HasBf16Kernels()) {
      GTEST_SKIP() << "no bf16 kernels on " << OneDnnIsa();
    }
  }
};

TEST_P(ProjectionRunnerTest, MatchesADoubleProductForEveryPieceSplit) {
  constexpr int64_t kK = 48, kN = 40, kMaxRows = 1100;
  const dt type = GetParam();
  const std::vector<float> w = Random(kK * kN, 1), bias = Random(kN, 2);
  std::vector<float> x = Random(kMaxRows * kK, 3);
  // bf16 sources: round the inputs and weights first, so both sides multiply the same values.
  std::vector<float> w_used = w;
  std::vector<uint16_t> x_bf16(x.size());
  if (type == dt::bf16) {
    RoundToBf16InPlace(w_used.data(), static_cast<int64_t>(w_used.size()));
    RoundToBf16(x.data(), static_cast<int64_t>(x.size()), x_bf16.data());
    WidenBf16(x_bf16.data(), static_cast<int64_t>(x.size()), x.data());
  }
  auto packed = PackMatrix(w, kK, kN, kN, type);
  ASSERT_TRUE(packed.ok()) << packed.status();
  ProjectionRunner runner(512);
  dnnl::stream stream(CpuEngine());
  AlignedBuffer scratchpad;
  const double tolerance = type == dt::bf16 ? 1e-4 : 1e-5;
  for (int64_t m : {1, 63, 64, 65, 200, 1023, 1024, 1100}) {
    std::vector<float> y(static_cast<size_t>(m * kN), std::nanf(""));
    const void* src = type == dt::bf16 ? static_cast<const void*>(x_bf16.data()) : x.data();
    ASSERT_TRUE(runner.Run(src, m, *packed, bias, y.data(), stream, scratchpad).ok());
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < kN; ++c) {
        double want = bias[static_cast<size_t>(c)];
        for (int64_t k = 0; k < kK; ++k) {
          want +=
              double{x[static_cast<size_t>(r * kK + k)]} * w_used[static_cast<size_t>(k * kN + c)];
        }
        ASSERT_NEAR(y[static_cast<size_t>(r * kN + c)], want, tolerance * (1 + std::abs(want)))
            << "m=" << m << " row " << r << " col " << c;
      }
    }
  }
}

TEST_P(ProjectionRunnerTest, PrimitivesAreBoundedByThePieceSizesNotByTheRowCounts) {
  constexpr int64_t kK = 16, kN = 16, kMaxRows = 2100;
  const dt type = GetParam();
  auto packed = PackMatrix(Random(kK * kN, 1), kK, kN, kN, type);
  ASSERT_TRUE(packed.ok()) << packed.status();
  std::vector<float> x(kMaxRows * kK), y(kMaxRows * kN);
  ProjectionRunner runner(4096);
  dnnl::stream stream(CpuEngine());
  AlignedBuffer scratchpad;
  // 2,100 distinct row counts: below 64 one primitive each, then only the multiples of 64 (15
  // below 1,024) and of 256 (1,024 to 2,048: 5) join them.
  for (int64_t m = 1; m <= kMaxRows; ++m) {
    ASSERT_TRUE(runner.Run(x.data(), m, *packed, {}, y.data(), stream, scratchpad).ok());
  }
  EXPECT_EQ(runner.cached_primitives(), 63u + 15u + 5u);
}

INSTANTIATE_TEST_SUITE_P(Types, ProjectionRunnerTest, ::testing::Values(dt::f32, dt::bf16),
                         [](const auto& param_info) {
                           return param_info.param == dt::f32 ? "F32" : "Bf16";
                         });

}  // namespace
}  // namespace attnserve::core
