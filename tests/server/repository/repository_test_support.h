// Helpers for the ModelRepository and RepositoryPoller tests: small model folders, what a model
// computes on a fixed tiny batch, and a fixture with a temporary repository root.
#ifndef ATTNSERVE_TESTS_MODEL_REPOSITORY_TEST_SUPPORT_H_
#define ATTNSERVE_TESTS_MODEL_REPOSITORY_TEST_SUPPORT_H_

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/forward/attention_executor.h"
#include "core/forward/attention_layer.h"
#include "core/model/model.h"
#include "core/model/model_config.h"
#include "gtest/gtest.h"
#include "server/repository/model_repository.h"
#include "tests/support/temp_folder.h"

namespace attnserve::testing {

// Multi-head with bias; 16 wide with 2 heads unless told otherwise.
model::ModelConfig SmallConfig(int64_t d_model = 16, int64_t num_heads = 2);

// Writes a model folder with MakeRandomWeights(config.attention, seed), seed naming, F32, and
// (as model::WriteModelFolder does) the weights' SHA-256 in config.json.
absl::Status WriteModel(const std::filesystem::path& folder, uint64_t seed,
                        const model::ModelConfig& config = SmallConfig());

// Rewrites <folder>/config.json without "weights_sha256" (atomically, WriteTextFile), as a model
// written before checksums existed: its weights load unverified. gtest failures on error.
void RemoveWeightsSha256(const std::filesystem::path& folder);

// Replaces `path` with `contents` through a temporary file and a rename, so the file gets a new
// inode (as editors and model::WriteModelFolder do) and Poll notices the change whatever its size.
// gtest failures on error.
void WriteTextFile(const std::filesystem::path& path, const std::string& contents);

// What `layer` computes for two fixed self-attention sequences (3 and 2 rows).
absl::StatusOr<std::vector<float>> Compute(core::AttentionExecutor& executor,
                                           const core::AttentionLayer& layer);
// The same, on a fresh one-thread executor.
absl::StatusOr<std::vector<float>> Compute(const core::AttentionLayer& layer);

// What a layer built directly from MakeRandomWeights(config.attention, seed) computes.
absl::StatusOr<std::vector<float>> ExpectedOutput(const model::ModelConfig& config, uint64_t seed);

// Largest |a[i] - b[i]|; infinity when the sizes differ.
float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b);

// The same computation (F32 weights, same kernels): equal up to rounding.
inline constexpr float kSame = 1e-5f;
// Outputs of different random weights differ by far more than this.
inline constexpr float kDifferent = 1e-2f;

std::vector<std::string> Names(const std::vector<std::shared_ptr<const model::Model>>& models);
std::vector<std::string> Names(const std::vector<repository::ModelState>& states);
// "name kind vN" per event.
std::vector<std::string> Describe(const std::vector<repository::ModelEvent>& events);

// A temporary folder whose "models" sub-folder is the repository root (created by the tests that
// need it to exist).
class RepositoryTest : public ::testing::Test {
 protected:
  std::filesystem::path root() const { return temp_.path() / "models"; }

  // Opens root(); null (with a test failure) on error.
  std::unique_ptr<repository::ModelRepository> OpenRepository(
      repository::DemoModelPolicy demo = repository::DemoModelPolicy::kWhenNoRepository);

  TempFolder temp_;
};

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_MODEL_REPOSITORY_TEST_SUPPORT_H_
