// attnserve-models' commands, run in-process: generate writes folders that load back to the
// generator's weights, check and list print what the server would load or the precise error.
#include "tools/model_commands.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/forward/attention_weights.h"
#include "core/model/model.h"
#include "core/model/model_writer.h"
#include "core/model/safetensors_file.h"
#include "core/model/weight_naming.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_folder.h"

namespace attnserve::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

class ModelCommandsTest : public ::testing::Test {
 protected:
  GenerateOptions Options(const std::string& name) {
    GenerateOptions o;
    o.repository = root_;
    o.name = name;
    o.config = {.d_model = 32, .num_heads = 4, .bias = true};
    o.seed = 9;
    return o;
  }

  attnserve::testing::TempFolder temp_;
  const fs::path& root_ = temp_.path();
};

TEST_F(ModelCommandsTest, GenerateWritesAFolderThatLoadsToTheGeneratorsWeights) {
  GenerateOptions o = Options("m");
  o.naming = model::WeightNaming::kSplit;
  std::ostringstream out;
  ASSERT_TRUE(GenerateModel(o, out).ok());
  EXPECT_THAT(out.str(), HasSubstr("wrote"));
  EXPECT_THAT(out.str(), HasSubstr("split naming, F32, seed 9"));

  absl::StatusOr<std::shared_ptr<const model::Model>> loaded = model::LoadModelFolder(root_ / "m");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->weight_naming, "split");
  // The file holds exactly MakeRandomWeights(config, seed) under the chosen naming.
  absl::StatusOr<model::SafetensorsFile> file =
      model::SafetensorsFile::Open(root_ / "m" / model::kWeightsFileName);
  ASSERT_TRUE(file.ok()) << file.status();
  const std::vector<model::NamedTensor> expected = model::WeightsToTensors(
      o.config, core::MakeRandomWeights(o.config, 9), model::WeightNaming::kSplit);
  ASSERT_EQ(file->index().tensors.size(), expected.size());
  for (const model::NamedTensor& t : expected) {
    const model::TensorView* view = file->index().Find(t.name);
    ASSERT_NE(view, nullptr) << t.name;
    EXPECT_EQ(view->shape, t.shape) << t.name;
    EXPECT_EQ(model::ReadFloat32(*view).value(), t.values) << t.name;
  }
  std::ostringstream check;
  ASSERT_TRUE(CheckModel(root_ / "m", check).ok());
  EXPECT_THAT(check.str(), HasSubstr("model m"));
  // generate records the weights' digest, and check (loading as the server does) verified it.
  EXPECT_THAT(check.str(), HasSubstr("weights: split naming, F32, SHA-256 verified"));
  EXPECT_THAT(check.str(), HasSubstr("\"weights_sha256\": \""));
  EXPECT_THAT(check.str(), HasSubstr("4224 parameters, compute fp32"));
  EXPECT_THAT(check.str(), HasSubstr("q_proj.weight"));
  EXPECT_THAT(check.str(), HasSubstr("[32, 32]"));
  EXPECT_THAT(check.str(), HasSubstr("out_proj.bias"));
  EXPECT_THAT(check.str(), HasSubstr("trial forward (2 sequences, 12 rows): outputs finite"));
}

TEST_F(ModelCommandsTest, GenerateRefusesToOverwriteUnlessForced) {
  std::ostringstream out;
  ASSERT_TRUE(GenerateModel(Options("m"), out).ok());
  absl::Status again = GenerateModel(Options("m"), out);
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(again.message(), HasSubstr("--force"));
  GenerateOptions forced = Options("m");
  forced.overwrite = true;
  forced.config.variant = core::AttentionVariant::kSingleHead;
  forced.config.num_heads = 1;
  ASSERT_TRUE(GenerateModel(forced, out).ok());
  absl::StatusOr<std::shared_ptr<const model::Model>> loaded = model::LoadModelFolder(root_ / "m");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->config.attention.variant, core::AttentionVariant::kSingleHead);
}

TEST_F(ModelCommandsTest, GenerateRejectsBadNamesConfigsAndDtypes) {
  std::ostringstream out;
  for (const char* name : {"", ".hidden", "a/b"}) {
    absl::Status s = GenerateModel(Options(name), out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(s.message(), HasSubstr("--name")) << name;
  }
  GenerateOptions bad_heads = Options("x");
  bad_heads.config.num_heads = 5;
  EXPECT_EQ(GenerateModel(bad_heads, out).code(), absl::StatusCode::kInvalidArgument);
  GenerateOptions bad_dtype = Options("x");
  bad_dtype.dtype = model::TensorDtype::kI32;
  EXPECT_THAT(GenerateModel(bad_dtype, out).message(), HasSubstr("--dtype"));
  EXPECT_FALSE(fs::exists(root_ / "x"));
}

TEST_F(ModelCommandsTest, CheckReturnsTheLoadError) {
  std::ostringstream out;
  ASSERT_TRUE(GenerateModel(Options("m"), out).ok());
  std::ofstream(root_ / "m" / "config.json") << R"({"d_model": 32, "num_heads": 4, "bias": 1})";
  absl::Status s = CheckModel(root_ / "m", out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("config.json: \"bias\" must be true or false, got 1"));
}

TEST_F(ModelCommandsTest, CheckSaysWhenTheWeightsAreNotVerifiedAndRefusesDamagedOnes) {
  std::ostringstream out;
  ASSERT_TRUE(GenerateModel(Options("m"), out).ok());
  // Damaged in place: the digest refuses the weights, naming the file.
  {
    std::fstream weights(root_ / "m" / model::kWeightsFileName,
                         std::ios::binary | std::ios::in | std::ios::out);
    weights.seekp(-4, std::ios::end);
    weights.write("\0\0\0\0", 4);
  }
  absl::Status s = CheckModel(root_ / "m", out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("weights.safetensors: SHA-256 mismatch"));
  // Without a digest, the same file loads, and check says it was not verified.
  std::ofstream(root_ / "m" / "config.json", std::ios::trunc)
      << R"({"d_model": 32, "num_heads": 4, "bias": true})";
  std::ostringstream check;
  ASSERT_TRUE(CheckModel(root_ / "m", check).ok());
  EXPECT_THAT(check.str(), HasSubstr("not verified (config.json has no weights_sha256)"));
}

TEST_F(ModelCommandsTest, CheckRunsTheModelAndReportsOverflow) {
  // Finite weights whose outputs overflow fp32: the file is valid, the model is not usable.
  model::ModelConfig config;
  config.attention = {.d_model = 8, .num_heads = 2};
  core::AttentionWeights weights = core::MakeRandomWeights(config.attention, 1);
  for (float& w : weights.w_qkv) w = 3e38f;
  ASSERT_TRUE(model::WriteModelFolder(root_ / "huge", config, weights, model::WeightNaming::kSeed,
                                      model::TensorDtype::kF32)
                  .ok());
  std::ostringstream out;
  absl::Status s = CheckModel(root_ / "huge", out);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("trial forward pass failed"));
}

TEST_F(ModelCommandsTest, ListPrintsServingAndFailedModels) {
  std::ostringstream out;
  ASSERT_TRUE(GenerateModel(Options("good"), out).ok());
  fs::create_directory(root_ / "empty");
  std::ostringstream list;
  absl::Status s = ListModels({.root = root_}, list);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("1 model(s) failed"));
  EXPECT_THAT(list.str(), HasSubstr("good  v1  d_model 32, 4 heads"));
  EXPECT_THAT(list.str(), HasSubstr("empty  FAILED: "));
  EXPECT_THAT(list.str(), Not(HasSubstr("demo")));
}

TEST_F(ModelCommandsTest, ListWithoutRepositoryServesTheDemoModel) {
  std::ostringstream list;
  ASSERT_TRUE(ListModels({.root = root_ / "missing"}, list).ok());
  EXPECT_THAT(list.str(), HasSubstr("demo  v1  d_model 512, 8 heads, multi_head, bias, "
                                    "1050624 parameters  (embedded)"));
}

}  // namespace
}  // namespace attnserve::tools
