// Model folders: LoadModelFolder on good folders and the embedded demo model, and each broken
// folder of kBrokenFolders (the checks docs/MODELS.md lists) — each gives its own clear error
// naming the file, and a repository holding it keeps serving the other models.

#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/forward/attention_batch.h"
#include "core/forward/attention_executor.h"
#include "core/forward/attention_weights.h"
#include "core/model/model.h"
#include "core/model/model_writer.h"
#include "core/model/safetensors_writer.h"
#include "core/model/sha256.h"
#include "core/util/half_float.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/repository/model_repository.h"
#include "tests/reference/reference_attention.h"
#include "tests/support/temp_folder.h"

namespace attnserve::model {
namespace {

namespace fs = std::filesystem;
using ::attnserve::testing::TempFolder;
using ::testing::HasSubstr;

constexpr int64_t kD = 16;

ModelConfig SmallConfig() {
  ModelConfig config;
  config.attention = {.d_model = kD, .num_heads = 2, .bias = true};
  return config;
}

// A model folder as WriteModelFolder writes it: config.json records the weights' SHA-256.
void WriteGood(const fs::path& folder, const ModelConfig& config = SmallConfig()) {
  ASSERT_TRUE(WriteModelFolder(folder, config, core::MakeRandomWeights(config.attention, 3),
                               WeightNaming::kSeed, TensorDtype::kF32)
                  .ok());
}

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// config.json with `key`'s value replaced by `value` (JSON text), or the key added.
void SetConfigKey(const fs::path& folder, const std::string& key, const std::string& value) {
  std::string json = ReadAll(folder / kConfigFileName);
  const std::string quoted = "\"" + key + "\": ";
  const size_t at = json.find(quoted);
  if (at == std::string::npos) {
    json.insert(json.find('{') + 1, quoted + value + ", ");
  } else {
    const size_t begin = at + quoted.size();
    json.replace(begin, json.find_first_of(",\n}", begin) - begin, value);
  }
  WriteAll(folder / kConfigFileName, json);
}

// A good folder whose config.json has no digest, as written before checksums existed.
void WriteGoodUnverified(const fs::path& folder) {
  WriteGood(folder);
  WriteAll(folder / kConfigFileName, ModelConfigToJson(SmallConfig()));
}

// A safetensors image from a literal header and data section.
std::string Image(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// Replaces the first `from` in the weights file's header with `to` (same length keeps offsets).
void EditHeader(const fs::path& folder, const std::string& from, const std::string& to) {
  std::string bytes = ReadAll(folder / kWeightsFileName);
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  bytes.replace(at, from.size(), to);
  WriteAll(folder / kWeightsFileName, bytes);
}

struct BrokenFolder {
  const char* name;
  // Breaks the good model folder it is given.
  std::function<void(const fs::path&)> breaks;
  absl::StatusCode code;
  std::vector<std::string> fragments;  // Each must appear in the error message.
};

// Each case breaks a folder without "weights_sha256" (WriteGoodUnverified), so that the reader's
// own checks answer; under a digest, any change to the weights file is refused first, as the
// Digest* cases show.
const BrokenFolder kBrokenFolders[] = {
    {"DigestMismatch",
     [](const fs::path& f) {
       WriteGood(f);
       std::string bytes = ReadAll(f / kWeightsFileName);
       bytes[bytes.size() - 1] ^= 0x01;  // One bit of b_O.
       WriteAll(f / kWeightsFileName, bytes);
     },
     absl::StatusCode::kDataLoss,
     {"weights.safetensors: SHA-256 mismatch: expected ",
      "(\"weights_sha256\" in config.json), got ",
      "the file is corrupt, or was replaced without its config.json"}},
    {"DigestOfTruncatedFile",
     [](const fs::path& f) {
       WriteGood(f);
       const std::string bytes = ReadAll(f / kWeightsFileName);
       WriteAll(f / kWeightsFileName, bytes.substr(0, bytes.size() / 2));
     },
     absl::StatusCode::kDataLoss,
     {"weights.safetensors: SHA-256 mismatch"}},
    {"DigestMalformed",
     [](const fs::path& f) { SetConfigKey(f, "weights_sha256", "\"0123abc\""); },
     absl::StatusCode::kInvalidArgument,
     {"config.json: ", "\"weights_sha256\" must be 64 hex digits", "got \"0123abc\""}},
    {"TruncatedFile",
     [](const fs::path& f) {
       const std::string bytes = ReadAll(f / kWeightsFileName);
       WriteAll(f / kWeightsFileName, bytes.substr(0, bytes.size() / 2));
     },
     absl::StatusCode::kInvalidArgument,
     {"weights.safetensors: "}},
    {"FileShorterThanLengthPrefix",
     [](const fs::path& f) { WriteAll(f / kWeightsFileName, "abc"); },
     absl::StatusCode::kInvalidArgument,
     {"weights.safetensors: ", "8"}},
    {"HeaderLengthPastTheEnd",
     [](const fs::path& f) {
       std::string bytes = ReadAll(f / kWeightsFileName);
       bytes[5] = '\x01';  // Header length += 2^40.
       WriteAll(f / kWeightsFileName, bytes);
     },
     absl::StatusCode::kInvalidArgument,
     {"weights.safetensors: ", "header"}},
    {"BadJson",
     [](const fs::path& f) { EditHeader(f, "\"W_Q\":", "\"W_Q\";"); },
     absl::StatusCode::kInvalidArgument,
     {"weights.safetensors: ", "JSON"}},
    {"UnknownDtype",
     [](const fs::path& f) { EditHeader(f, "\"F32\"", "\"F33\""); },
     absl::StatusCode::kInvalidArgument,
     {"weights.safetensors: ", "F33"}},
    {"OverlappingRanges",
     [](const fs::path& f) {
       WriteAll(f / kWeightsFileName,
                Image(R"({"W_Q":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("W_K":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                      std::string(12, '\0')));
     },
     absl::StatusCode::kInvalidArgument,
     {"weights.safetensors: ", "overlap", "W_K"}},
    {"ShapeBytesMismatch",
     [](const fs::path& f) {
       WriteAll(f / kWeightsFileName,
                Image(R"({"W_Q":{"dtype":"F32","shape":[16,16],"data_offsets":[0,1000]}})",
                      std::string(1000, '\0')));
     },
     absl::StatusCode::kInvalidArgument,
     {"weights.safetensors: ", "W_Q", "1024", "1000"}},
    {"TrailingGarbage",
     [](const fs::path& f) {
       WriteAll(f / kWeightsFileName, ReadAll(f / kWeightsFileName) + "garbage!");
     },
     absl::StatusCode::kInvalidArgument,
     {"weights.safetensors: "}},
    {"NanWeights",
     [](const fs::path& f) {
       core::AttentionWeights w = core::MakeRandomWeights(SmallConfig().attention, 3);
       w.w_o[5 * kD + 9] = std::numeric_limits<float>::quiet_NaN();
       ASSERT_TRUE(
           WriteModelFolder(f, SmallConfig(), w, WeightNaming::kSeed, TensorDtype::kF32).ok());
     },
     absl::StatusCode::kInvalidArgument,
     {"weights.safetensors: ", "tensor \"W_O\" element [5, 9] is nan"}},
    {"MissingTensor",
     [](const fs::path& f) {
       ModelConfig no_bias = SmallConfig();
       no_bias.attention.bias = false;
       ASSERT_TRUE(WriteModelFolder(f, no_bias, core::MakeRandomWeights(no_bias.attention, 3),
                                    WeightNaming::kTorch, TensorDtype::kF32)
                       .ok());
       ModelConfig with_bias = SmallConfig();
       WriteAll(f / kConfigFileName, ModelConfigToJson(with_bias));
     },
     absl::StatusCode::kInvalidArgument,
     {"weights.safetensors: ", "missing tensor \"in_proj_bias\" [48]"}},
    {"ExtraTensor",
     [](const fs::path& f) {
       ModelConfig no_bias = SmallConfig();
       no_bias.attention.bias = false;
       WriteAll(f / kConfigFileName, ModelConfigToJson(no_bias));
     },
     absl::StatusCode::kInvalidArgument,
     {"weights.safetensors: ", "unexpected tensor \"b_Q\"", "\"bias\": false"}},
    {"WrongDModel",
     [](const fs::path& f) {
       ModelConfig wider = SmallConfig();
       wider.attention.d_model = 32;
       WriteAll(f / kConfigFileName, ModelConfigToJson(wider));
     },
     absl::StatusCode::kInvalidArgument,
     {"weights.safetensors: ", "\"W_Q\" has shape [16, 16], expected [32, 32]"}},
    {"ConfigUnknownKey",
     [](const fs::path& f) {
       WriteAll(f / kConfigFileName, R"({"d_model": 16, "num_heads": 2, "heads": 2})");
     },
     absl::StatusCode::kInvalidArgument,
     {"config.json: ", "unknown key \"heads\""}},
    {"EmptyFolder",
     [](const fs::path& f) {
       fs::remove(f / kConfigFileName);
       fs::remove(f / kWeightsFileName);
     },
     absl::StatusCode::kNotFound,
     {"config.json"}},
    {"MissingWeights",
     [](const fs::path& f) { fs::remove(f / kWeightsFileName); },
     absl::StatusCode::kNotFound,
     {"weights.safetensors"}},
    {"WeightsSymlinkLoop",
     [](const fs::path& f) {
       fs::remove(f / kWeightsFileName);
       fs::create_symlink(kWeightsFileName, f / kWeightsFileName);
     },
     absl::StatusCode::kInvalidArgument,
     {"weights.safetensors: ", "symbolic links"}},
    {"FolderSymlinkLoop",
     [](const fs::path& f) {
       fs::remove_all(f);
       fs::create_symlink(f.filename(), f);
     },
     absl::StatusCode::kInvalidArgument,
     {"symbolic links"}},
    {"WeightsIsAFolder",
     [](const fs::path& f) {
       fs::remove(f / kWeightsFileName);
       fs::create_directory(f / kWeightsFileName);
     },
     absl::StatusCode::kFailedPrecondition,
     {"weights.safetensors"}},
};

class BrokenFolderTest : public ::testing::TestWithParam<BrokenFolder> {};

TEST_P(BrokenFolderTest, GivesItsOwnErrorAndTheRepositoryServesTheOthers) {
  const BrokenFolder& c = GetParam();
  TempFolder repo;
  WriteGood(repo.path() / "good");
  const fs::path broken = repo.path() / "broken";
  WriteGoodUnverified(broken);
  c.breaks(broken);
  if (HasFatalFailure()) return;

  absl::StatusOr<std::shared_ptr<const Model>> loaded = LoadModelFolder(broken);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), c.code) << loaded.status();
  const std::string message(loaded.status().message());
  EXPECT_THAT(message, HasSubstr(broken.string()));
  for (const std::string& fragment : c.fragments) EXPECT_THAT(message, HasSubstr(fragment));

  absl::StatusOr<std::unique_ptr<repository::ModelRepository>> repository =
      repository::ModelRepository::Open({.root = repo.path()});
  ASSERT_TRUE(repository.ok()) << repository.status();
  absl::StatusOr<std::shared_ptr<const Model>> good = (*repository)->Get("good");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ((*good)->config.attention.d_model, kD);
  absl::StatusOr<std::shared_ptr<const Model>> failed = (*repository)->Get("broken");
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(failed.status().message(), HasSubstr(message));
  EXPECT_THAT((*repository)->ServingModels(), ::testing::SizeIs(1));
}

INSTANTIATE_TEST_SUITE_P(All, BrokenFolderTest, ::testing::ValuesIn(kBrokenFolders),
                         [](const auto& p) { return std::string(p.param.name); });

// Runs `model` on a small two-sequence batch and compares with the double-precision reference
// computed from `weights`.
void ExpectComputes(const Model& model, const core::AttentionWeights& weights) {
  const core::AttentionConfig& config = model.config.attention;
  const std::vector<int64_t> offsets = {0, 3, 8};
  std::vector<float> x(8 * config.d_model);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37) % 19) / 19.f - 0.5f;
  const core::AttentionInputs in{.query = {.data = x, .offsets = offsets}};
  std::vector<float> out(x.size());
  core::AttentionExecutor executor;
  ASSERT_TRUE(executor.Forward(*model.layer, in, {.output = out}).ok());
  absl::StatusOr<reference::ReferenceOutputs> ref = reference::Attention(config, weights, in);
  ASSERT_TRUE(ref.ok()) << ref.status();
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_NEAR(out[i], ref->output[i], 1e-4) << model.name << " element " << i;
  }
}

// What a dtype keeps of fp32 weights: the round trip through the file format.
core::AttentionWeights RoundedTo(core::AttentionWeights w, TensorDtype dtype) {
  auto round = [dtype](std::vector<float>& values) {
    for (float& v : values) {
      if (dtype == TensorDtype::kF16) v = HalfToFloat(FloatToHalf(v));
      if (dtype == TensorDtype::kBF16) v = BFloat16ToFloat(FloatToBFloat16(v));
    }
  };
  round(w.w_qkv), round(w.b_qkv), round(w.w_o), round(w.b_o);
  return w;
}

TEST(ModelFolderTest, LoadsEveryNamingDtypeAndVariant) {
  TempFolder repo;
  for (bool single_head : {false, true}) {
    ModelConfig config = SmallConfig();
    if (single_head) {
      config.attention.variant = core::AttentionVariant::kSingleHead;
      config.attention.num_heads = 1;
    }
    const core::AttentionWeights weights = core::MakeRandomWeights(config.attention, 5);
    for (WeightNaming naming : {WeightNaming::kSeed, WeightNaming::kTorch, WeightNaming::kSplit}) {
      for (TensorDtype dtype : {TensorDtype::kF32, TensorDtype::kF16, TensorDtype::kBF16}) {
        const std::string name = std::string(NamingName(naming)) + "_" +
                                 std::string(DtypeName(dtype)) + (single_head ? "_single" : "");
        SCOPED_TRACE(name);
        ASSERT_TRUE(WriteModelFolder(repo.path() / name, config, weights, naming, dtype).ok());
        absl::StatusOr<std::shared_ptr<const Model>> model = LoadModelFolder(repo.path() / name);
        ASSERT_TRUE(model.ok()) << model.status();
        EXPECT_EQ((*model)->name, name);
        EXPECT_EQ((*model)->weight_naming, NamingName(naming));
        EXPECT_EQ((*model)->file_dtype, DtypeName(dtype));
        EXPECT_EQ((*model)->version, 1);
        EXPECT_TRUE((*model)->config.weights_sha256.has_value()) << "verified at load";
        EXPECT_EQ((*model)->config.attention.variant, config.attention.variant);
        ExpectComputes(**model, RoundedTo(weights, dtype));
      }
    }
  }
}

TEST(ModelFolderTest, TheDigestIsOfTheWholeWeightsFileAndOptional) {
  TempFolder repo;
  const fs::path folder = repo.path() / "m";
  WriteGood(folder);
  // What `sha256sum weights.safetensors` prints.
  absl::StatusOr<std::string> digest = Sha256Hex(ReadAll(folder / kWeightsFileName));
  ASSERT_TRUE(digest.ok()) << digest.status();
  absl::StatusOr<ModelConfig> written = ParseModelConfig(ReadAll(folder / kConfigFileName));
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->weights_sha256, *digest);
  absl::StatusOr<std::shared_ptr<const Model>> model = LoadModelFolder(folder);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config.weights_sha256, *digest);

  // A digest given by hand in capitals, then none at all: both load the same weights.
  std::string upper = *digest;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  SetConfigKey(folder, "weights_sha256", "\"" + upper + "\"");
  model = LoadModelFolder(folder);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config.weights_sha256, *digest);
  WriteAll(folder / kConfigFileName, ModelConfigToJson(SmallConfig()));
  model = LoadModelFolder(folder);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_FALSE((*model)->config.weights_sha256.has_value());
  ExpectComputes(**model, core::MakeRandomWeights(SmallConfig().attention, 3));
}

TEST(ModelFolderTest, TrailingSlashKeepsTheFolderName) {
  TempFolder repo;
  WriteGood(repo.path() / "m");
  absl::StatusOr<std::shared_ptr<const Model>> model =
      LoadModelFolder((repo.path() / "m").string() + "/");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->name, "m");
}

TEST(ModelFolderTest, MissingFolderIsNotFound) {
  absl::StatusOr<std::shared_ptr<const Model>> model = LoadModelFolder("/nonexistent/attnserve/x");
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(model.status().message(),
              HasSubstr("/nonexistent/attnserve/x: no such model folder"));
}

TEST(ModelFolderTest, DemoModelIsTheDocumentedDeterministicModel) {
  absl::StatusOr<std::shared_ptr<const Model>> demo = DemoModel();
  ASSERT_TRUE(demo.ok()) << demo.status();
  const core::AttentionConfig& c = (*demo)->config.attention;
  EXPECT_EQ((*demo)->name, "demo");
  EXPECT_EQ(c.d_model, 512);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.variant, core::AttentionVariant::kMultiHead);
  EXPECT_TRUE(c.bias);
  EXPECT_EQ(c.ParameterCount(), 4 * 512 * 512 + 4 * 512);
  EXPECT_EQ((*demo)->source, "embedded");
  EXPECT_EQ(DemoModel()->get(), demo->get()) << "built once, then shared";
  ExpectComputes(**demo, core::MakeRandomWeights(c, kDemoSeed));
}

}  // namespace
}  // namespace attnserve::model
