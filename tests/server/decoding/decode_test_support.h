// Helpers of the decoding runtime tests: small models (with the weights the references need),
// a step's answer to wait for, and a listener that records iterations and closes.
#ifndef ATTNSERVE_TESTS_SERVER_DECODING_DECODE_TEST_SUPPORT_H_
#define ATTNSERVE_TESTS_SERVER_DECODING_DECODE_TEST_SUPPORT_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/model/model.h"
#include "core/util/notification.h"
#include "gtest/gtest.h"
#include "server/decoding/decode_runtime.h"
#include "tests/core/attention_test_support.h"

namespace attnserve::testing {

inline constexpr int64_t kD = 32;
inline constexpr int64_t kHeads = 4;
inline constexpr absl::Duration kWait = absl::Seconds(60);
inline constexpr double kExact = 1e-5;

// A model version and the weights it was made from (for the double reference).
struct TestModel {
  std::shared_ptr<const model::Model> model;
  core::AttentionConfig config;
  core::AttentionWeights weights;
};

inline TestModel MakeModel(const std::string& name, int64_t version, uint64_t seed) {
  TestModel out;
  out.config = {.d_model = kD, .num_heads = kHeads, .bias = true};
  TestLayer layer = MakeTestLayer(out.config, seed);
  auto m = std::make_shared<model::Model>();
  m->name = name;
  m->version = version;
  m->config.attention = out.config;
  m->layer = layer.layer;
  out.model = std::move(m);
  out.weights = std::move(layer.weights);
  return out;
}

// One step's answer.
struct Answer {
  Notification notified;
  std::optional<absl::StatusOr<std::vector<float>>> result;

  decoding::StepCallback Callback() {
    return [this](absl::StatusOr<std::vector<float>> r) {
      result = std::move(r);
      notified.Notify();
    };
  }
  // Waits (bounded) and returns the answer; a timeout fails the test.
  const absl::StatusOr<std::vector<float>>& Get() {
    const bool done = notified.WaitForNotificationWithTimeout(kWait);
    EXPECT_TRUE(done) << "no answer";
    if (!done) result = absl::DeadlineExceededError("test: no answer");
    return *result;
  }
};

inline absl::Status Append(decoding::DecodeRuntime& runtime, decoding::SessionId id,
                           std::vector<float> rows, Answer* answer) {
  decoding::StepRequest request{.session = id, .rows = std::move(rows), .done = answer->Callback()};
  return runtime.Append(&request);
}

// Opens a session and waits until it is ready.
inline decoding::SessionId OpenReady(decoding::DecodeRuntime& runtime,
                                     std::shared_ptr<const model::Model> model,
                                     decoding::OwnerKey owner = 0, std::vector<float> memory = {}) {
  auto ready = std::make_shared<Notification>();
  auto status = std::make_shared<absl::Status>();
  absl::StatusOr<decoding::SessionId> id =
      runtime.Open({.model = std::move(model), .owner = owner, .memory = std::move(memory)},
                   [ready, status](absl::Status s) {
                     *status = std::move(s);
                     ready->Notify();
                   });
  EXPECT_TRUE(id.ok()) << id.status();
  if (!id.ok()) return 0;
  EXPECT_TRUE(ready->WaitForNotificationWithTimeout(kWait));
  EXPECT_TRUE(status->ok()) << *status;
  return *id;
}

// Rows [first, first + count) of x ([rows, kD]).
inline std::vector<float> Rows(const std::vector<float>& x, int64_t first, int64_t count) {
  return {x.begin() + first * kD, x.begin() + (first + count) * kD};
}

// Records what the runtime reports.
class RecordingListener : public decoding::DecodeListener {
 public:
  void OnIteration(const decoding::IterationReport& report) override {
    std::lock_guard<std::mutex> lock(mu_);
    iterations_.push_back(report);
  }
  void OnSessionClosed(decoding::SessionId id, decoding::CloseReason reason) override {
    std::lock_guard<std::mutex> lock(mu_);
    closed_.emplace_back(id, reason);
    changed_.notify_all();
  }
  // Waits (bounded) until n sessions were closed; false on timeout.
  bool WaitForClosed(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, std::chrono::seconds(60), [&] { return closed_.size() >= n; });
  }
  std::vector<decoding::IterationReport> iterations() {
    std::lock_guard<std::mutex> lock(mu_);
    return iterations_;
  }
  std::vector<std::pair<decoding::SessionId, decoding::CloseReason>> closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<decoding::IterationReport> iterations_;
  std::vector<std::pair<decoding::SessionId, decoding::CloseReason>> closed_;
};

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_SERVER_DECODING_DECODE_TEST_SUPPORT_H_
