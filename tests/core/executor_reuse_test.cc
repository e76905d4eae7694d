// One AttentionExecutor reused across layers of different widths, head counts and variants, and
// across shapes, masks and self/cross-attention: its primitive caches must be keyed so that every
// call gets the right primitives. Also: eviction with a tiny cache, several executors sharing one
// layer, and the compute_threads option.
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/forward/attention_executor.h"
#include "gtest/gtest.h"
#include "tests/core/attention_test_support.h"

namespace attnserve::testing {
namespace {

using core::AttentionConfig;
using core::AttentionVariant;

// A call: which layer, which batch.
struct Call {
  size_t layer;
  std::vector<int64_t> query, memory;
  bool causal = false;
  bool explicit_mask = false;
};

std::vector<TestLayer> MakeLayers() {
  std::vector<TestLayer> layers;
  layers.push_back(MakeTestLayer({.d_model = 64, .num_heads = 8, .bias = true}, 1));
  // Same config, different weights: cached primitives must not capture weight pointers.
  layers.push_back(MakeTestLayer({.d_model = 64, .num_heads = 8, .bias = true}, 2));
  // Same d_model, other head counts: the tile geometry (and the 1/√d_k scale) changes.
  layers.push_back(MakeTestLayer({.d_model = 64, .num_heads = 4}, 3));
  layers.push_back(MakeTestLayer({.d_model = 64, .num_heads = 1}, 4));
  layers.push_back(MakeTestLayer(
      {.d_model = 64, .num_heads = 1, .variant = AttentionVariant::kSingleHead, .bias = true}, 5));
  // Other widths.
  layers.push_back(MakeTestLayer({.d_model = 128, .num_heads = 8}, 6));
  layers.push_back(MakeTestLayer({.d_model = 24, .num_heads = 3, .bias = true}, 7));
  return layers;
}

// Interleaves layers and shapes, returning to earlier (cached) combinations.
std::vector<Call> MakeCalls() {
  return {
      {0, {17, 5}, {}, true, false},      {1, {17, 5}, {}, true, false},
      {2, {17, 5}, {}, true, false},      {3, {17, 5}, {}, true, false},
      {4, {17, 5}, {}, true, false},      {5, {17, 5}, {}, true, false},
      {6, {17, 5}, {}, true, false},      {0, {17, 5}, {9, 30}, false, true},
      {5, {17, 5}, {9, 30}, false, true}, {0, {3, 3, 3}, {}, false, true},
      {6, {3, 3, 3}, {}, false, false},   {2, {100}, {}, true, true},
      {0, {17, 5}, {}, true, false},      {1, {17, 5}, {9, 30}, true, false},
      {4, {5, 17}, {30, 9}, true, true},  {3, {17, 5}, {}, false, false},
      {5, {64, 1, 64}, {}, true, false},  {0, {17, 5}, {}, true, false},
  };
}

void RunCalls(core::AttentionExecutor& executor, const std::vector<TestLayer>& layers) {
  const std::vector<Call> calls = MakeCalls();
  for (size_t c = 0; c < calls.size(); ++c) {
    const Call& call = calls[c];
    const TestLayer& layer = layers[call.layer];
    SCOPED_TRACE(::testing::Message()
                 << "call " << c << " layer " << call.layer << " (d_model " << layer.config.d_model
                 << ", heads " << layer.config.num_heads << ")");
    ASSERT_NE(layer.layer, nullptr);
    TestBatch batch = MakeBatch(layer.config.d_model, call.query, call.memory, 100 + c);
    batch.causal = call.causal;
    if (call.explicit_mask) SetRandomMask(batch, 0.7, 200 + c);
    ExpectMatchesReference(executor, *layer.layer, layer.weights, batch);
  }
}

TEST(ExecutorReuseTest, OneExecutorAcrossLayersAndShapes) {
  const std::vector<TestLayer> layers = MakeLayers();
  core::AttentionExecutor executor;
  RunCalls(executor, layers);
}

TEST(ExecutorReuseTest, OneExecutorAcrossLayersWithRowTiling) {
  const std::vector<TestLayer> layers = MakeLayers();
  core::AttentionExecutor executor({.score_tile_bytes = 8 * 1024});
  RunCalls(executor, layers);
}

TEST(ExecutorReuseTest, TinyCacheEvictsAndRebuilds) {
  const std::vector<TestLayer> layers = MakeLayers();
  core::AttentionExecutor executor({.max_cached_shapes = 1});
  RunCalls(executor, layers);
}

// With a scratch window of one call, every Forward() ends a window: after a large batch the next
// small one frees the large scratch (over 1 MiB and over twice what it needs), and the large one
// after it allocates it again. Each call is checked against the reference; under AddressSanitizer
// any use of freed scratch is a report.
TEST(ExecutorReuseTest, ScratchFreedAtTheEndOfAWindowIsAllocatedAgain) {
  const std::vector<TestLayer> layers = MakeLayers();
  const TestLayer& wide = layers[5];  // d_model 128: 2,048 rows make a 3 MiB Q|K|V buffer.
  ASSERT_NE(wide.layer, nullptr);
  core::AttentionExecutor executor({.scratch_window_forwards = 1});
  const std::vector<std::vector<int64_t>> shapes = {{512, 512, 512, 512}, {17, 5}, {3},
                                                    {512, 512, 512, 512}, {64},    {1024, 1024}};
  for (size_t c = 0; c < shapes.size(); ++c) {
    SCOPED_TRACE(::testing::Message() << "call " << c);
    TestBatch batch = MakeBatch(wide.config.d_model, shapes[c], {}, 300 + c);
    batch.causal = c % 2 == 1;
    ExpectMatchesReference(executor, *wide.layer, wide.weights, batch);
  }
}

TEST(ExecutorReuseTest, ExecutorsSharingOneLayerAgree) {
  const TestLayer layer = MakeTestLayer({.d_model = 32, .num_heads = 4, .bias = true}, 9);
  ASSERT_NE(layer.layer, nullptr);
  TestBatch batch = MakeBatch(32, {12, 12, 4}, {}, 10);
  batch.causal = true;
  core::AttentionExecutor first, second;
  const ForwardResult a = RunForward(first, *layer.layer, batch, true);
  const ForwardResult b = RunForward(second, *layer.layer, batch, true);
  ASSERT_TRUE(a.status.ok()) << a.status;
  ASSERT_TRUE(b.status.ok()) << b.status;
  EXPECT_EQ(a.output, b.output);
  EXPECT_EQ(a.weights, b.weights);
  ExpectMatchesReference(first, *layer.layer, layer.weights, batch);
}

TEST(ExecutorReuseTest, ExecutorsOnTwoThreadsShareOneLayer) {
  // One immutable layer, one executor per thread, both running at once.
  const TestLayer layer = MakeTestLayer({.d_model = 32, .num_heads = 4, .bias = true}, 14);
  ASSERT_NE(layer.layer, nullptr);
  TestBatch batch = MakeBatch(32, {30, 30, 9, 1}, {}, 15);
  batch.causal = true;
  SetRandomMask(batch, 0.8, 16);
  core::AttentionExecutor single_threaded;
  const ForwardResult expected = RunForward(single_threaded, *layer.layer, batch, true);
  ASSERT_TRUE(expected.status.ok()) << expected.status;

  constexpr int kIterations = 20;
  std::atomic<int> mismatches{0}, errors{0};
  auto work = [&] {
    core::AttentionExecutor executor({.compute_threads = 1});
    for (int i = 0; i < kIterations; ++i) {
      const ForwardResult r = RunForward(executor, *layer.layer, batch, true);
      if (!r.status.ok()) {
        ++errors;
      } else if (!NearReference(r.output,
                                std::vector<double>(expected.output.begin(), expected.output.end()),
                                "output") ||
                 !NearReference(
                     r.weights,
                     std::vector<double>(expected.weights.begin(), expected.weights.end()),
                     "weights")) {
        ++mismatches;
      }
    }
  };
  std::thread first(work), second(work);
  first.join();
  second.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(ExecutorReuseTest, SingleComputeThread) {
  const TestLayer layer = MakeTestLayer({.d_model = 64, .num_heads = 8, .bias = true}, 11);
  ASSERT_NE(layer.layer, nullptr);
  core::AttentionExecutor executor({.compute_threads = 1});
  EXPECT_EQ(executor.options().compute_threads, 1);
  TestBatch batch = MakeBatch(64, {40, 7, 7}, {}, 12);
  batch.causal = true;
  SetRandomMask(batch, 0.8, 13);
  ExpectMatchesReference(executor, *layer.layer, layer.weights, batch);
}

}  // namespace
}  // namespace attnserve::testing
