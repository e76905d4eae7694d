// ModelRepository::Reload: atomic swaps (holders keep the version they have), versions, failed
// reloads that keep the old version serving, and refused names. What a model computes is checked
// by running it and comparing with a layer built directly from the same weights.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
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
using ::attnserve::model::LoadModelFolder;
using ::attnserve::model::Model;
using ::attnserve::model::ModelConfig;

using ::attnserve::testing::Compute;
using ::attnserve::testing::ExpectedOutput;
using ::attnserve::testing::kDifferent;
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
// Reload

TEST_F(ModelRepositoryTest, ReloadSwapsInTheNewWeightsAndKeepsTheOldVersionAlive) {
  const ModelConfig config = SmallConfig();
  ASSERT_TRUE(WriteModel(root() / "m", 1, config).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  absl::StatusOr<std::shared_ptr<const Model>> before = repo->Get("m");
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ((*before)->version, 1);
  absl::StatusOr<std::vector<float>> old_expected = ExpectedOutput(config, 1);
  absl::StatusOr<std::vector<float>> new_expected = ExpectedOutput(config, 2);
  ASSERT_TRUE(old_expected.ok()) << old_expected.status();
  ASSERT_TRUE(new_expected.ok()) << new_expected.status();
  ASSERT_GT(MaxAbsDiff(*old_expected, *new_expected), kDifferent);

  ASSERT_TRUE(WriteModel(root() / "m", 2, config).ok());
  ASSERT_TRUE(repo->Reload("m").ok());
  absl::StatusOr<std::shared_ptr<const Model>> after = repo->Get("m");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ((*after)->version, 2);
  EXPECT_EQ((*after)->name, "m");
  EXPECT_NE(*after, *before);
  EXPECT_EQ((*before)->version, 1);  // The old model object is untouched.

  // Both versions are usable at once, from the same executor.
  core::AttentionExecutor executor({.compute_threads = 1});
  absl::StatusOr<std::vector<float>> old_output = Compute(executor, *(*before)->layer);
  absl::StatusOr<std::vector<float>> new_output = Compute(executor, *(*after)->layer);
  ASSERT_TRUE(old_output.ok()) << old_output.status();
  ASSERT_TRUE(new_output.ok()) << new_output.status();
  EXPECT_LE(MaxAbsDiff(*old_output, *old_expected), kSame);
  EXPECT_LE(MaxAbsDiff(*new_output, *new_expected), kSame);
  EXPECT_GT(MaxAbsDiff(*old_output, *new_output), kDifferent);

  // The same as a fresh load of the folder.
  absl::StatusOr<std::shared_ptr<const Model>> fresh = LoadModelFolder(root() / "m");
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  absl::StatusOr<std::vector<float>> fresh_output = Compute(executor, *(*fresh)->layer);
  ASSERT_TRUE(fresh_output.ok()) << fresh_output.status();
  EXPECT_LE(MaxAbsDiff(*fresh_output, *new_output), kSame);

  // Dropping the repository's reference does not disturb the holder of the old one.
  repo.reset();
  old_output = Compute(executor, *(*before)->layer);
  ASSERT_TRUE(old_output.ok()) << old_output.status();
  EXPECT_LE(MaxAbsDiff(*old_output, *old_expected), kSame);
}

TEST_F(ModelRepositoryTest, EveryReloadGetsTheNextVersion) {
  ASSERT_TRUE(WriteModel(root() / "m", 1).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  for (int64_t version = 2; version <= 4; ++version) {
    // Unchanged files reload too: Reload is explicit.
    ASSERT_TRUE(repo->Reload("m").ok());
    absl::StatusOr<std::shared_ptr<const Model>> m = repo->Get("m");
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->version, version);
  }
}

TEST_F(ModelRepositoryTest, ReloadOfANewFolderLoadsIt) {
  ASSERT_TRUE(std::filesystem::create_directories(root()));
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  ASSERT_TRUE(WriteModel(root() / "late", 1).ok());
  ASSERT_TRUE(repo->Reload("late").ok());
  absl::StatusOr<std::shared_ptr<const Model>> late = repo->Get("late");
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ((*late)->version, 1);
  // Already loaded: the next poll has nothing to do.
  EXPECT_THAT(repo->Poll(), IsEmpty());
}

TEST_F(ModelRepositoryTest, FailedReloadOfCorruptWeightsKeepsTheOldVersionServing) {
  ASSERT_TRUE(WriteModel(root() / "m", 1).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  absl::StatusOr<std::shared_ptr<const Model>> before = repo->Get("m");
  ASSERT_TRUE(before.ok()) << before.status();

  WriteTextFile(root() / "m" / kWeightsFileName, "definitely not a safetensors file");
  const absl::Status status = repo->Reload("m");
  // config.json's digest (WriteModel records it) refuses the file before it is parsed.
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr(kWeightsFileName));

  absl::StatusOr<std::shared_ptr<const Model>> still = repo->Get("m");
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(*still, *before);
  EXPECT_EQ((*still)->version, 1);
  const std::vector<ModelState> states = repo->States();
  ASSERT_EQ(states.size(), 1u);
  EXPECT_EQ(states[0].serving, *before);
  EXPECT_EQ(states[0].last_error, status);

  // Fixing the folder and reloading clears the error; the failed attempt used no version number.
  ASSERT_TRUE(WriteModel(root() / "m", 2).ok());
  ASSERT_TRUE(repo->Reload("m").ok());
  absl::StatusOr<std::shared_ptr<const Model>> fixed = repo->Get("m");
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ((*fixed)->version, 2);
  EXPECT_TRUE(repo->States()[0].last_error.ok());
}

// Weights rewritten in place (truncated, then written in pieces, as `cp` does) while they load,
// over and over: no load may fault (with memory-mapped files this was SIGBUS); each either serves a
// whole version or fails naming the file, and some version serves throughout.
TEST_F(ModelRepositoryTest, WeightsRewrittenInPlaceWhileLoadingNeverCrash) {
  ASSERT_TRUE(WriteModel(root() / "m", 1).ok());
  ASSERT_TRUE(WriteModel(root() / "other", 2).ok());
  // Unverified, so that both whole files load (under m's checksum, other's weights would not).
  RemoveWeightsSha256(root() / "m");
  const std::filesystem::path weights = root() / "m" / kWeightsFileName;
  auto read_all = [](const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string versions[2] = {read_all(weights),
                                   read_all(root() / "other" / kWeightsFileName)};
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);

  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; i < 300 && !stop.load(); ++i) {
      std::ofstream out(weights, std::ios::binary | std::ios::trunc);  // Same inode, size 0.
      const std::string& bytes = versions[i % 2];
      for (size_t at = 0; at < bytes.size(); at += 1024) {
        out.write(bytes.data() + at,
                  static_cast<std::streamsize>(std::min<size_t>(1024, bytes.size() - at)));
        out.flush();
      }
    }
  });
  int loaded = 0, failed = 0;
  for (int i = 0; i < 300; ++i) {
    const absl::Status status = repo->Reload("m");
    if (status.ok()) {
      ++loaded;
    } else {
      ++failed;
      EXPECT_THAT(status.message(), HasSubstr(kWeightsFileName)) << status;
    }
    ASSERT_TRUE(repo->Get("m").ok()) << "a version must serve throughout";
  }
  stop.store(true);
  writer.join();
  EXPECT_EQ(loaded + failed, 300);
  // Once the writer is done, the file is whole again and loads.
  EXPECT_TRUE(repo->Reload("m").ok());
}

TEST_F(ModelRepositoryTest, FailedReloadOfBadConfigNamesTheKey) {
  const ModelConfig config = SmallConfig();
  ASSERT_TRUE(WriteModel(root() / "m", 1, config).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  absl::StatusOr<std::shared_ptr<const Model>> before = repo->Get("m");
  ASSERT_TRUE(before.ok()) << before.status();

  WriteTextFile(root() / "m" / kConfigFileName,
                R"({"d_model": 16, "num_heads": 2, "bias": true, "colour": "blue"})");
  const absl::Status status = repo->Reload("m");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("colour"));
  EXPECT_THAT(status.message(), HasSubstr(kConfigFileName));

  absl::StatusOr<std::shared_ptr<const Model>> still = repo->Get("m");
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(*still, *before);
  EXPECT_EQ(repo->States()[0].last_error, status);
  // The old version still computes what it did.
  absl::StatusOr<std::vector<float>> expected = ExpectedOutput(config, 1);
  absl::StatusOr<std::vector<float>> output = Compute(*(*still)->layer);
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_TRUE(output.ok()) << output.status();
  EXPECT_LE(MaxAbsDiff(*output, *expected), kSame);
}

TEST_F(ModelRepositoryTest, ReloadOfAMissingFolderIsNotFound) {
  ASSERT_TRUE(WriteModel(root() / "m", 1).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  const absl::Status status = repo->Reload("absent");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(status.message(), HasSubstr("absent"));
  EXPECT_THAT(Names(repo->States()), ElementsAre("m"));

  // A serving model whose folder vanished: NotFound, and it serves until the next Poll.
  std::filesystem::remove_all(root() / "m");
  EXPECT_EQ(repo->Reload("m").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(repo->Get("m").ok());
}

TEST_F(ModelRepositoryTest, ReloadOfAPlainFileIsNotFoundAndRecordsNothing) {
  ASSERT_TRUE(WriteModel(root() / "m", 1).ok());
  WriteTextFile(root() / "README.txt", "not a model");
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  const absl::Status status = repo->Reload("README.txt");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(status.message(), HasSubstr("README.txt"));
  EXPECT_THAT(Names(repo->States()), ElementsAre("m"));
  EXPECT_EQ(repo->Get("README.txt").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(repo->Poll(), IsEmpty());
}

TEST_F(ModelRepositoryTest, ReloadOfTheEmbeddedDemoIsFailedPrecondition) {
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  absl::StatusOr<std::shared_ptr<const Model>> before = repo->Get("demo");
  ASSERT_TRUE(before.ok()) << before.status();
  const absl::Status status = repo->Reload("demo");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(), HasSubstr("demo"));
  absl::StatusOr<std::shared_ptr<const Model>> after = repo->Get("demo");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, *before);
}

TEST_F(ModelRepositoryTest, ReloadRejectsInvalidNames) {
  ASSERT_TRUE(WriteModel(root() / "m", 1).ok());
  ASSERT_TRUE(WriteModel(root() / ".x", 1).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  using std::string_view_literals::operator""sv;
  for (std::string_view name : {""sv, "a/b"sv, ".x"sv, ".."sv, "m/"sv, "m\0x"sv}) {
    const absl::Status status = repo->Reload(name);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << "name \"" << name << "\"";
  }
  EXPECT_THAT(Names(repo->States()), ElementsAre("m"));
}

}  // namespace
}  // namespace attnserve::repository
