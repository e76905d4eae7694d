#include "core/model/model.h"

#include <set>
#include <span>
#include <string>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/forward/attention_weights.h"
#include "core/forward/onednn_support.h"
#include "core/model/file_bytes.h"
#include "core/model/safetensors_file.h"
#include "core/model/sha256.h"
#include "core/model/weight_naming.h"

namespace attnserve::model {
namespace {

// `status` with "<path>: " in front of its message, same code.
absl::Status WithPath(const std::filesystem::path& path, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(path.string(), ": ", status.message()));
}

absl::Status CheckFolder(const std::filesystem::path& folder) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(folder, ec);
  if (st.type() == std::filesystem::file_type::not_found) {
    return absl::NotFoundError(absl::StrCat(folder.string(), ": no such model folder"));
  }
  if (ec) return absl::InvalidArgumentError(absl::StrCat(folder.string(), ": ", ec.message()));
  if (st.type() != std::filesystem::file_type::directory) {
    return absl::FailedPreconditionError(absl::StrCat(folder.string(), ": not a folder"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ReadConfig(const std::filesystem::path& path) {
  absl::StatusOr<FileBytes> file = FileBytes::Open(path);
  if (!file.ok()) return file.status();  // Already names the path.
  const std::span<const std::byte> bytes = file->bytes();
  absl::StatusOr<ModelConfig> config =
      ParseModelConfig(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  if (!config.ok()) return WithPath(path, config.status());
  return config;
}

// DataLoss naming the file and both digests when `bytes` (read from `path`) do not hash to
// `expected` (lowercase hex, from config.json).
absl::Status VerifySha256(const std::filesystem::path& path, std::span<const std::byte> bytes,
                          const std::string& expected) {
  absl::StatusOr<std::string> actual = Sha256Hex(bytes);
  if (!actual.ok()) return WithPath(path, actual.status());
  if (*actual == expected) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      path.string(), ": SHA-256 mismatch: expected ", expected, " (\"weights_sha256\" in ",
      kConfigFileName, "), got ", *actual, " (the ", bytes.size(),
      " bytes read); the file is corrupt, or was replaced without its config.json"));
}

// "F32", or e.g. "mixed (F16, F32)" when the tensors differ.
std::string FileDtype(const SafetensorsIndex& index) {
  std::set<std::string> names;
  for (const TensorView& t : index.tensors) names.insert(std::string(DtypeName(t.dtype)));
  if (names.size() == 1) return *names.begin();
  return absl::StrCat("mixed (", absl::StrJoin(names, ", "), ")");
}

// The model's name: the folder's last component, ignoring a trailing slash.
std::string FolderName(const std::filesystem::path& folder) {
  std::filesystem::path p = folder;
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Model>> LoadModelFolder(const std::filesystem::path& folder,
                                                             const LoadOptions& options) {
  if (absl::Status s = CheckFolder(folder); !s.ok()) return s;
  absl::StatusOr<ModelConfig> config = ReadConfig(folder / kConfigFileName);
  if (!config.ok()) return config.status();
  if (options.compute_type) config->attention.compute_type = *options.compute_type;
  if (!config->kv_cache_dtype) config->kv_cache_dtype = options.default_kv_cache_dtype;
  // Before reading the weights: a model this CPU cannot run well is refused cheaply.
  if (absl::Status s = core::CheckComputeTypeSupported(
          config->attention.compute_type, options.allow_bf16_emulation, folder.string());
      !s.ok()) {
    return s;
  }

  const std::filesystem::path weights_path = folder / kWeightsFileName;
  absl::StatusOr<FileBytes> bytes = FileBytes::Open(weights_path);
  if (!bytes.ok()) return bytes.status();  // Already names the path.
  // The digest is of the buffer that is then parsed, so no rewrite of the file can slip in
  // between the check and the use. It comes first: bytes that are not the ones config.json
  // describes are refused whatever they hold, with the one error that says so.
  if (config->weights_sha256) {
    if (absl::Status s = VerifySha256(weights_path, bytes->bytes(), *config->weights_sha256);
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Parse(weights_path, *std::move(bytes));
  if (!file.ok()) return file.status();
  absl::StatusOr<WeightNaming> naming = DetectNaming(file->index());
  if (!naming.ok()) return WithPath(weights_path, naming.status());
  absl::StatusOr<core::AttentionWeights> weights =
      ReadWeights(file->index(), config->attention, *naming);
  if (!weights.ok()) return WithPath(weights_path, weights.status());

  absl::StatusOr<std::shared_ptr<const core::AttentionLayer>> layer =
      core::AttentionLayer::Create(config->attention, *weights);
  if (!layer.ok()) return WithPath(folder, layer.status());

  auto model = std::make_shared<Model>();
  model->name = FolderName(folder);
  model->config = *std::move(config);
  model->layer = *std::move(layer);
  model->source = folder.string();
  model->weight_naming = std::string(NamingName(*naming));
  model->file_dtype = FileDtype(file->index());
  return model;
}

bool IsValidModelName(std::string_view name) {
  return !name.empty() && !name.starts_with('.') && name.find('/') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos;
}

namespace {

absl::StatusOr<std::shared_ptr<const Model>> BuildDemoModel(core::ComputeType type) {
  ModelConfig config;
  config.attention = {.d_model = 512,
                      .num_heads = 8,
                      .variant = core::AttentionVariant::kMultiHead,
                      .bias = true,
                      .compute_type = type};
  absl::StatusOr<std::shared_ptr<const core::AttentionLayer>> layer = core::AttentionLayer::Create(
      config.attention, core::MakeRandomWeights(config.attention, kDemoSeed));
  if (!layer.ok()) return layer.status();
  auto model = std::make_shared<Model>();
  model->name = kDemoModelName;
  model->config = config;
  model->layer = *std::move(layer);
  model->source = "embedded";
  model->weight_naming = "embedded";
  model->file_dtype = "F32";
  return model;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Model>> DemoModel(core::ComputeType type) {
  using Result = absl::StatusOr<std::shared_ptr<const Model>>;
  if (type == core::ComputeType::kBFloat16) {
    static const Result* const bf16 = new Result(BuildDemoModel(type));
    return *bf16;
  }
  static const Result* const fp32 = new Result(BuildDemoModel(core::ComputeType::kFloat32));
  return *fp32;
}

}  // namespace attnserve::model
