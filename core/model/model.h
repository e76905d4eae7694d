// Model: one servable attention model — its name, config and ready-to-run layer — and the two
// ways to get one: from a model folder, or the embedded `demo` model.
//
// A model folder is `<repository>/<name>/` holding config.json (model_config.h) and
// weights.safetensors (weight_naming.h lists the accepted tensor names). Models are immutable and
// shared through shared_ptr<const Model>: a reload makes a new Model, and work in flight keeps the
// old one alive.
#ifndef ATTNSERVE_CORE_MODEL_MODEL_H_
#define ATTNSERVE_CORE_MODEL_MODEL_H_

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/forward/attention_layer.h"
#include "core/model/model_config.h"

namespace attnserve::model {

inline constexpr char kConfigFileName[] = "config.json";
inline constexpr char kWeightsFileName[] = "weights.safetensors";
inline constexpr char kDemoModelName[] = "demo";

struct Model {
  std::string name;
  ModelConfig config;
  std::shared_ptr<const core::AttentionLayer> layer;
  // Where the weights came from: the folder path, or "embedded" for the demo model.
  std::string source;
  // How the weights file named its tensors ("seed", "torch", "split"; "embedded" for the demo)
  // and their file dtype ("F32", "F16", "BF16"; "F32" for the demo).
  std::string weight_naming;
  std::string file_dtype;
  // 1 as loaded; the repository numbers what it serves under a name 1, 2, ... for the life of
  // the process, never reusing a number (server/repository/model_repository.h).
  int64_t version = 1;
};

// Whether `name` can name a model folder: non-empty, no '/' or NUL, not starting with '.' (such
// folders are ignored by the repository).
bool IsValidModelName(std::string_view name);

// Loads `folder` as a model named after the folder's last component. When config.json has
// "weights_sha256", the weights file's bytes are verified against it before they are parsed
// (the very bytes parsed: they are read into memory once). Errors name the file (and for the
// weights, the tensor): NotFound for a missing config.json or weights.safetensors,
// InvalidArgument for anything malformed, DataLoss for weights whose SHA-256 differs from
// config.json's (giving both digests), Aborted for a file rewritten while it was read (FileBytes),
// Internal/ResourceExhausted from packing. Never crashes on a broken file. Thread-safe.
//
// `options` may override config.json's compute type; a bf16 model on a CPU without native bf16
// is refused with FailedPrecondition naming the ISA found, unless options allow emulation.
struct LoadOptions {
  // Replaces every model's "compute_dtype" when set (the server's --compute-dtype).
  std::optional<core::ComputeType> compute_type = std::nullopt;
  // Load bf16 models even where oneDNN would emulate bf16 (slower than fp32).
  bool allow_bf16_emulation = false;
  // The KV cache dtype of models whose config.json sets no "kv_cache_dtype" (the server's
  // --kv-cache-dtype).
  KvCacheDtype default_kv_cache_dtype = KvCacheDtype::kAuto;
};
absl::StatusOr<std::shared_ptr<const Model>> LoadModelFolder(const std::filesystem::path& folder,
                                                             const LoadOptions& options = {});

// The embedded default model `demo`: d_model 512, 8 heads, multi-head with bias, weights
// core::MakeRandomWeights(config, kDemoSeed). Built on first use, then shared (an error, e.g.
// ResourceExhausted from packing, is returned on every call).
inline constexpr uint64_t kDemoSeed = 20261129;
// `type` bf16 builds a bf16-compute copy of the same weights (the server's --compute-dtype bf16);
// the caller checks the CPU supports it (core::CheckComputeTypeSupported).
absl::StatusOr<std::shared_ptr<const Model>> DemoModel(
    core::ComputeType type = core::ComputeType::kFloat32);

}  // namespace attnserve::model

#endif  // ATTNSERVE_CORE_MODEL_MODEL_H_
