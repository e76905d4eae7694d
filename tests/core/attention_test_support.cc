#include "tests/core/attention_test_support.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "tests/reference/reference_attention.h"

namespace attnserve::testing {
namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double UnitInterval(uint64_t& state) {
  return static_cast<double>(SplitMix64(state) >> 11) * 0x1.0p-53;  // [0, 1)
}

std::vector<int64_t> Offsets(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> offsets{0};
  for (int64_t length : lengths) offsets.push_back(offsets.back() + length);
  return offsets;
}

}  // namespace

std::vector<float> UniformValues(size_t count, uint64_t seed) {
  // Mix the seed so that nearby seeds give unrelated streams.
  uint64_t state = seed * 0xd1b54a32d192ed03ULL + 0x2545f4914f6cdd1dULL;
  std::vector<float> values(count);
  for (float& v : values) v = static_cast<float>(2.0 * UnitInterval(state) - 1.0);
  return values;
}

int64_t TestBatch::key_length(int64_t i) const {
  return cross() ? memory_offsets[i + 1] - memory_offsets[i] : query_length(i);
}

int64_t TestBatch::score_elements() const {
  int64_t total = 0;
  for (int64_t i = 0; i < num_sequences(); ++i) total += query_length(i) * key_length(i);
  return total;
}

core::AttentionInputs TestBatch::Inputs() const {
  core::AttentionInputs in;
  in.query = {.data = query_data, .offsets = query_offsets};
  if (cross()) in.memory = core::RaggedBatch{.data = memory_data, .offsets = memory_offsets};
  in.mask.causal = causal;
  in.mask.explicit_mask = explicit_mask;
  if (head_mask) in.head_mask = std::span<const bool>(head_mask.get(), head_mask_size);
  return in;
}

TestBatch MakeBatch(int64_t d_model, const std::vector<int64_t>& query_lengths,
                    const std::vector<int64_t>& memory_lengths, uint64_t seed) {
  TestBatch batch;
  batch.d_model = d_model;
  batch.query_offsets = Offsets(query_lengths);
  batch.query_data = UniformValues(static_cast<size_t>(batch.query_rows() * d_model), seed);
  if (!memory_lengths.empty()) {
    batch.memory_offsets = Offsets(memory_lengths);
    batch.memory_data =
        UniformValues(static_cast<size_t>(batch.memory_offsets.back() * d_model), seed + 1000003);
  }
  return batch;
}

void SetRandomMask(TestBatch& batch, double visible, uint64_t seed) {
  uint64_t state = seed ^ 0x5bd1e9955bd1e995ULL;
  batch.explicit_mask.resize(static_cast<size_t>(batch.score_elements()));
  for (uint8_t& m : batch.explicit_mask) m = UnitInterval(state) < visible ? 1 : 0;
}

void SetHeadMask(TestBatch& batch, const std::vector<bool>& enabled) {
  batch.head_mask_size = static_cast<int64_t>(enabled.size());
  batch.head_mask = std::make_unique<bool[]>(enabled.size());
  std::copy(enabled.begin(), enabled.end(), batch.head_mask.get());
}

ForwardResult RunForward(core::AttentionExecutor& executor, const core::AttentionLayer& layer,
                         const TestBatch& batch, bool with_weights) {
  const core::AttentionConfig& config = layer.config();
  ForwardResult result;
  // Pre-fill with NaN so that an element the core forgets to write shows up.
  result.output.assign(static_cast<size_t>(batch.query_rows() * config.d_model), std::nanf(""));
  if (with_weights) {
    result.weights.assign(static_cast<size_t>(config.num_heads * batch.score_elements()),
                          std::nanf(""));
  }
  result.status =
      executor.Forward(layer, batch.Inputs(), {.output = result.output, .weights = result.weights});
  return result;
}

::testing::AssertionResult NearReference(std::span<const float> actual,
                                         std::span<const double> expected,
                                         const std::string& what) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << what << ": size " << actual.size() << " vs reference " << expected.size();
  }
  size_t mismatches = 0;
  double worst = 0.0;
  std::ostringstream details;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    const double err = std::abs(a - e);
    const double allowed = kTolerance * std::max(1.0, std::abs(e));
    if (!(err <= allowed)) {  // Also catches NaN.
      if (mismatches < 5) details << "\n  [" << i << "] core " << a << " reference " << e;
      ++mismatches;
    }
    if (std::isfinite(err)) worst = std::max(worst, err / std::max(1.0, std::abs(e)));
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << mismatches << " of " << actual.size()
         << " elements outside tolerance (worst scaled error " << worst << ")" << details.str();
}

void ExpectMatchesReference(core::AttentionExecutor& executor, const core::AttentionLayer& layer,
                            const core::AttentionWeights& weights, const TestBatch& batch) {
  const core::AttentionConfig& config = layer.config();
  const ForwardResult with = RunForward(executor, layer, batch, /*with_weights=*/true);
  ASSERT_TRUE(with.status.ok()) << with.status;
  const ForwardResult without = RunForward(executor, layer, batch, /*with_weights=*/false);
  ASSERT_TRUE(without.status.ok()) << without.status;
  // Requesting the weights must not change the output at all.
  ASSERT_EQ(with.output.size(), without.output.size());
  EXPECT_EQ(
      0, std::memcmp(with.output.data(), without.output.data(), with.output.size() * sizeof(float)))
      << "output differs between weights requested and not requested";

  const auto expected = reference::Attention(config, weights, batch.Inputs());
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_TRUE(NearReference(with.output, expected->output, "output"));
  EXPECT_TRUE(NearReference(with.weights, expected->weights, "weights"));
}

ErrorSummary SummariseError(std::span<const float> actual, std::span<const double> expected) {
  ErrorSummary summary;
  double squares = 0.0;
  for (size_t i = 0; i < expected.size() && i < actual.size(); ++i) {
    const double err = std::abs(actual[i] - expected[i]);
    // NaN must fail the bound, so it becomes an infinite error.
    summary.max_abs_error = std::max(summary.max_abs_error, std::isnan(err) ? INFINITY : err);
    squares += expected[i] * expected[i];
  }
  summary.rms = expected.empty() ? 0.0 : std::sqrt(squares / static_cast<double>(expected.size()));
  return summary;
}

namespace {

// Counts positions where the reference is exactly 0 but `actual` is not.
size_t NonZeroWhereReferenceZero(std::span<const float> actual, std::span<const double> expected) {
  size_t count = 0;
  for (size_t i = 0; i < expected.size() && i < actual.size(); ++i) {
    count += expected[i] == 0.0 && actual[i] != 0.0f;
  }
  return count;
}

}  // namespace

void ExpectBf16NearReference(core::AttentionExecutor& executor, const core::AttentionLayer& layer,
                             const core::AttentionWeights& weights, const TestBatch& batch) {
  core::AttentionConfig config = layer.config();
  const ForwardResult with = RunForward(executor, layer, batch, /*with_weights=*/true);
  ASSERT_TRUE(with.status.ok()) << with.status;
  const ForwardResult without = RunForward(executor, layer, batch, /*with_weights=*/false);
  ASSERT_TRUE(without.status.ok()) << without.status;
  ASSERT_EQ(with.output.size(), without.output.size());
  EXPECT_EQ(
      0, std::memcmp(with.output.data(), without.output.data(), with.output.size() * sizeof(float)))
      << "output differs between weights requested and not requested";

  config.compute_type = core::ComputeType::kFloat32;  // The reference is exact (double) anyway.
  const auto expected = reference::Attention(config, weights, batch.Inputs());
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_EQ(with.output.size(), expected->output.size());
  ASSERT_EQ(with.weights.size(), expected->weights.size());

  const ErrorSummary out = SummariseError(with.output, expected->output);
  EXPECT_LE(out.max_abs_error, kBf16OutputBound * out.rms)
      << "output: max abs error " << out.max_abs_error << ", RMS " << out.rms;
  EXPECT_EQ(NonZeroWhereReferenceZero(with.output, expected->output), 0u)
      << "output: non-zero where the reference is exactly zero";
  const ErrorSummary w = SummariseError(with.weights, expected->weights);
  EXPECT_LE(w.max_abs_error, kBf16WeightsBound) << "weights: max abs error " << w.max_abs_error;
  EXPECT_EQ(NonZeroWhereReferenceZero(with.weights, expected->weights), 0u)
      << "weights: non-zero where the reference is exactly zero";

  // Rows of the weights output: per sequence [h, T_i, S_i].
  size_t offset = 0, bad_rows = 0;
  double worst_sum = 0.0;
  for (int64_t i = 0; i < batch.num_sequences(); ++i) {
    const size_t s = static_cast<size_t>(batch.key_length(i));
    const size_t rows = static_cast<size_t>(config.num_heads * batch.query_length(i));
    for (size_t r = 0; r < rows; ++r, offset += s) {
      double ours = 0.0, reference_sum = 0.0;
      for (size_t j = 0; j < s; ++j) {
        ours += with.weights[offset + j];
        reference_sum += expected->weights[offset + j];
      }
      if (reference_sum == 0.0) continue;  // Blocked row or disabled head: checked above.
      worst_sum = std::max(worst_sum, std::abs(ours - 1.0));
      bad_rows += !(std::abs(ours - 1.0) <= kBf16RowSumBound);
    }
  }
  EXPECT_EQ(bad_rows, 0u) << "weights rows not summing to 1 within " << kBf16RowSumBound
                          << " (worst " << worst_sum << ")";
  // Printed so that the bounds' headroom is visible in the test log.
  std::printf("bf16 error: output max %.3g (%.3g x RMS %.3g), weights max %.3g, row sum %.3g\n",
              out.max_abs_error, out.max_abs_error / std::max(out.rms, 1e-30), out.rms,
              w.max_abs_error, worst_sum);
}

TestLayer MakeTestLayer(const core::AttentionConfig& config, uint64_t seed) {
  TestLayer t{.config = config, .weights = core::MakeRandomWeights(config, seed), .layer = nullptr};
  auto layer = core::AttentionLayer::Create(config, t.weights);
  EXPECT_TRUE(layer.ok()) << layer.status();
  if (layer.ok()) t.layer = *std::move(layer);
  return t;
}

}  // namespace attnserve::testing
