// RepositoryPoller: the background thread notices folders added, changed and removed, reports
// them through the callback, lets readers keep working meanwhile, and stops on destruction. No
// sleeps: the tests wait for callbacks on a condition with a bounded timeout.
#include "server/repository/repository_poller.h"

#include <fcntl.h>  // AT_FDCWD
#include <stdio.h>  // renameat2, RENAME_EXCHANGE

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/forward/attention_batch.h"
#include "core/forward/attention_config.h"
#include "core/forward/attention_executor.h"
#include "core/forward/attention_layer.h"
#include "core/forward/attention_weights.h"
#include "core/model/model.h"
#include "core/model/model_config.h"
#include "core/model/model_writer.h"
#include "core/model/safetensors_file.h"
#include "core/model/weight_naming.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/repository/model_repository.h"
#include "tests/server/repository/repository_test_support.h"
#include "tests/support/temp_folder.h"

namespace attnserve::repository {
namespace {

using ::attnserve::model::Model;

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// How long a test waits for the poller (polling every 5 ms) before giving up.
constexpr absl::Duration kTimeout = absl::Seconds(10);

using ::attnserve::testing::TempFolder;

using ::attnserve::testing::Compute;
using ::attnserve::testing::ExpectedOutput;
using ::attnserve::testing::kSame;
using ::attnserve::testing::MaxAbsDiff;
using ::attnserve::testing::Names;
using ::attnserve::testing::SmallConfig;
using ::attnserve::testing::WriteModel;

// Collects what the poller reports; lets the test thread wait for it.
class EventLog {
 public:
  // The poller's callback.
  RepositoryPoller::EventCallback Callback() {
    return [this](const std::vector<ModelEvent>& events, const absl::Status& scan) {
      callbacks_.fetch_add(1);
      std::lock_guard<std::mutex> lock(mu_);
      scans_.push_back(scan);
      if (events.empty()) empty_callback_ = true;
      events_.insert(events_.end(), events.begin(), events.end());
      ++batches_;
      changed_.notify_all();
    };
  }

  // Waits until an event of `kind` for `name` has been reported; false after kTimeout.
  bool WaitFor(ModelEvent::Kind kind, const std::string& name) {
    auto seen = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return std::any_of(events_.begin(), events_.end(),
                         [&](const ModelEvent& e) { return e.kind == kind && e.name == name; });
    };
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, absl::ToChronoNanoseconds(kTimeout), seen);
  }

  // Waits until more than `batches` callbacks have happened; false after `timeout`.
  bool WaitForBatchAfter(int64_t batches, absl::Duration timeout) {
    auto more = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return batches_ > batches; };
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, absl::ToChronoNanoseconds(timeout), more);
  }

  int64_t batches() const {
    std::lock_guard<std::mutex> lock(mu_);
    return batches_;
  }
  std::vector<ModelEvent> events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  bool empty_callback() const {
    std::lock_guard<std::mutex> lock(mu_);
    return empty_callback_;
  }
  // The scan status each callback carried, in order.
  std::vector<absl::Status> scans() const {
    std::lock_guard<std::mutex> lock(mu_);
    return scans_;
  }
  // Callbacks so far; readable without the lock.
  int64_t callbacks() const { return callbacks_.load(); }

 private:
  mutable std::mutex mu_;
  std::condition_variable changed_;  // Signalled when a callback has recorded its events.
  std::vector<ModelEvent> events_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> scans_ ABSL_GUARDED_BY(mu_);
  int64_t batches_ ABSL_GUARDED_BY(mu_) = 0;
  bool empty_callback_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> callbacks_{0};
};

// Swaps two paths in one step (Linux's renameat2 RENAME_EXCHANGE): a poller never sees either
// path missing, which two renames in a row would show it now and then.
std::error_code ExchangePaths(const std::filesystem::path& a, const std::filesystem::path& b) {
  if (renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) != 0) {
    return std::error_code(errno, std::generic_category());
  }
  return {};
}

class RepositoryPollerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::create_directories(root()));
    absl::StatusOr<std::unique_ptr<ModelRepository>> repo =
        ModelRepository::Open({.root = root(), .demo_model = DemoModelPolicy::kNever});
    ASSERT_TRUE(repo.ok()) << repo.status();
    repo_ = *std::move(repo);
  }

  std::filesystem::path root() const { return temp_.path() / "models"; }

  std::unique_ptr<RepositoryPoller> StartPoller(int64_t interval_ms = 5) {
    return std::make_unique<RepositoryPoller>(
        *repo_, RepositoryPollerOptions{.poll_interval_ms = interval_ms}, log_.Callback());
  }

  TempFolder temp_;
  // Declared before the repository and the poller, so it outlives the poller's thread.
  EventLog log_;
  std::unique_ptr<ModelRepository> repo_;
};

TEST_F(RepositoryPollerTest, LoadsANewFolderAndReportsIt) {
  std::unique_ptr<RepositoryPoller> poller = StartPoller();
  // Published whole (written beside the root, then renamed in). Written in place, a poll could
  // take the folder's fingerprint before config.json lands and load it after: loaded, then seen
  // changed, and reloaded by a later poll, which the last expectation would catch now and then.
  const std::filesystem::path staging = root().parent_path() / "fresh.staging";
  ASSERT_TRUE(WriteModel(staging, 1).ok());
  std::filesystem::rename(staging, root() / "fresh");
  ASSERT_TRUE(log_.WaitFor(ModelEvent::Kind::kLoaded, "fresh"));
  poller.reset();

  absl::StatusOr<std::shared_ptr<const Model>> fresh = repo_->Get("fresh");
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ((*fresh)->version, 1);
  // One event, carrying the version.
  std::vector<ModelEvent> events = log_.events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].name, "fresh");
  EXPECT_EQ(events[0].kind, ModelEvent::Kind::kLoaded) << EventKindName(events[0].kind);
  EXPECT_EQ(events[0].version, 1);
  EXPECT_TRUE(events[0].status.ok()) << events[0].status;
  // Only polls that changed something are reported.
  EXPECT_FALSE(log_.empty_callback());
  // The poller consumed every change.
  EXPECT_THAT(repo_->Poll(), IsEmpty());
}

TEST_F(RepositoryPollerTest, ReportsReloadsAndUnloads) {
  ASSERT_TRUE(WriteModel(root() / "m", 1).ok());
  ASSERT_TRUE(repo_->Reload("m").ok());
  absl::StatusOr<std::shared_ptr<const Model>> before = repo_->Get("m");
  ASSERT_TRUE(before.ok()) << before.status();
  std::unique_ptr<RepositoryPoller> poller = StartPoller();

  ASSERT_TRUE(WriteModel(root() / "m", 2).ok());
  ASSERT_TRUE(log_.WaitFor(ModelEvent::Kind::kReloaded, "m"));
  std::filesystem::remove_all(root() / "m");
  ASSERT_TRUE(log_.WaitFor(ModelEvent::Kind::kUnloaded, "m"));
  poller.reset();

  EXPECT_EQ(repo_->Get("m").status().code(), absl::StatusCode::kNotFound);
  // The holder of version 1 is undisturbed by both.
  EXPECT_EQ((*before)->version, 1);
  core::AttentionExecutor executor({.compute_threads = 1});
  absl::StatusOr<std::vector<float>> output = Compute(executor, *(*before)->layer);
  absl::StatusOr<std::vector<float>> expected = ExpectedOutput(SmallConfig(), 1);
  ASSERT_TRUE(output.ok()) << output.status();
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_LE(MaxAbsDiff(*output, *expected), kSame);
}

TEST_F(RepositoryPollerTest, DestructionStopsPolling) {
  std::unique_ptr<RepositoryPoller> poller = StartPoller();
  // Published whole (written beside the root, then renamed in): a poll between the files of a
  // folder written in place can load it and then see it change, which reloads it later.
  const std::filesystem::path staging = root().parent_path() / "first.staging";
  ASSERT_TRUE(WriteModel(staging, 1).ok());
  std::filesystem::rename(staging, root() / "first");
  ASSERT_TRUE(log_.WaitFor(ModelEvent::Kind::kLoaded, "first"));
  poller.reset();  // Returns only once the thread has stopped.
  const int64_t callbacks = log_.callbacks();

  ASSERT_TRUE(WriteModel(root() / "second", 2).ok());
  EXPECT_EQ(log_.callbacks(), callbacks);
  // Nobody polled since: the new folder is still new to the repository.
  EXPECT_EQ(repo_->Get("second").status().code(), absl::StatusCode::kNotFound);
  std::vector<ModelEvent> events = repo_->Poll();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ModelEvent::Kind::kLoaded);
  EXPECT_EQ(events[0].name, "second");
  EXPECT_EQ(log_.callbacks(), callbacks);
}

TEST_F(RepositoryPollerTest, DestructionInterruptsALongInterval) {
  // The first poll is an hour away: destruction must not wait for it, and nothing is polled.
  const absl::Time start = absl::Now();
  std::unique_ptr<RepositoryPoller> poller = StartPoller(/*interval_ms=*/3'600'000);
  ASSERT_TRUE(WriteModel(root() / "m", 1).ok());
  poller.reset();
  EXPECT_LT(absl::Now() - start, absl::Minutes(1));
  EXPECT_EQ(log_.callbacks(), 0);
  EXPECT_EQ(repo_->Get("m").status().code(), absl::StatusCode::kNotFound);
  std::vector<ModelEvent> events = repo_->Poll();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ModelEvent::Kind::kLoaded);
}

TEST_F(RepositoryPollerTest, ABrokenFolderIsReportedOnceUntilItChanges) {
  std::unique_ptr<RepositoryPoller> poller = StartPoller();
  ASSERT_TRUE(std::filesystem::create_directories(root() / "broken"));
  ASSERT_TRUE(log_.WaitFor(ModelEvent::Kind::kFailed, "broken"));
  // A later change is noticed (a batch after the failure); the failure itself was not
  // repeated in between, although the poller kept polling.
  ASSERT_TRUE(WriteModel(root() / "witness", 1).ok());
  ASSERT_TRUE(log_.WaitFor(ModelEvent::Kind::kLoaded, "witness"));
  int failures = 0;
  for (const ModelEvent& e : log_.events()) {
    if (e.name == "broken") {
      ++failures;
      EXPECT_EQ(e.kind, ModelEvent::Kind::kFailed);
      EXPECT_EQ(e.status.code(), absl::StatusCode::kNotFound) << e.status;
    }
  }
  EXPECT_EQ(failures, 1);

  // Fixed on disk: the poller loads it.
  ASSERT_TRUE(WriteModel(root() / "broken", 3).ok());
  ASSERT_TRUE(log_.WaitFor(ModelEvent::Kind::kLoaded, "broken"));
  poller.reset();
  absl::StatusOr<std::shared_ptr<const Model>> fixed = repo_->Get("broken");
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ((*fixed)->version, 1);
}

// Readers keep getting complete models, each computing what one of the written weight sets
// computes, while the poller swaps versions underneath them.
TEST_F(RepositoryPollerTest, ReadersSeeCompleteModelsWhileThePollerReloads) {
  constexpr int kSeeds = 6;
  std::vector<std::vector<float>> expected(kSeeds + 1);
  for (int seed = 1; seed <= kSeeds; ++seed) {
    absl::StatusOr<std::vector<float>> output = ExpectedOutput(SmallConfig(), seed);
    ASSERT_TRUE(output.ok()) << output.status();
    expected[seed] = *std::move(output);
  }
  ASSERT_TRUE(WriteModel(root() / "m", 1).ok());
  ASSERT_TRUE(repo_->Reload("m").ok());
  std::unique_ptr<RepositoryPoller> poller = StartPoller(/*interval_ms=*/1);

  std::atomic<bool> done{false};
  std::mutex mu;
  std::vector<std::string> errors;  // Guarded by mu.
  auto report = [&](std::string error) {
    std::lock_guard<std::mutex> lock(mu);
    if (errors.size() < 10) errors.push_back(std::move(error));
  };
  // The seed whose weights `m` computes with, or 0.
  auto seed_of = [&](const Model& m, core::AttentionExecutor& executor) {
    absl::StatusOr<std::vector<float>> output = Compute(executor, *m.layer);
    if (!output.ok()) return 0;
    for (int seed = 1; seed <= kSeeds; ++seed) {
      if (MaxAbsDiff(*output, expected[seed]) <= kSame) return seed;
    }
    return 0;
  };

  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      core::AttentionExecutor executor({.compute_threads = 1});
      for (int i = 0; i < 5 || !done.load(); ++i) {
        absl::StatusOr<std::shared_ptr<const Model>> m = repo_->Get("m");
        if (!m.ok()) {
          report(m.status().ToString());
          return;
        }
        if (seed_of(**m, executor) == 0) {
          report(absl::StrCat("version ", (*m)->version, " computes none of the weights"));
        }
      }
    });
  }

  // Writes each seed's weights, then waits (on the poller's callbacks) until they serve. No
  // ASSERTs until the readers are joined.
  core::AttentionExecutor executor({.compute_threads = 1});
  for (int seed = 2; seed <= kSeeds && !done.load(); ++seed) {
    if (absl::Status s = WriteModel(root() / "m", seed); !s.ok()) {
      report(s.ToString());
      break;
    }
    const absl::Time deadline = absl::Now() + kTimeout;
    while (true) {
      const int64_t batches = log_.batches();
      absl::StatusOr<std::shared_ptr<const Model>> m = repo_->Get("m");
      if (m.ok() && seed_of(**m, executor) == seed) break;
      if (!log_.WaitForBatchAfter(batches, deadline - absl::Now())) {
        report(absl::StrCat("seed ", seed, " never served"));
        done.store(true);
        break;
      }
    }
  }
  done.store(true);
  for (std::thread& t : readers) t.join();
  poller.reset();

  std::lock_guard<std::mutex> lock(mu);
  EXPECT_THAT(errors, IsEmpty());
  for (const ModelEvent& e : log_.events()) {
    EXPECT_EQ(e.name, "m");
    // WriteModel replaces the weights, then config.json with their digest: a poll between the
    // two renames sees new weights under the old digest and fails (docs/MODELS.md, "Integrity").
    // Nothing else may fail.
    if (e.kind == ModelEvent::Kind::kFailed) {
      EXPECT_EQ(e.status.code(), absl::StatusCode::kDataLoss) << e.status;
      EXPECT_GE(e.version, 1) << "a version keeps serving";
      continue;
    }
    EXPECT_EQ(e.kind, ModelEvent::Kind::kReloaded) << EventKindName(e.kind) << " " << e.status;
  }
  absl::StatusOr<std::shared_ptr<const Model>> last = repo_->Get("m");
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_GE((*last)->version, kSeeds);
}

// The repository folder replaced by a file: the poller reports the scan failure once (no event,
// no crash), every model keeps serving, and the recovery is reported when the folder is back.
TEST_F(RepositoryPollerTest, AnUnreadableRootIsReportedOnceAndModelsKeepServing) {
  ASSERT_TRUE(WriteModel(root() / "m", 1).ok());
  ASSERT_EQ(repo_->Poll().size(), 1u);
  auto poller = StartPoller();
  // The root becomes a file in one step: the only failure the poller can see is "not a folder".
  const std::filesystem::path file = temp_.path() / "not_a_folder";
  std::ofstream(file) << "not a folder";
  ASSERT_FALSE(ExchangePaths(root(), file)) << "renameat2 " << root();
  ASSERT_TRUE(log_.WaitForBatchAfter(0, kTimeout));
  std::vector<absl::Status> scans = log_.scans();
  ASSERT_EQ(scans.size(), 1u);
  EXPECT_EQ(scans[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(scans[0].message()), HasSubstr(root().string()));
  EXPECT_THAT(log_.events(), IsEmpty());
  EXPECT_THAT(Names(repo_->ServingModels()), ElementsAre("m"));

  // Several more polls of the same failure report nothing new.
  const int64_t before = log_.batches();
  EXPECT_FALSE(log_.WaitForBatchAfter(before, absl::Milliseconds(100)));

  ASSERT_FALSE(ExchangePaths(root(), file)) << "renameat2 " << root();
  ASSERT_TRUE(log_.WaitForBatchAfter(before, kTimeout));
  scans = log_.scans();
  ASSERT_EQ(scans.size(), 2u);
  EXPECT_TRUE(scans[1].ok()) << scans[1];
  EXPECT_THAT(log_.events(), IsEmpty());
  EXPECT_TRUE(repo_->scan_status().ok());
  EXPECT_THAT(Names(repo_->ServingModels()), ElementsAre("m"));
}

}  // namespace
}  // namespace attnserve::repository
