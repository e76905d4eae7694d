// The server's batch threads belong to one shared scheduler: eight models under load are served
// by num_batch_threads threads ("attnserve-batch"), not by a set of threads per model.
#include <atomic>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/forward/attention_weights.h"
#include "core/model/model_writer.h"
#include "gtest/gtest.h"
#include "tests/server/service/server_test_support.h"
#include "tests/support/thread_names.h"

namespace attnserve::testing {
namespace {

constexpr char kBatchThreadName[] = "attnserve-batch";

class SharedBatchThreadsTest : public ServerTest {};

TEST_F(SharedBatchThreadsTest, EightModelsUnderLoadKeepTheBatchThreadCount) {
  // Six more models beside the repository's "small" and "single".
  model::ModelConfig config;
  config.attention = {.d_model = kSmallWidth, .num_heads = kSmallHeads, .bias = true};
  std::vector<std::string> models = {kSmallModel, kSingleModel};
  for (int i = 0; i < 6; ++i) {
    const std::string name = absl::StrCat("extra", i);
    ASSERT_TRUE(model::WriteModelFolder(repository() / name, config,
                                        core::MakeRandomWeights(config.attention, 20 + i),
                                        model::WeightNaming::kSeed, model::TensorDtype::kF32)
                    .ok());
    models.push_back(name);
  }
  server::ServerOptions options = TestServerOptions();
  options.num_batch_threads = 2;
  options.runner.compute_threads = 1;  // Teams of one: no OpenMP workers share the name.
  StartServer(options);
  ASSERT_EQ(server().router().Routes().size(), 8u);
  const std::set<int> batch_threads = ThreadIdsNamed(kBatchThreadName);
  ASSERT_EQ(batch_threads.size(), 2u);

  // Every model at once: one client thread per model, 25 calls each, each noting the threads that
  // carry the batch threads' name.
  std::atomic<int> failed{0};
  std::mutex mu;  // Not absl::Mutex: ThreadSanitizer sees only what it instruments.
  std::set<int> seen;
  std::vector<std::thread> clients;
  for (const std::string& name : models) {
    clients.emplace_back([&, name] {
      const int64_t width = name == kSingleModel ? kSingleWidth : kSmallWidth;
      for (int i = 0; i < 25; ++i) {
        v1::AttendResponse response;
        if (!Attend(MakeRequest(name, 4, width, i), &response).ok()) failed.fetch_add(1);
        const std::set<int> now = ThreadIdsNamed(kBatchThreadName);
        const std::lock_guard lock(mu);
        seen.insert(now.begin(), now.end());
      }
    });
  }
  for (std::thread& client : clients) client.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(ThreadIdsNamed(kBatchThreadName), batch_threads);
  // Any other thread seen with the name was started by a batch thread for gRPC (its thread pools
  // grow from the thread that schedules work) and has named itself since; a batch thread of a
  // model, or one per batch, would still carry the name or have exited.
  for (const int tid : seen) {
    if (batch_threads.contains(tid)) continue;
    const std::optional<std::string> name = ThreadName(tid);
    ASSERT_TRUE(name.has_value()) << "thread " << tid << " carried the batch threads' name, exited";
    EXPECT_NE(*name, kBatchThreadName) << "thread " << tid;
  }
}

}  // namespace
}  // namespace attnserve::testing
