// The core against the double-precision reference over a sweep of layer shapes (d_model, heads,
// variant, bias) and batch scenarios (ragged lengths, runs of equal lengths, every mask kind,
// cross-attention with S > T and S < T, head masks). Every case runs with and without the weights
// output and checks that the output is identical either way; every case also runs in bf16
// compute against the bf16 bounds.
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/forward/attention_executor.h"
#include "core/forward/onednn_support.h"
#include "gtest/gtest.h"
#include "tests/core/attention_test_support.h"

namespace attnserve::testing {
namespace {

using core::AttentionConfig;
using core::AttentionVariant;

enum class MaskKind { kNone, kCausal, kExplicit, kExplicitCausal };

struct Scenario {
  std::string name;
  std::vector<int64_t> query;   // Query lengths T_i.
  std::vector<int64_t> memory;  // Memory lengths S_i; empty for self-attention.
  MaskKind mask = MaskKind::kNone;
  bool head_mask = false;
};

struct SweepCase {
  AttentionConfig config;
  Scenario scenario;
};

// Lengths {1, 3, 17, 128, 300} in different orders, runs of equal lengths (which the executor
// batches into one primitive call), and cross-attention with longer and shorter memories.
std::vector<Scenario> SmallModelScenarios() {
  using M = MaskKind;
  return {
      {"mixed_none", {1, 3, 17, 128, 300}, {}, M::kNone, false},
      {"mixed_causal", {300, 17, 1, 128, 3}, {}, M::kCausal, false},
      {"mixed_explicit", {17, 300, 3, 128, 1}, {}, M::kExplicit, false},
      {"mixed_explicit_causal_headmask", {3, 128, 1, 300, 17}, {}, M::kExplicitCausal, true},
      {"repeated_none", {17, 17, 17, 5}, {}, M::kNone, false},
      {"repeated_causal_headmask", {17, 17, 17, 5}, {}, M::kCausal, true},
      {"repeated_explicit_causal",
       {17, 17, 17, 5, 5, 128, 128, 1, 1},
       {},
       M::kExplicitCausal,
       false},
      {"cross_longer_none", {3, 17, 1, 128}, {17, 40, 5, 300}, M::kNone, false},
      {"cross_longer_causal", {3, 17, 1, 128}, {17, 40, 5, 300}, M::kCausal, false},
      {"cross_mixed_explicit_causal_headmask",
       {1, 3, 17, 17, 128},
       {300, 1, 128, 128, 3},
       M::kExplicitCausal,
       true},
      {"cross_shorter_causal", {17, 128, 3, 300}, {5, 17, 1, 64}, M::kCausal, false},
      {"cross_shorter_explicit", {17, 128, 3, 300}, {5, 17, 1, 64}, M::kExplicit, false},
      {"cross_repeated_explicit_causal",
       {17, 17, 17, 5, 5},
       {40, 40, 3, 3, 3},
       M::kExplicitCausal,
       false},
  };
}

// Fewer scenarios for d_model 512 and 768, where the reference's O(rows·d²) projections dominate
// the suite's runtime (each layer runs two of them); together they still cover all five lengths,
// every mask kind, equal-length runs, head masks, S > T and S < T.
std::vector<Scenario> LargeModelScenarios() {
  using M = MaskKind;
  return {
      {"mixed_explicit_causal_headmask", {1, 3, 17, 128, 300}, {}, M::kExplicitCausal, true},
      {"repeated_causal", {17, 17, 17, 5}, {}, M::kCausal, false},
      {"cross_explicit", {3, 17, 40}, {40, 5, 17}, M::kExplicit, false},
      {"cross_causal", {17, 3}, {5, 64}, M::kCausal, false},
  };
}

std::vector<AttentionConfig> LayerConfigs(int64_t d_model, bool both_biases) {
  std::vector<AttentionConfig> configs;
  for (int64_t heads : {1, 2, 8, 12}) {
    if (d_model % heads != 0) continue;
    configs.push_back({.d_model = d_model, .num_heads = heads});
  }
  configs.push_back({.d_model = d_model, .num_heads = 1, .variant = AttentionVariant::kSingleHead});
  std::vector<AttentionConfig> result;
  for (size_t i = 0; i < configs.size(); ++i) {
    if (both_biases) {
      for (bool bias : {false, true}) {
        AttentionConfig c = configs[i];
        c.bias = bias;
        result.push_back(c);
      }
    } else {
      AttentionConfig c = configs[i];
      c.bias = i % 2 == 1;  // Alternate so that each d_model sees both.
      result.push_back(c);
    }
  }
  return result;
}

std::vector<SweepCase> AllCases() {
  std::vector<SweepCase> cases;
  for (int64_t d : {8, 64}) {
    for (const AttentionConfig& config : LayerConfigs(d, /*both_biases=*/true)) {
      for (const Scenario& s : SmallModelScenarios()) cases.push_back({config, s});
    }
  }
  for (int64_t d : {512, 768}) {
    const std::vector<AttentionConfig> configs = LayerConfigs(d, /*both_biases=*/false);
    const std::vector<Scenario> scenarios = LargeModelScenarios();
    for (size_t c = 0; c < configs.size(); ++c) {
      // Each layer sees two of the scenarios, rotating so that every scenario runs at each d.
      for (size_t k = 0; k < 2; ++k) {
        cases.push_back({configs[c], scenarios[(2 * c + k) % scenarios.size()]});
      }
    }
  }
  return cases;
}

std::string CaseName(const ::testing::TestParamInfo<SweepCase>& info) {
  const AttentionConfig& c = info.param.config;
  // absl::StrCat: GCC 12 warns (-Wrestrict, a false positive) on chains of std::string +.
  return absl::StrCat("d", c.d_model, "_h", c.num_heads, "_",
                      c.variant == AttentionVariant::kMultiHead ? "multi" : "single",
                      c.bias ? "_bias_" : "_nobias_", info.param.scenario.name);
}

// Readable parameters in gtest's failure messages.
void PrintTo(const SweepCase& c, std::ostream* os) {
  *os << "d_model=" << c.config.d_model << " heads=" << c.config.num_heads << " "
      << core::VariantName(c.config.variant) << (c.config.bias ? " bias " : " no-bias ")
      << c.scenario.name;
}

uint64_t CaseSeed(const AttentionConfig& c) {
  return static_cast<uint64_t>(c.d_model * 131 + c.num_heads * 7 + (c.bias ? 1 : 0));
}

TestBatch ScenarioBatch(const SweepCase& p, uint64_t seed) {
  const Scenario& s = p.scenario;
  TestBatch batch = MakeBatch(p.config.d_model, s.query, s.memory, seed + 17);
  batch.causal = s.mask == MaskKind::kCausal || s.mask == MaskKind::kExplicitCausal;
  if (s.mask == MaskKind::kExplicit || s.mask == MaskKind::kExplicitCausal) {
    // Sparse enough that some short rows are fully blocked.
    SetRandomMask(batch, 0.7, seed + 29);
  }
  if (s.head_mask) {
    std::vector<bool> enabled;
    for (int64_t head = 0; head < p.config.num_heads; ++head) enabled.push_back(head % 3 != 1);
    SetHeadMask(batch, enabled);
  }
  return batch;
}

class ReferenceSweepTest : public ::testing::TestWithParam<SweepCase> {};

TEST_P(ReferenceSweepTest, MatchesReferenceWithAndWithoutWeights) {
  const SweepCase& p = GetParam();
  const uint64_t seed = CaseSeed(p.config);
  const TestLayer layer = MakeTestLayer(p.config, seed);
  ASSERT_NE(layer.layer, nullptr);
  const TestBatch batch = ScenarioBatch(p, seed);
  core::AttentionExecutor executor;
  ExpectMatchesReference(executor, *layer.layer, layer.weights, batch);
}

// The same cases computed in bf16 (same weights and inputs), within the bf16 bounds of
// attention_test_support.h.
class Bf16SweepTest : public ::testing::TestWithParam<SweepCase> {};

TEST_P(Bf16SweepTest, WithinBf16BoundsOfReference) {
  // oneDNN 2.6 has no bf16 matmul below avx512_core (tests/model/compute_dtype_test.cc).
  if (!core::HasBf16Kernels()) GTEST_SKIP() << "no bf16 kernels on " << core::OneDnnIsa();
  const SweepCase& p = GetParam();
  const uint64_t seed = CaseSeed(p.config);
  AttentionConfig config = p.config;
  config.compute_type = core::ComputeType::kBFloat16;
  const TestLayer layer = MakeTestLayer(config, seed);
  ASSERT_NE(layer.layer, nullptr);
  const TestBatch batch = ScenarioBatch(p, seed);
  core::AttentionExecutor executor;
  ExpectBf16NearReference(executor, *layer.layer, layer.weights, batch);
}

INSTANTIATE_TEST_SUITE_P(Sweep, ReferenceSweepTest, ::testing::ValuesIn(AllCases()), CaseName);

// Widths and head sizes that are not powers of two (d_k = 1, 2, 5, 7), which oneDNN handles with
// different kernels and tails than the sizes above.
std::vector<SweepCase> OddShapeCases() {
  using M = MaskKind;
  const std::vector<Scenario> scenarios = {
      {"mixed_explicit_causal_headmask", {1, 3, 17, 33}, {}, M::kExplicitCausal, true},
      {"cross_causal", {17, 17, 3}, {5, 5, 40}, M::kCausal, false},
  };
  std::vector<SweepCase> cases;
  for (const AttentionConfig& config :
       {AttentionConfig{.d_model = 6, .num_heads = 3, .bias = true},
        AttentionConfig{.d_model = 5, .num_heads = 5},
        AttentionConfig{.d_model = 35, .num_heads = 5, .bias = true},
        AttentionConfig{.d_model = 7, .num_heads = 1, .variant = AttentionVariant::kSingleHead}}) {
    for (const Scenario& s : scenarios) cases.push_back({config, s});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(OddShapes, ReferenceSweepTest, ::testing::ValuesIn(OddShapeCases()),
                         CaseName);
INSTANTIATE_TEST_SUITE_P(Sweep, Bf16SweepTest, ::testing::ValuesIn(AllCases()), CaseName);
INSTANTIATE_TEST_SUITE_P(OddShapes, Bf16SweepTest, ::testing::ValuesIn(OddShapeCases()), CaseName);

}  // namespace
}  // namespace attnserve::testing
