// WriteModelFolder: writes a model folder (config.json + weights.safetensors) that LoadModelFolder
// reads back. Used by attnserve-models and by tests.
#ifndef ATTNSERVE_CORE_MODEL_MODEL_WRITER_H_
#define ATTNSERVE_CORE_MODEL_MODEL_WRITER_H_

#include <filesystem>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "core/forward/attention_weights.h"
#include "core/model/model_config.h"
#include "core/model/safetensors_file.h"
#include "core/model/weight_naming.h"

namespace attnserve::model {

// Creates `folder` if needed and writes `weights` (valid for config.attention) under `naming` as
// `dtype` (F32, F16 or BF16; 16-bit formats round to nearest even), then config.json: `config`
// with "weights_sha256" set to the SHA-256 of the weights file just written (whatever `config`
// held there), so loads verify the weights. Each file is replaced atomically, weights first, so a
// polling repository never reads a half-written file (a poll between the two renames sees new
// weights under the old digest: that load fails and is retried when config.json lands).
// InvalidArgument for an unsupported dtype; Internal with the system's reason for I/O failures.
absl::Status WriteModelFolder(const std::filesystem::path& folder, const ModelConfig& config,
                              const core::AttentionWeights& weights, WeightNaming naming,
                              TensorDtype dtype,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace attnserve::model

#endif  // ATTNSERVE_CORE_MODEL_MODEL_WRITER_H_
