// ModelRepository::Poll: new folders load, changed ones reload (size, mtime or inode), removed ones
// unload, failures are retried only after a change; and readers see complete versions while
// another thread reloads.
#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/forward/attention_executor.h"
#include "core/model/model.h"
#include "core/model/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/repository/model_repository.h"
#include "tests/server/repository/repository_test_support.h"

namespace attnserve::repository {
namespace {

using ::attnserve::model::kConfigFileName;
using ::attnserve::model::kWeightsFileName;
using ::attnserve::model::Model;
using ::attnserve::model::ModelConfig;
using ::attnserve::model::ModelConfigToJson;

using ::attnserve::testing::Compute;
using ::attnserve::testing::Describe;
using ::attnserve::testing::ExpectedOutput;
using ::attnserve::testing::kSame;
using ::attnserve::testing::MaxAbsDiff;
using ::attnserve::testing::Names;
using ::attnserve::testing::RemoveWeightsSha256;
using ::attnserve::testing::SmallConfig;
using ::attnserve::testing::WriteModel;
using ::attnserve::testing::WriteTextFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

using ModelRepositoryTest = ::attnserve::testing::RepositoryTest;

// ---------------------------------------------------------------------------------------------
// Poll

TEST_F(ModelRepositoryTest, PollWithoutChangesReportsNothing) {
  ASSERT_TRUE(WriteModel(root() / "a", 1).ok());
  ASSERT_TRUE(WriteModel(root() / "b", 2).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  absl::StatusOr<std::shared_ptr<const Model>> a = repo->Get("a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(repo->Poll(), IsEmpty());
  EXPECT_THAT(repo->Poll(), IsEmpty());
  absl::StatusOr<std::shared_ptr<const Model>> again = repo->Get("a");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *a);
}

TEST_F(ModelRepositoryTest, PollLoadsANewFolder) {
  ASSERT_TRUE(std::filesystem::create_directories(root()));
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  ASSERT_TRUE(WriteModel(root() / "fresh", 1).ok());
  const std::vector<ModelEvent> events = repo->Poll();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ModelEvent::Kind::kLoaded);
  EXPECT_EQ(events[0].name, "fresh");
  EXPECT_EQ(events[0].version, 1);
  EXPECT_TRUE(events[0].status.ok()) << events[0].status;
  absl::StatusOr<std::shared_ptr<const Model>> fresh = repo->Get("fresh");
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ((*fresh)->version, 1);
  EXPECT_THAT(repo->Poll(), IsEmpty());
}

TEST_F(ModelRepositoryTest, PollReloadsAChangedFolderWithoutDisturbingHolders) {
  const ModelConfig config = SmallConfig();
  ASSERT_TRUE(WriteModel(root() / "m", 1, config).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  absl::StatusOr<std::shared_ptr<const Model>> before = repo->Get("m");
  ASSERT_TRUE(before.ok()) << before.status();

  ASSERT_TRUE(WriteModel(root() / "m", 2, config).ok());
  std::vector<ModelEvent> events = repo->Poll();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ModelEvent::Kind::kReloaded);
  EXPECT_EQ(events[0].name, "m");
  EXPECT_EQ(events[0].version, 2);
  EXPECT_TRUE(events[0].status.ok()) << events[0].status;
  EXPECT_THAT(repo->Poll(), IsEmpty());

  absl::StatusOr<std::shared_ptr<const Model>> after = repo->Get("m");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ((*after)->version, 2);
  absl::StatusOr<std::vector<float>> old_output = Compute(*(*before)->layer);
  absl::StatusOr<std::vector<float>> new_output = Compute(*(*after)->layer);
  absl::StatusOr<std::vector<float>> old_expected = ExpectedOutput(config, 1);
  absl::StatusOr<std::vector<float>> new_expected = ExpectedOutput(config, 2);
  ASSERT_TRUE(old_output.ok() && new_output.ok() && old_expected.ok() && new_expected.ok());
  EXPECT_LE(MaxAbsDiff(*old_output, *old_expected), kSame);
  EXPECT_LE(MaxAbsDiff(*new_output, *new_expected), kSame);

  // Only config.json changing is a change too.
  ModelConfig longer = config;
  longer.max_sequence_length = 128;
  WriteTextFile(root() / "m" / kConfigFileName, ModelConfigToJson(longer));
  events = repo->Poll();
  EXPECT_THAT(Describe(events), ElementsAre("m reloaded v3"));
  after = repo->Get("m");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ((*after)->config.max_sequence_length, 128);
}

TEST_F(ModelRepositoryTest, PollNoticesAFileReplacedWithTheSameContents) {
  ASSERT_TRUE(WriteModel(root() / "m", 1).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  // Same bytes, but new files (new inodes): a replacement, hence a reload.
  ASSERT_TRUE(WriteModel(root() / "m", 1).ok());
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("m reloaded v2"));
}

TEST_F(ModelRepositoryTest, PollNoticesAPermissionChange) {
  // A chmod changes only the status-change time: the fix for an unreadable file must be seen.
  ASSERT_TRUE(WriteModel(root() / "m", 1).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  const std::filesystem::path weights = root() / "m" / kWeightsFileName;
  struct stat before {};
  ASSERT_EQ(stat(weights.c_str(), &before), 0);
  // The kernel stamps ctime from a coarse clock (a few ms): chmod until the stamp moves on, as it
  // would for a fix made by hand (bounded; no sleeping).
  struct stat after = before;
  for (int i = 0; i < 1'000'000 && after.st_ctim.tv_sec == before.st_ctim.tv_sec &&
                  after.st_ctim.tv_nsec == before.st_ctim.tv_nsec;
       ++i) {
    std::filesystem::permissions(
        weights,
        i % 2 == 0 ? std::filesystem::perms::owner_read
                   : std::filesystem::perms::owner_read | std::filesystem::perms::owner_write,
        std::filesystem::perm_options::replace);
    ASSERT_EQ(stat(weights.c_str(), &after), 0);
  }
  ASSERT_NE(after.st_ctim.tv_nsec, before.st_ctim.tv_nsec) << "the ctime clock never ticked";
  ASSERT_EQ(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
  ASSERT_EQ(after.st_ino, before.st_ino);
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("m reloaded v2"));
}

TEST_F(ModelRepositoryTest, PollNoticesANewInodeWithTheSameSizeAndModificationTime) {
  const ModelConfig config = SmallConfig();
  ASSERT_TRUE(WriteModel(root() / "m", 1, config).ok());
  // Unverified weights: under config.json's checksum the swapped-in file would (rightly) fail to
  // load; what is tested here is that the poll notices it at all.
  RemoveWeightsSha256(root() / "m");
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  const std::filesystem::path weights = root() / "m" / kWeightsFileName;
  struct stat old_stat {};
  ASSERT_EQ(stat(weights.c_str(), &old_stat), 0);

  // Other weights of the same size moved in (config.json untouched) and given the old file's
  // modification time: only the inode tells the files apart.
  ASSERT_TRUE(WriteModel(root() / ".staging", 2, config).ok());
  std::error_code ec;
  std::filesystem::rename(root() / ".staging" / kWeightsFileName, weights, ec);
  ASSERT_FALSE(ec) << ec.message();
  const struct timespec times[2] = {old_stat.st_atim, old_stat.st_mtim};
  ASSERT_EQ(utimensat(AT_FDCWD, weights.c_str(), times, 0), 0);
  struct stat new_stat {};
  ASSERT_EQ(stat(weights.c_str(), &new_stat), 0);
  ASSERT_EQ(new_stat.st_size, old_stat.st_size);
  ASSERT_EQ(new_stat.st_mtim.tv_sec, old_stat.st_mtim.tv_sec);
  ASSERT_EQ(new_stat.st_mtim.tv_nsec, old_stat.st_mtim.tv_nsec);
  ASSERT_NE(new_stat.st_ino, old_stat.st_ino);

  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("m reloaded v2"));
  absl::StatusOr<std::shared_ptr<const Model>> m = repo->Get("m");
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<std::vector<float>> output = Compute(*(*m)->layer);
  absl::StatusOr<std::vector<float>> expected = ExpectedOutput(config, 2);
  ASSERT_TRUE(output.ok() && expected.ok());
  EXPECT_LE(MaxAbsDiff(*output, *expected), kSame);
}

TEST_F(ModelRepositoryTest, PollUnloadsARemovedFolder) {
  const ModelConfig config = SmallConfig();
  ASSERT_TRUE(WriteModel(root() / "gone", 1, config).ok());
  ASSERT_TRUE(WriteModel(root() / "stays", 2, config).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  absl::StatusOr<std::shared_ptr<const Model>> held = repo->Get("gone");
  ASSERT_TRUE(held.ok()) << held.status();

  std::filesystem::remove_all(root() / "gone");
  const std::vector<ModelEvent> events = repo->Poll();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ModelEvent::Kind::kUnloaded);
  EXPECT_EQ(events[0].name, "gone");
  EXPECT_EQ(events[0].version, 0);
  EXPECT_TRUE(events[0].status.ok());

  absl::StatusOr<std::shared_ptr<const Model>> gone = repo->Get("gone");
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(gone.status().message(), HasSubstr("serving: stays"));
  EXPECT_THAT(Names(repo->States()), ElementsAre("stays"));
  EXPECT_THAT(repo->Poll(), IsEmpty());

  // Work in flight keeps computing with the unloaded model.
  absl::StatusOr<std::vector<float>> output = Compute(*(*held)->layer);
  absl::StatusOr<std::vector<float>> expected = ExpectedOutput(config, 1);
  ASSERT_TRUE(output.ok() && expected.ok());
  EXPECT_LE(MaxAbsDiff(*output, *expected), kSame);

  // Coming back is a new load, but not version 1 again: clients saw 1 with other weights.
  ASSERT_TRUE(WriteModel(root() / "gone", 3, config).ok());
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("gone loaded v2"));
}

TEST_F(ModelRepositoryTest, PollUnloadsAFailedModelWhoseFolderIsRemoved) {
  ASSERT_TRUE(std::filesystem::create_directories(root() / "broken"));
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  EXPECT_THAT(Names(repo->States()), ElementsAre("broken"));
  std::filesystem::remove_all(root() / "broken");
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("broken unloaded v0"));
  EXPECT_THAT(repo->States(), IsEmpty());
}

TEST_F(ModelRepositoryTest, BrokenNewFolderFailsOnceAndIsRetriedOnlyAfterAChange) {
  ASSERT_TRUE(std::filesystem::create_directories(root()));
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);

  // Valid weights, but a config.json with an unknown key.
  ASSERT_TRUE(WriteModel(root() / "bad", 1).ok());
  WriteTextFile(root() / "bad" / kConfigFileName,
                R"({"d_model": 16, "num_heads": 2, "bias": true, "flavour": 1})");
  std::vector<ModelEvent> events = repo->Poll();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ModelEvent::Kind::kFailed);
  EXPECT_EQ(events[0].name, "bad");
  EXPECT_EQ(events[0].version, 0);
  EXPECT_EQ(events[0].status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(events[0].status.message(), HasSubstr("flavour"));
  absl::StatusOr<std::shared_ptr<const Model>> bad = repo->Get("bad");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(bad.status().message(), HasSubstr("flavour"));

  // Unchanged: not retried, no event, same error.
  EXPECT_THAT(repo->Poll(), IsEmpty());
  EXPECT_THAT(repo->Poll(), IsEmpty());
  ASSERT_EQ(repo->States().size(), 1u);
  EXPECT_EQ(repo->States()[0].last_error, events[0].status);

  // Still broken after a change: a second failure, then quiet again.
  WriteTextFile(root() / "bad" / kConfigFileName, R"({"d_model": 16})");
  events = repo->Poll();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ModelEvent::Kind::kFailed);
  EXPECT_THAT(events[0].status.message(), HasSubstr("num_heads"));
  EXPECT_THAT(repo->Poll(), IsEmpty());

  // Fixed: loaded as version 1, error cleared.
  ASSERT_TRUE(WriteModel(root() / "bad", 1).ok());
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("bad loaded v1"));
  EXPECT_TRUE(repo->Get("bad").ok());
  EXPECT_TRUE(repo->States()[0].last_error.ok());
  EXPECT_THAT(repo->Poll(), IsEmpty());
}

TEST_F(ModelRepositoryTest, FailedPollReloadKeepsTheOldVersionServing) {
  ASSERT_TRUE(WriteModel(root() / "m", 1).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  absl::StatusOr<std::shared_ptr<const Model>> before = repo->Get("m");
  ASSERT_TRUE(before.ok()) << before.status();

  WriteTextFile(root() / "m" / kWeightsFileName, "garbage");
  std::vector<ModelEvent> events = repo->Poll();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ModelEvent::Kind::kFailed);
  EXPECT_EQ(events[0].version, 1);  // Version 1 still serves.
  EXPECT_THAT(events[0].status.message(), HasSubstr(kWeightsFileName));
  absl::StatusOr<std::shared_ptr<const Model>> still = repo->Get("m");
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(*still, *before);
  EXPECT_EQ(repo->States()[0].last_error, events[0].status);
  EXPECT_THAT(repo->Poll(), IsEmpty());

  ASSERT_TRUE(WriteModel(root() / "m", 2).ok());
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("m reloaded v2"));
  EXPECT_TRUE(repo->States()[0].last_error.ok());
}

TEST_F(ModelRepositoryTest, PollEventsAreSortedByName) {
  ASSERT_TRUE(WriteModel(root() / "b", 1).ok());
  ASSERT_TRUE(WriteModel(root() / "d", 1).ok());
  ASSERT_TRUE(WriteModel(root() / "f", 1).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);

  ASSERT_TRUE(WriteModel(root() / "e", 1).ok());
  ASSERT_TRUE(WriteModel(root() / "a", 1).ok());
  ASSERT_TRUE(WriteModel(root() / "d", 2).ok());
  std::filesystem::remove_all(root() / "b");
  ASSERT_TRUE(std::filesystem::create_directories(root() / "c"));  // Empty: fails.
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("a loaded v1", "b unloaded v0", "c failed v0",
                                                  "d reloaded v2", "e loaded v1"));
  EXPECT_THAT(Names(repo->ServingModels()), ElementsAre("a", "d", "e", "f"));
}

TEST_F(ModelRepositoryTest, PollAfterTheRootIsRemovedUnloadsEverything) {
  ASSERT_TRUE(WriteModel(root() / "a", 1).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository(DemoModelPolicy::kAlways);
  ASSERT_NE(repo, nullptr);
  std::filesystem::remove_all(root());
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("a unloaded v0"));
  // The embedded demo model has no folder to lose.
  EXPECT_THAT(Names(repo->ServingModels()), ElementsAre("demo"));
}

// A root that exists but cannot be examined is an error, not an empty repository: a transient
// failure (here a symlink loop; in production EACCES or EIO) must not unload every model.
TEST_F(ModelRepositoryTest, PollOfARootThatCannotBeExaminedKeepsEveryModel) {
  ASSERT_TRUE(WriteModel(root() / "a", 1).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  std::filesystem::rename(root(), temp_.path() / "moved");
  std::filesystem::create_symlink(root(), root());  // models -> models: ELOOP.
  // No event: no model changed, and none is named "" (which once crashed the server's metrics).
  EXPECT_THAT(repo->Poll(), IsEmpty());
  const absl::Status scan = repo->scan_status();
  EXPECT_EQ(scan.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(scan.message()), HasSubstr("model repository " + root().string() + ": "));
  EXPECT_THAT(Names(repo->ServingModels()), ElementsAre("a"));
  // Readable again: the scan status clears.
  std::filesystem::remove(root());
  std::filesystem::rename(temp_.path() / "moved", root());
  EXPECT_THAT(repo->Poll(), IsEmpty());
  EXPECT_TRUE(repo->scan_status().ok()) << repo->scan_status();
}

// ---------------------------------------------------------------------------------------------
// Versions: a name's count continues for the life of the repository, so no number a client saw
// ever names other weights.

TEST_F(ModelRepositoryTest, ARemovedAndRestoredModelContinuesItsVersions) {
  const ModelConfig config = SmallConfig();
  ASSERT_TRUE(WriteModel(root() / "m", 1, config).ok());
  ASSERT_TRUE(WriteModel(root() / "stays", 1, config).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  ASSERT_TRUE(WriteModel(root() / "m", 2, config).ok());
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("m reloaded v2"));

  // Removed: gone.
  std::filesystem::remove_all(root() / "m");
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("m unloaded v0"));
  EXPECT_EQ(repo->Get("m").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Names(repo->States()), ElementsAre("stays"));

  // Restored: the next number, with the restored weights.
  ASSERT_TRUE(WriteModel(root() / "m", 3, config).ok());
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("m loaded v3"));
  absl::StatusOr<std::shared_ptr<const Model>> m = repo->Get("m");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->version, 3);
  absl::StatusOr<std::vector<float>> output = Compute(*(*m)->layer);
  absl::StatusOr<std::vector<float>> expected = ExpectedOutput(config, 3);
  ASSERT_TRUE(output.ok() && expected.ok());
  EXPECT_LE(MaxAbsDiff(*output, *expected), kSame);
  // Other names keep their own count.
  EXPECT_EQ((*repo->Get("stays"))->version, 1);

  // And again, through Reload as well as Poll.
  std::filesystem::remove_all(root() / "m");
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("m unloaded v0"));
  ASSERT_TRUE(WriteModel(root() / "m", 4, config).ok());
  ASSERT_TRUE(repo->Reload("m").ok());
  EXPECT_EQ((*repo->Get("m"))->version, 4);
  EXPECT_THAT(repo->Poll(), IsEmpty());
}

TEST_F(ModelRepositoryTest, AFolderReplacedBetweenPollsContinuesItsVersions) {
  const ModelConfig config = SmallConfig();
  ASSERT_TRUE(WriteModel(root() / "m", 1, config).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  // A whole new folder renamed into place (as a deployment swaps directories).
  ASSERT_TRUE(WriteModel(root() / ".next", 2, config).ok());
  std::filesystem::rename(root() / "m", root() / ".old");
  std::filesystem::rename(root() / ".next", root() / "m");
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("m reloaded v2"));
}

TEST_F(ModelRepositoryTest, FailedLoadsOfARestoredModelUseNoVersion) {
  ASSERT_TRUE(WriteModel(root() / "m", 1).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  std::filesystem::remove_all(root() / "m");
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("m unloaded v0"));
  // Restored broken (an empty folder): a failure with nothing serving, then fixed.
  ASSERT_TRUE(std::filesystem::create_directories(root() / "m"));
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("m failed v0"));
  EXPECT_EQ(repo->Get("m").status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(WriteModel(root() / "m", 2).ok());
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("m loaded v2"));
}

// The embedded demo model and a "demo" folder share the name, hence one count.
TEST_F(ModelRepositoryTest, TheEmbeddedDemoAndADemoFolderShareOneCount) {
  ASSERT_TRUE(std::filesystem::create_directories(root()));
  std::unique_ptr<ModelRepository> repo = OpenRepository(DemoModelPolicy::kAlways);
  ASSERT_NE(repo, nullptr);
  absl::StatusOr<std::shared_ptr<const Model>> demo = repo->Get("demo");
  ASSERT_TRUE(demo.ok()) << demo.status();
  EXPECT_EQ((*demo)->source, "embedded");
  EXPECT_EQ((*demo)->version, 1);

  ASSERT_TRUE(WriteModel(root() / "demo", 7, SmallConfig(32, 4)).ok());
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("demo reloaded v2"));
  EXPECT_EQ((*repo->Get("demo"))->source, (root() / "demo").string());

  std::filesystem::remove_all(root() / "demo");
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("demo reloaded v3"));
  demo = repo->Get("demo");
  ASSERT_TRUE(demo.ok()) << demo.status();
  EXPECT_EQ((*demo)->source, "embedded");
  EXPECT_EQ((*demo)->version, 3);
  // The same packed layer as the embedded model's first version: only the number is new.
  EXPECT_EQ((*demo)->layer, (*model::DemoModel())->layer);

  ASSERT_TRUE(WriteModel(root() / "demo", 8, SmallConfig(32, 4)).ok());
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("demo reloaded v4"));
}

// ---------------------------------------------------------------------------------------------
// Concurrency

// Readers call Get() and run the model while another thread reloads it repeatedly with new
// weights (version v has the weights of seed v). Every model a reader gets must be complete and
// compute exactly what its version's weights compute.
TEST_F(ModelRepositoryTest, ReadersSeeCompleteVersionsDuringReloads) {
  constexpr int kReloads = 20;
  constexpr int kReaders = 3;
  const ModelConfig config = SmallConfig(32, 4);
  std::vector<std::vector<float>> expected(kReloads + 2);  // Indexed by version = seed.
  for (int seed = 1; seed <= kReloads + 1; ++seed) {
    absl::StatusOr<std::vector<float>> output = ExpectedOutput(config, seed);
    ASSERT_TRUE(output.ok()) << output.status();
    expected[seed] = *std::move(output);
  }
  ASSERT_TRUE(WriteModel(root() / "m", 1, config).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);

  std::atomic<bool> done{false};
  std::mutex mu;
  std::vector<std::string> errors;  // Guarded by mu; the first few problems readers saw.
  std::atomic<int64_t> reads{0};
  auto report = [&](std::string error) {
    std::lock_guard<std::mutex> lock(mu);
    if (errors.size() < 10) errors.push_back(std::move(error));
  };

  std::vector<std::thread> readers;
  for (int r = 0; r < kReaders; ++r) {
    readers.emplace_back([&] {
      core::AttentionExecutor executor({.compute_threads = 1});
      int64_t last_version = 0;
      // At least a few reads each, then until the reloads are done.
      for (int i = 0; i < 5 || !done.load(); ++i) {
        absl::StatusOr<std::shared_ptr<const Model>> m = repo->Get("m");
        if (!m.ok()) {
          report(m.status().ToString());
          return;
        }
        const int64_t version = (*m)->version;
        if (version < 1 || version > kReloads + 1 || (*m)->layer == nullptr || (*m)->name != "m") {
          report(absl::StrCat("incomplete model, version ", version));
          return;
        }
        if (version < last_version) {
          report(absl::StrCat("version went back from ", last_version, " to ", version));
        }
        last_version = version;
        absl::StatusOr<std::vector<float>> output = Compute(executor, *(*m)->layer);
        if (!output.ok()) {
          report(output.status().ToString());
          return;
        }
        if (MaxAbsDiff(*output, expected[version]) > kSame) {
          report(absl::StrCat("version ", version, " computes something else"));
        }
        reads.fetch_add(1);
      }
    });
  }
  std::thread states_reader([&] {
    while (!done.load()) {
      for (const ModelState& state : repo->States()) {
        if (state.serving == nullptr || !state.last_error.ok()) report("bad state");
      }
      if (repo->ServingModels().size() != 1) report("ServingModels() is not {m}");
    }
  });

  std::thread reloader([&] {
    for (int seed = 2; seed <= kReloads + 1; ++seed) {
      absl::Status status = WriteModel(root() / "m", seed, config);
      if (status.ok()) status = repo->Reload("m");
      if (!status.ok()) report(absl::StrCat("reload ", seed, ": ", status.ToString()));
    }
    done.store(true);
  });
  reloader.join();
  for (std::thread& t : readers) t.join();
  states_reader.join();

  std::lock_guard<std::mutex> lock(mu);
  EXPECT_THAT(errors, IsEmpty());
  EXPECT_GE(reads.load(), kReaders * 5);
  absl::StatusOr<std::shared_ptr<const Model>> final_model = repo->Get("m");
  ASSERT_TRUE(final_model.ok()) << final_model.status();
  EXPECT_EQ((*final_model)->version, kReloads + 1);
  absl::StatusOr<std::vector<float>> output = Compute(*(*final_model)->layer);
  ASSERT_TRUE(output.ok()) << output.status();
  EXPECT_LE(MaxAbsDiff(*output, expected[kReloads + 1]), kSame);
}

}  // namespace
}  // namespace attnserve::repository
