// ExecutorOptions::compute_threads applies to one Forward() and is then undone: the calling
// thread's OpenMP setting, which other code (and executors with compute_threads = 0) relies on,
// must be what it was.
#include <omp.h>

#include "core/forward/attention_executor.h"
#include "gtest/gtest.h"
#include "tests/core/attention_test_support.h"

namespace attnserve::testing {
namespace {

TEST(OpenMpThreadsTest, ComputeThreadsDoesNotLeakIntoTheCallingThread) {
  const TestLayer layer = MakeTestLayer({.d_model = 32, .num_heads = 4}, 3);
  ASSERT_NE(layer.layer, nullptr);
  const TestBatch batch = MakeBatch(32, {7, 9}, {}, 4);
  omp_set_num_threads(3);
  core::AttentionExecutor one_thread({.compute_threads = 1});
  ExpectMatchesReference(one_thread, *layer.layer, layer.weights, batch);
  EXPECT_EQ(omp_get_max_threads(), 3);
  // An executor with compute_threads = 0 keeps the caller's setting too.
  core::AttentionExecutor inherit;
  ExpectMatchesReference(inherit, *layer.layer, layer.weights, batch);
  EXPECT_EQ(omp_get_max_threads(), 3);
}

}  // namespace
}  // namespace attnserve::testing
