#include "core/model/model_writer.h"

#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/model/model.h"
#include "core/model/safetensors_writer.h"
#include "core/model/sha256.h"

namespace attnserve::model {

absl::Status WriteModelFolder(const std::filesystem::path& folder, const ModelConfig& config,
                              const core::AttentionWeights& weights, WeightNaming naming,
                              TensorDtype dtype,
                              const std::map<std::string, std::string>& metadata) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) return absl::InternalError(absl::StrCat(folder.string(), ": ", ec.message()));

  const std::vector<NamedTensor> tensors = WeightsToTensors(config.attention, weights, naming);
  std::vector<TensorToWrite> to_write;
  for (const NamedTensor& t : tensors) to_write.push_back({t.name, dtype, t.shape, t.values});
  absl::StatusOr<std::string> image = SerializeSafetensors(to_write, metadata);
  if (!image.ok()) return image.status();
  // The writer holds the exact bytes, so every folder it writes gets integrity for free.
  ModelConfig with_digest = config;
  absl::StatusOr<std::string> digest = Sha256Hex(*image);
  if (!digest.ok()) return digest.status();
  with_digest.weights_sha256 = *std::move(digest);
  if (absl::Status s = WriteFileAtomically(folder / kWeightsFileName, *image); !s.ok()) return s;
  return WriteFileAtomically(folder / kConfigFileName, ModelConfigToJson(with_digest));
}

}  // namespace attnserve::model
