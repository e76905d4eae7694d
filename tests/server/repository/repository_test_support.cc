#include "tests/server/repository/repository_test_support.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "core/forward/attention_batch.h"
#include "core/forward/attention_weights.h"
#include "core/model/model_writer.h"
#include "core/model/safetensors_file.h"
#include "core/model/weight_naming.h"

namespace attnserve::testing {

model::ModelConfig SmallConfig(int64_t d_model, int64_t num_heads) {
  model::ModelConfig config;
  config.attention = {.d_model = d_model,
                      .num_heads = num_heads,
                      .variant = core::AttentionVariant::kMultiHead,
                      .bias = true};
  return config;
}

absl::Status WriteModel(const std::filesystem::path& folder, uint64_t seed,
                        const model::ModelConfig& config) {
  return model::WriteModelFolder(folder, config, core::MakeRandomWeights(config.attention, seed),
                                 model::WeightNaming::kSeed, model::TensorDtype::kF32);
}

void RemoveWeightsSha256(const std::filesystem::path& folder) {
  const std::filesystem::path path = folder / model::kConfigFileName;
  std::ifstream in(path, std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(in), {}};
  absl::StatusOr<model::ModelConfig> config = model::ParseModelConfig(text);
  ASSERT_TRUE(config.ok()) << path << ": " << config.status();
  config->weights_sha256.reset();
  WriteTextFile(path, model::ModelConfigToJson(*config));
}

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

absl::StatusOr<std::vector<float>> Compute(core::AttentionExecutor& executor,
                                           const core::AttentionLayer& layer) {
  const int64_t d_model = layer.config().d_model;
  std::vector<float> data(5 * d_model);
  for (size_t i = 0; i < data.size(); ++i) {
    data[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 0.1));
  }
  const std::vector<int64_t> offsets = {0, 3, 5};
  std::vector<float> output(data.size());
  core::AttentionInputs in;
  in.query = {.data = data, .offsets = offsets};
  absl::Status status = executor.Forward(layer, in, {.output = output});
  if (!status.ok()) return status;
  return output;
}

absl::StatusOr<std::vector<float>> Compute(const core::AttentionLayer& layer) {
  core::AttentionExecutor executor({.compute_threads = 1});
  return Compute(executor, layer);
}

absl::StatusOr<std::vector<float>> ExpectedOutput(const model::ModelConfig& config, uint64_t seed) {
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

std::vector<std::string> Names(const std::vector<std::shared_ptr<const model::Model>>& models) {
  std::vector<std::string> names;
  for (const auto& m : models) names.push_back(m->name);
  return names;
}

std::vector<std::string> Names(const std::vector<repository::ModelState>& states) {
  std::vector<std::string> names;
  for (const repository::ModelState& s : states) names.push_back(s.name);
  return names;
}

std::vector<std::string> Describe(const std::vector<repository::ModelEvent>& events) {
  std::vector<std::string> out;
  for (const repository::ModelEvent& e : events) {
    out.push_back(
        absl::StrCat(e.name, " ", std::string(repository::EventKindName(e.kind)), " v", e.version));
  }
  return out;
}

std::unique_ptr<repository::ModelRepository> RepositoryTest::OpenRepository(
    repository::DemoModelPolicy demo) {
  absl::StatusOr<std::unique_ptr<repository::ModelRepository>> repo =
      repository::ModelRepository::Open({.root = root(), .demo_model = demo});
  EXPECT_TRUE(repo.ok()) << repo.status();
  return repo.ok() ? *std::move(repo) : nullptr;
}

}  // namespace attnserve::testing
