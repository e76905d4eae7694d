// ModelRepository: opening (missing root, the embedded demo model and its policies, ignored
// entries), Get and States. Reload and Poll have their own files (model_reload_test.cc,
// model_poll_test.cc); every model is a small folder written by WriteModelFolder.
#include "server/repository/model_repository.h"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
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
using ::attnserve::testing::ExpectedOutput;
using ::attnserve::testing::kSame;
using ::attnserve::testing::MaxAbsDiff;
using ::attnserve::testing::Names;
using ::attnserve::testing::SmallConfig;
using ::attnserve::testing::WriteModel;
using ::attnserve::testing::WriteTextFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

using ModelRepositoryTest = ::attnserve::testing::RepositoryTest;

// ---------------------------------------------------------------------------------------------
// Open

TEST_F(ModelRepositoryTest, MissingRootServesOnlyTheEmbeddedDemo) {
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  EXPECT_THAT(Names(repo->ServingModels()), ElementsAre("demo"));
  absl::StatusOr<std::shared_ptr<const Model>> demo = repo->Get("demo");
  ASSERT_TRUE(demo.ok()) << demo.status();
  EXPECT_EQ((*demo)->name, "demo");
  EXPECT_EQ((*demo)->config.attention.d_model, 512);
  EXPECT_EQ((*demo)->config.attention.num_heads, 8);
  EXPECT_EQ((*demo)->config.attention.variant, core::AttentionVariant::kMultiHead);
  EXPECT_TRUE((*demo)->config.attention.bias);
  EXPECT_EQ((*demo)->source, "embedded");
  EXPECT_EQ((*demo)->version, 1);
  ASSERT_NE((*demo)->layer, nullptr);
  EXPECT_EQ((*demo)->layer->config().d_model, 512);

  const std::vector<ModelState> states = repo->States();
  ASSERT_EQ(states.size(), 1u);
  EXPECT_EQ(states[0].name, "demo");
  EXPECT_EQ(states[0].serving, *demo);
  EXPECT_TRUE(states[0].last_error.ok()) << states[0].last_error;
  // Nothing on disk: polling changes nothing, and the demo model keeps serving.
  EXPECT_THAT(repo->Poll(), IsEmpty());
  EXPECT_TRUE(repo->Get("demo").ok());
}

TEST_F(ModelRepositoryTest, MissingRootWithDemoNeverServesNothing) {
  std::unique_ptr<ModelRepository> repo = OpenRepository(DemoModelPolicy::kNever);
  ASSERT_NE(repo, nullptr);
  EXPECT_THAT(repo->ServingModels(), IsEmpty());
  EXPECT_THAT(repo->States(), IsEmpty());
  absl::StatusOr<std::shared_ptr<const Model>> demo = repo->Get("demo");
  EXPECT_EQ(demo.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(demo.status().message(), HasSubstr("serving: none"));
}

TEST_F(ModelRepositoryTest, ExistingRootDoesNotServeDemoByDefault) {
  ASSERT_TRUE(WriteModel(root() / "small", 1).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  EXPECT_THAT(Names(repo->ServingModels()), ElementsAre("small"));
  EXPECT_EQ(repo->Get("demo").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ModelRepositoryTest, EmptyExistingRootServesNothingByDefault) {
  ASSERT_TRUE(std::filesystem::create_directories(root()));
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  EXPECT_THAT(repo->ServingModels(), IsEmpty());
}

TEST_F(ModelRepositoryTest, DemoAlwaysServesBesideTheFolders) {
  ASSERT_TRUE(WriteModel(root() / "small", 1).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository(DemoModelPolicy::kAlways);
  ASSERT_NE(repo, nullptr);
  EXPECT_THAT(Names(repo->ServingModels()), ElementsAre("demo", "small"));
  absl::StatusOr<std::shared_ptr<const Model>> small = repo->Get("small");
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ((*small)->config.attention.d_model, 16);
  EXPECT_EQ((*small)->source, (root() / "small").string());
  EXPECT_EQ((*small)->weight_naming, "seed");
  EXPECT_EQ((*small)->file_dtype, "F32");
  EXPECT_EQ((*small)->version, 1);
  absl::StatusOr<std::shared_ptr<const Model>> demo = repo->Get("demo");
  ASSERT_TRUE(demo.ok()) << demo.status();
  EXPECT_EQ((*demo)->source, "embedded");
}

TEST_F(ModelRepositoryTest, DemoAlwaysWithMissingRootServesDemo) {
  std::unique_ptr<ModelRepository> repo = OpenRepository(DemoModelPolicy::kAlways);
  ASSERT_NE(repo, nullptr);
  EXPECT_THAT(Names(repo->ServingModels()), ElementsAre("demo"));
}

TEST_F(ModelRepositoryTest, FolderNamedDemoReplacesTheEmbeddedOne) {
  const ModelConfig config = SmallConfig(32, 4);
  ASSERT_TRUE(WriteModel(root() / "demo", 7, config).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository(DemoModelPolicy::kAlways);
  ASSERT_NE(repo, nullptr);
  EXPECT_THAT(Names(repo->ServingModels()), ElementsAre("demo"));
  absl::StatusOr<std::shared_ptr<const Model>> demo = repo->Get("demo");
  ASSERT_TRUE(demo.ok()) << demo.status();
  EXPECT_EQ((*demo)->config.attention.d_model, 32);
  EXPECT_EQ((*demo)->source, (root() / "demo").string());
  EXPECT_EQ((*demo)->version, 1);
  absl::StatusOr<std::vector<float>> expected = ExpectedOutput(config, 7);
  ASSERT_TRUE(expected.ok()) << expected.status();
  absl::StatusOr<std::vector<float>> actual = Compute(*(*demo)->layer);
  ASSERT_TRUE(actual.ok()) << actual.status();
  EXPECT_LE(MaxAbsDiff(*actual, *expected), kSame);

  // It is a folder model now: it reloads like any other.
  EXPECT_THAT(repo->Poll(), IsEmpty());
  ASSERT_TRUE(WriteModel(root() / "demo", 8, config).ok());
  ASSERT_TRUE(repo->Reload("demo").ok());
  demo = repo->Get("demo");
  ASSERT_TRUE(demo.ok()) << demo.status();
  EXPECT_EQ((*demo)->version, 2);
  EXPECT_EQ((*demo)->source, (root() / "demo").string());
}

TEST_F(ModelRepositoryTest, EmbeddedDemoServesAgainWhenTheDemoFolderIsRemoved) {
  const ModelConfig config = SmallConfig(32, 4);
  ASSERT_TRUE(WriteModel(root() / "demo", 7, config).ok());
  std::unique_ptr<ModelRepository> repo = OpenRepository(DemoModelPolicy::kAlways);
  ASSERT_NE(repo, nullptr);
  std::shared_ptr<const Model> folder_demo = *repo->Get("demo");
  EXPECT_EQ(folder_demo->config.attention.d_model, 32);

  std::filesystem::remove_all(root() / "demo");
  std::vector<ModelEvent> events = repo->Poll();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, ModelEvent::Kind::kReloaded);
  EXPECT_EQ(events[0].name, "demo");
  EXPECT_EQ(events[0].version, 2) << "the folder's was 1";
  absl::StatusOr<std::shared_ptr<const Model>> demo = repo->Get("demo");
  ASSERT_TRUE(demo.ok()) << demo.status();
  EXPECT_EQ((*demo)->source, "embedded");
  EXPECT_EQ((*demo)->version, 2);
  EXPECT_EQ((*demo)->config.attention.d_model, 512);
  EXPECT_EQ(folder_demo->config.attention.d_model, 32) << "holders keep their version";
  EXPECT_THAT(repo->Poll(), IsEmpty());
}

TEST_F(ModelRepositoryTest, RemovingABrokenDemoFolderClearsItsError) {
  ASSERT_TRUE(std::filesystem::create_directories(root() / "demo"));
  std::unique_ptr<ModelRepository> repo = OpenRepository(DemoModelPolicy::kAlways);
  ASSERT_NE(repo, nullptr);
  std::vector<ModelState> states = repo->States();
  ASSERT_EQ(states.size(), 1u);
  EXPECT_EQ(states[0].serving->source, "embedded") << "the embedded demo keeps serving";
  EXPECT_FALSE(states[0].last_error.ok());

  std::filesystem::remove_all(root() / "demo");
  EXPECT_THAT(repo->Poll(), IsEmpty()) << "what serves did not change";
  states = repo->States();
  ASSERT_EQ(states.size(), 1u);
  EXPECT_TRUE(states[0].last_error.ok()) << states[0].last_error;
  EXPECT_EQ(states[0].serving->source, "embedded");
  EXPECT_EQ(states[0].serving->version, 1);
}

TEST_F(ModelRepositoryTest, RootThatIsAFileIsInvalidArgument) {
  const std::filesystem::path file = temp_.path() / "not-a-folder";
  WriteTextFile(file, "plain file");
  absl::StatusOr<std::unique_ptr<ModelRepository>> repo = ModelRepository::Open({.root = file});
  EXPECT_EQ(repo.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(repo.status().message(), HasSubstr(file.string()));
}

TEST_F(ModelRepositoryTest, PlainFilesAndHiddenFoldersAreIgnored) {
  ASSERT_TRUE(WriteModel(root() / "visible", 1).ok());
  ASSERT_TRUE(WriteModel(root() / ".hidden", 2).ok());  // A complete model, but hidden.
  ASSERT_TRUE(std::filesystem::create_directories(root() / "..2026_01_01_data"));
  WriteTextFile(root() / "README.txt", "not a model");
  WriteTextFile(root() / "config.json", "{}");
  std::unique_ptr<ModelRepository> repo = OpenRepository(DemoModelPolicy::kNever);
  ASSERT_NE(repo, nullptr);
  EXPECT_THAT(Names(repo->States()), ElementsAre("visible"));
  EXPECT_EQ(repo->Get(".hidden").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(repo->Get("README.txt").status().code(), absl::StatusCode::kNotFound);
  // Changing ignored entries produces no events either.
  ASSERT_TRUE(WriteModel(root() / ".hidden", 3).ok());
  ASSERT_TRUE(WriteModel(root() / ".new-hidden", 3).ok());
  WriteTextFile(root() / "NOTES.md", "still not a model");
  EXPECT_THAT(repo->Poll(), IsEmpty());
  EXPECT_THAT(Names(repo->States()), ElementsAre("visible"));
}

// ---------------------------------------------------------------------------------------------
// Get and States

TEST_F(ModelRepositoryTest, GetUnknownNameListsTheServingModels) {
  ASSERT_TRUE(WriteModel(root() / "beta", 2).ok());
  ASSERT_TRUE(WriteModel(root() / "alpha", 1).ok());
  ASSERT_TRUE(std::filesystem::create_directories(root() / "broken"));
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);
  absl::StatusOr<std::shared_ptr<const Model>> missing = repo->Get("gamma");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("gamma"));
  EXPECT_THAT(missing.status().message(), HasSubstr("serving: alpha, beta"));
  EXPECT_THAT(missing.status().message(), Not(HasSubstr("broken")));
}

TEST_F(ModelRepositoryTest, FailedModelIsUnavailableWithItsLoadError) {
  ASSERT_TRUE(WriteModel(root() / "good", 1).ok());
  // A config.json but no weights file.
  ASSERT_TRUE(std::filesystem::create_directories(root() / "broken"));
  WriteTextFile(root() / "broken" / kConfigFileName, ModelConfigToJson(SmallConfig()));
  std::unique_ptr<ModelRepository> repo = OpenRepository();
  ASSERT_NE(repo, nullptr);

  absl::StatusOr<std::shared_ptr<const Model>> broken = repo->Get("broken");
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(broken.status().message(), HasSubstr("broken"));
  EXPECT_THAT(broken.status().message(), HasSubstr(kWeightsFileName));
  EXPECT_THAT(Names(repo->ServingModels()), ElementsAre("good"));

  const std::vector<ModelState> states = repo->States();
  ASSERT_THAT(Names(states), ElementsAre("broken", "good"));
  EXPECT_EQ(states[0].serving, nullptr);
  EXPECT_EQ(states[0].last_error.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(states[0].last_error.message(), HasSubstr(kWeightsFileName));
  ASSERT_NE(states[1].serving, nullptr);
  EXPECT_EQ(states[1].serving->name, "good");
  EXPECT_TRUE(states[1].last_error.ok()) << states[1].last_error;
}

TEST_F(ModelRepositoryTest, ServingModelsAreSortedByName) {
  for (const char* name : {"zeta", "alpha", "mid"}) {
    ASSERT_TRUE(WriteModel(root() / name, 1).ok());
  }
  std::unique_ptr<ModelRepository> repo = OpenRepository(DemoModelPolicy::kAlways);
  ASSERT_NE(repo, nullptr);
  EXPECT_THAT(Names(repo->ServingModels()), ElementsAre("alpha", "demo", "mid", "zeta"));
}

}  // namespace
}  // namespace attnserve::repository
