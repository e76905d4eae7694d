// Shared helpers for the core tests: deterministic inputs, ragged batches with their masks, and
// comparison of the core's outputs against the double-precision reference.
#ifndef ATTNSERVE_TESTS_CORE_ATTENTION_TEST_SUPPORT_H_
#define ATTNSERVE_TESTS_CORE_ATTENTION_TEST_SUPPORT_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/forward/attention_batch.h"
#include "core/forward/attention_config.h"
#include "core/forward/attention_executor.h"
#include "core/forward/attention_layer.h"
#include "core/forward/attention_weights.h"
#include "gtest/gtest.h"

namespace attnserve::testing {

// The tolerance every comparison with the reference uses: |core - ref| <= kTolerance·max(1, |ref|).
inline constexpr double kTolerance = 1e-4;

// Deterministic uniform values in [-1, 1] from a fixed-seed splitmix64 stream.
std::vector<float> UniformValues(size_t count, uint64_t seed);

// Owns the storage of one ragged batch (query, optional memory, masks) and hands out the core's
// borrowing view of it. Move-only; the view is rebuilt by Inputs() on every call.
struct TestBatch {
  int64_t d_model = 0;
  std::vector<int64_t> query_offsets, memory_offsets;  // memory_offsets empty: self-attention.
  std::vector<float> query_data, memory_data;
  bool causal = false;
  std::vector<uint8_t> explicit_mask;  // Empty: no explicit mask.
  std::unique_ptr<bool[]> head_mask;   // Null: no head mask.
  int64_t head_mask_size = 0;

  bool cross() const { return !memory_offsets.empty(); }
  int64_t num_sequences() const { return static_cast<int64_t>(query_offsets.size()) - 1; }
  int64_t query_rows() const { return query_offsets.back(); }
  int64_t query_length(int64_t i) const { return query_offsets[i + 1] - query_offsets[i]; }
  int64_t key_length(int64_t i) const;
  // Σ T_i·S_i, computed here (not by the core).
  int64_t score_elements() const;

  core::AttentionInputs Inputs() const;
};

// Builds a batch with the given query lengths and, when `memory_lengths` is non-empty, a
// cross-attention memory; rows are UniformValues from `seed`.
TestBatch MakeBatch(int64_t d_model, const std::vector<int64_t>& query_lengths,
                    const std::vector<int64_t>& memory_lengths, uint64_t seed);

// Sets a random explicit mask where each entry is visible with probability `visible`.
void SetRandomMask(TestBatch& batch, double visible, uint64_t seed);
void SetHeadMask(TestBatch& batch, const std::vector<bool>& enabled);

// Outputs of one Forward() call, sized for `batch` (weights left empty when not requested).
struct ForwardResult {
  absl::Status status;
  std::vector<float> output;
  std::vector<float> weights;
};
ForwardResult RunForward(core::AttentionExecutor& executor, const core::AttentionLayer& layer,
                         const TestBatch& batch, bool with_weights);

// |actual - expected| <= kTolerance·max(1, |expected|) everywhere, and no NaN; on failure the
// message names the first few mismatching indices, their values and the number of mismatches.
::testing::AssertionResult NearReference(std::span<const float> actual,
                                         std::span<const double> expected, const std::string& what);

// Runs `batch` through the core twice (with and without the weights output), and checks:
// both calls succeed, the two outputs are bitwise identical, and output and weights match the
// reference. Non-fatal gtest failures.
void ExpectMatchesReference(core::AttentionExecutor& executor, const core::AttentionLayer& layer,
                            const core::AttentionWeights& weights, const TestBatch& batch);

// The bf16 compute bounds against the double-precision reference (bf16 keeps 8 significant bits,
// relative rounding 2^-9 ≈ 0.002, applied to inputs, weights, Q/K/V, probabilities and the heads'
// concat): max |core - ref| over the output ≤ kBf16OutputBound · RMS(ref output); over the
// weights output ≤ kBf16WeightsBound (probabilities are in [0, 1]); each unblocked weights row
// sums to 1 within kBf16RowSumBound. Measured worst over the sweep (reference_sweep_test prints
// each case): 0.09·RMS, 0.0033 and 0.0039 (2^-8: the probabilities are rounded to bf16).
inline constexpr double kBf16OutputBound = 0.125;
inline constexpr double kBf16WeightsBound = 0.01;
inline constexpr double kBf16RowSumBound = 0.005;

// The bf16 counterpart of ExpectMatchesReference: both calls succeed with bitwise equal outputs;
// output and weights within the bounds above; wherever the reference is exactly 0 (blocked keys,
// fully blocked rows, disabled heads) the core gives exactly 0; weights rows sum to 1.
void ExpectBf16NearReference(core::AttentionExecutor& executor, const core::AttentionLayer& layer,
                             const core::AttentionWeights& weights, const TestBatch& batch);

// Max |actual - expected| and RMS(expected); sizes must match.
struct ErrorSummary {
  double max_abs_error = 0.0;
  double rms = 0.0;
};
ErrorSummary SummariseError(std::span<const float> actual, std::span<const double> expected);

// Creates a layer with MakeRandomWeights(config, seed); fatal-free: returns null and adds a
// failure when creation fails.
struct TestLayer {
  core::AttentionConfig config;
  core::AttentionWeights weights;
  std::shared_ptr<const core::AttentionLayer> layer;
};
TestLayer MakeTestLayer(const core::AttentionConfig& config, uint64_t seed);

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_CORE_ATTENTION_TEST_SUPPORT_H_
