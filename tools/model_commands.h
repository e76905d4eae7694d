// The commands of the attnserve-models tool, as functions that write to a stream so that tests
// can run them in-process. Each returns OK or the error to print (exit status 1).
#ifndef ATTNSERVE_TOOLS_MODEL_COMMANDS_H_
#define ATTNSERVE_TOOLS_MODEL_COMMANDS_H_

#include <cstdint>
#include <filesystem>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "core/forward/attention_config.h"
#include "core/model/safetensors_file.h"
#include "core/model/weight_naming.h"
#include "server/repository/model_repository.h"

namespace attnserve::tools {

struct GenerateOptions {
  std::filesystem::path repository = "models";
  std::string name;
  core::AttentionConfig config;
  model::WeightNaming naming = model::WeightNaming::kSeed;
  model::TensorDtype dtype = model::TensorDtype::kF32;  // F32, F16 or BF16.
  uint64_t seed = 1;
  bool overwrite = false;  // Replace an existing model folder's files.
};

// Writes <repository>/<name>/ with config.json and weights.safetensors holding
// core::MakeRandomWeights(config, seed) (rounded to `dtype`), config.json recording the weights'
// SHA-256 (model::WriteModelFolder). Each file is replaced atomically, weights first, so a
// polling server never reads a half-written file. InvalidArgument for a bad name or config;
// AlreadyExists when the folder holds a model and !overwrite.
absl::Status GenerateModel(const GenerateOptions& options, std::ostream& out);

// Loads `folder` as the server would and prints its config, parameter count, naming, file dtype,
// whether the weights' SHA-256 was verified, and tensor table; or returns the load error.
absl::Status CheckModel(const std::filesystem::path& folder, std::ostream& out);

// Opens the repository as the server would and prints one line per model: name, version, shape
// and source, or the load error. Returns an error only when the repository cannot be opened or
// some model failed to load (after printing everything).
absl::Status ListModels(const repository::ModelRepositoryOptions& options, std::ostream& out);

}  // namespace attnserve::tools

#endif  // ATTNSERVE_TOOLS_MODEL_COMMANDS_H_
