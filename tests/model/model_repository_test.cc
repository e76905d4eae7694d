// ModelRepository: opening (missing root, the embedded demo model and its policies, ignored
// entries), Get/States, Reload (atomic swap, failed reloads keep the old version serving), Poll
// (loads, reloads, unloads, failures retried only after a change) and concurrent readers during
// reloads. Every model is a small folder written by WriteModelFolder; what a model computes is
// checked by running core::AttentionExecutor on it and comparing with a layer built directly from
// the same weights.
#include "core/model/model_repository.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/attention_batch.h"
#include "core/attention_config.h"
#include "core/attention_executor.h"
#include "core/attention_layer.h"
#include "core/attention_weights.h"
#include "core/model/model.h"
#include "core/model/model_config.h"
#include "core/model/model_writer.h"
#include "core/model/safetensors_file.h"
#include "core/model/weight_naming.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_folder.h"

namespace attnserve::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

using ::attnserve::testing::TempFolder;

ModelConfig SmallConfig(int64_t d_model = 16, int64_t num_heads = 2) {
  ModelConfig config;
  config.attention = {.d_model = d_model,
                      .num_heads = num_heads,
                      .variant = core::AttentionVariant::kMultiHead,
                      .bias = true};
  return config;
}

absl::Status WriteModel(const std::filesystem::path& folder, uint64_t seed,
                        const ModelConfig& config = SmallConfig()) {
  return WriteModelFolder(folder, config, core::MakeRandomWeights(config.attention, seed),
                          WeightNaming::kSeed, TensorDtype::kF32);
}

// Replaces `path` with `contents` through a temporary file and a rename, so the file gets a new
// inode (as editors and WriteModelFolder do) and Poll notices the change whatever its size.
void WriteTextFile(const std::filesystem::path& path, const std::string& contents) {
  std::filesystem::path temp = path;
  temp += ".new";
  std::ofstream out(temp, std::ios::binary | std::ios::trunc);
  out << contents;
  out.close();
  ASSERT_TRUE(out.good()) << "cannot write " << temp;
  std::error_code ec;
  std::filesystem::rename(temp, path, ec);
  ASSERT_FALSE(ec) << "cannot rename " << temp << " to " << path << ": " << ec.message();
}

// Two self-attention sequences (3 and 2 rows) of deterministic values.
struct TinyBatch {
  explicit TinyBatch(int64_t d_model) : data(5 * d_model) {
    for (size_t i = 0; i < data.size(); ++i) {
      data[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 0.1));
    }
  }
  std::vector<float> data;
  std::vector<int64_t> offsets = {0, 3, 5};
};

// What `layer` computes for TinyBatch.
absl::StatusOr<std::vector<float>> Compute(core::AttentionExecutor& executor,
                                           const core::AttentionLayer& layer) {
  const TinyBatch batch(layer.config().d_model);
  std::vector<float> output(batch.data.size());
  core::AttentionInputs in;
  in.query = {.data = batch.data, .offsets = batch.offsets};
  absl::Status status = executor.Forward(layer, in, {.output = output});
  if (!status.ok()) return status;
  return output;
}

absl::StatusOr<std::vector<float>> Compute(const core::AttentionLayer& layer) {
  core::AttentionExecutor executor({.compute_threads = 1});
  return Compute(executor, layer);
}

// What a layer built directly from MakeRandomWeights(config, seed) computes for TinyBatch.
absl::StatusOr<std::vector<float>> ExpectedOutput(const ModelConfig& config, uint64_t seed) {
  absl::StatusOr<std::shared_ptr<const core::AttentionLayer>> layer = core::AttentionLayer::Create(
      config.attention, core::MakeRandomWeights(config.attention, seed));
  if (!layer.ok()) return layer.status();
  return Compute(**layer);
}

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::numeric_limits<float>::infinity();
  float diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(a[i] - b[i]));
  return diff;
}

// The same computation (F32 weights, same kernels): equal up to rounding.
constexpr float kSame = 1e-5f;
// Outputs of different random weights differ by far more than this.
constexpr float kDifferent = 1e-2f;

std::vector<std::string> Names(const std::vector<std::shared_ptr<const Model>>& models) {
  std::vector<std::string> names;
  for (const auto& m : models) names.push_back(m->name);
  return names;
}

std::vector<std::string> Names(const std::vector<ModelState>& states) {
  std::vector<std::string> names;
  for (const ModelState& s : states) names.push_back(s.name);
  return names;
}

std::vector<std::string> Describe(const std::vector<ModelEvent>& events) {
  std::vector<std::string> out;
  for (const ModelEvent& e : events) {
    out.push_back(absl::StrCat(e.name, " ", std::string(EventKindName(e.kind)), " v", e.version));
  }
  return out;
}

class ModelRepositoryTest : public ::testing::Test {
 protected:
  std::filesystem::path root() const { return temp_.path() / "models"; }

  std::unique_ptr<ModelRepository> OpenRepository(
      DemoModelPolicy demo = DemoModelPolicy::kWhenNoRepository) {
    absl::StatusOr<std::unique_ptr<ModelRepository>> repo =
        ModelRepository::Open({.root = root(), .demo_model = demo});
    EXPECT_TRUE(repo.ok()) << repo.status();
    return repo.ok() ? *std::move(repo) : nullptr;
  }

  TempFolder temp_;
};

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
  absl::StatusOr<std::shared_ptr<const Model>> demo = repo->Get("demo");
  ASSERT_TRUE(demo.ok()) << demo.status();
  EXPECT_EQ((*demo)->source, "embedded");
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
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
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
  for (const char* name : {"", "a/b", ".x", "..", "m/"}) {
    const absl::Status status = repo->Reload(name);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << "name \"" << name << "\"";
  }
  EXPECT_THAT(Names(repo->States()), ElementsAre("m"));
}

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

TEST_F(ModelRepositoryTest, PollNoticesANewInodeWithTheSameSizeAndModificationTime) {
  const ModelConfig config = SmallConfig();
  ASSERT_TRUE(WriteModel(root() / "m", 1, config).ok());
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

  // Coming back is a new model: version 1 again.
  ASSERT_TRUE(WriteModel(root() / "gone", 3, config).ok());
  EXPECT_THAT(Describe(repo->Poll()), ElementsAre("gone loaded v1"));
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
  absl::Mutex mu;
  std::vector<std::string> errors;  // Guarded by mu; the first few problems readers saw.
  std::atomic<int64_t> reads{0};
  auto report = [&](std::string error) {
    absl::MutexLock lock(&mu);
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

  absl::MutexLock lock(&mu);
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
}  // namespace attnserve::model
