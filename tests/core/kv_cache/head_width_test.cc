// The decode kernel (AttendRow) has unrolled versions for head widths 32, 64 and 128 and a general
// one for every other width. For each path, fp32 and bf16: a short prefill, then one-row decode
// steps across several blocks, against one full causal forward of the whole sequence (fp32:
// max abs difference ≤ 1e-5; bf16: within the core's bf16 bound of the full bf16 forward).
#include <cstdint>
#include <string>
#include <vector>

#include "core/forward/onednn_support.h"
#include "core/kv_cache/cached_attention.h"
#include "gtest/gtest.h"
#include "tests/core/attention_test_support.h"
#include "tests/core/kv_cache/kv_test_support.h"

namespace attnserve::testing {
namespace {

using core::AttentionConfig;
using core::ComputeType;

constexpr int64_t kHeads = 2;
constexpr int64_t kRows = 40;  // A 3-row prefill, then 37 one-row steps: crosses 2 blocks.
constexpr int64_t kPrefill = 3;

struct WidthCase {
  int64_t head_dim;
  bool bf16;
};

class HeadWidthTest : public ::testing::TestWithParam<WidthCase> {};

TEST_P(HeadWidthTest, DecodeStepsEqualOneCausalForward) {
  const WidthCase c = GetParam();
  if (c.bf16 && !core::HasBf16Kernels()) GTEST_SKIP() << "no bf16 kernels";
  const AttentionConfig config{
      .d_model = c.head_dim * kHeads,
      .num_heads = kHeads,
      .compute_type = c.bf16 ? ComputeType::kBFloat16 : ComputeType::kFloat32};
  const TestLayer layer = MakeTestLayer(config, 21);
  ASSERT_NE(layer.layer, nullptr);
  const std::vector<float> x = UniformValues(kRows * config.d_model, 22);
  const std::vector<float> full = FullForward(*layer.layer, x, /*causal=*/true);
  auto pool = MakeTestPool(config, 1 << 20);
  ASSERT_NE(pool, nullptr);
  // The prefill, then one row per step through the cache.
  const std::vector<float> decoded = Incremental(*layer.layer, *pool, x, kPrefill, 1);
  if (!c.bf16) {
    EXPECT_LE(MaxAbsDiff(decoded, full), 1e-5);
    return;
  }
  const ErrorSummary error = SummariseError(decoded, std::vector<double>(full.begin(), full.end()));
  EXPECT_LE(error.max_abs_error, kBf16OutputBound * error.rms) << "RMS " << error.rms;
}

std::vector<WidthCase> WidthCases() {
  std::vector<WidthCase> cases;
  for (int64_t width : {8, 16, 32, 64, 96, 128}) {
    for (bool bf16 : {false, true}) cases.push_back({width, bf16});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Widths, HeadWidthTest, ::testing::ValuesIn(WidthCases()),
                         [](const auto& param_info) {
                           return "HeadDim" + std::to_string(param_info.param.head_dim) +
                                  (param_info.param.bf16 ? "Bf16" : "Fp32");
                         });

}  // namespace
}  // namespace attnserve::testing
