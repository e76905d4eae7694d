// Helpers of the KV-cache tests: one full (uncached) forward of a whole sequence with the plain
// AttentionExecutor, the cached forward of one step, and the max abs difference.
#ifndef ATTNSERVE_TESTS_CORE_KV_CACHE_KV_TEST_SUPPORT_H_
#define ATTNSERVE_TESTS_CORE_KV_CACHE_KV_TEST_SUPPORT_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "core/attention_executor.h"
#include "core/kv_cache/cached_attention.h"
#include "gtest/gtest.h"

namespace attnserve::testing {

// Largest |a[i] - b[i]|; +∞ when sizes differ.
inline double MaxAbsDiff(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double{a[i]} - b[i]));
  return worst;
}

// One forward of the plain executor over one sequence `x` ([rows, d]); optional memory makes it
// cross-attention. Fails the test on error.
inline std::vector<float> FullForward(const core::AttentionLayer& layer, std::span<const float> x,
                                      bool causal, std::span<const float> memory = {},
                                      std::span<const uint8_t> mask = {},
                                      std::span<const bool> head_mask = {},
                                      std::vector<float>* weights = nullptr) {
  const int64_t d = layer.config().d_model;
  const int64_t rows = static_cast<int64_t>(x.size()) / d;
  const int64_t mem_rows = static_cast<int64_t>(memory.size()) / d;
  const std::vector<int64_t> offsets{0, rows}, mem_offsets{0, mem_rows};
  core::AttentionInputs in{.query = {x, offsets},
                           .mask = {.causal = causal, .explicit_mask = mask},
                           .head_mask = head_mask};
  if (!memory.empty()) in.memory = core::RaggedBatch{memory, mem_offsets};
  std::vector<float> out(x.size());
  if (weights != nullptr) weights->assign(core::WeightsSize(layer.config(), in), 0.0f);
  core::AttentionExecutor executor;
  const absl::Status s = executor.Forward(
      layer, in,
      {.output = out, .weights = weights ? std::span<float>(*weights) : std::span<float>()});
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_CORE_KV_CACHE_KV_TEST_SUPPORT_H_
