// The three tensor-naming schemes a weights.safetensors file may use, and the conversion between
// a file's tensors and core::AttentionWeights.
//
//   seed   W_Q, W_K, W_V, W_O  [d_model, d_model], applied as X @ W; biases b_Q, b_K, b_V, b_O.
//   torch  nn.MultiheadAttention.state_dict(): in_proj_weight [3·d, d], in_proj_bias [3·d],
//          out_proj.weight [d, d], out_proj.bias [d]; applied as x Wᵀ + b.
//   split  q_proj.weight, k_proj.weight, v_proj.weight, out_proj.weight (or o_proj.weight)
//          [d_out, d_in], each with an optional .bias [d]; applied as x Wᵀ + b.
// The single-head variant has no output projection (no W_O / out_proj / o_proj tensors). Biases
// are present exactly when the config says bias: true.
#ifndef ATTNSERVE_CORE_MODEL_WEIGHT_NAMING_H_
#define ATTNSERVE_CORE_MODEL_WEIGHT_NAMING_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/forward/attention_config.h"
#include "core/forward/attention_weights.h"
#include "core/model/safetensors_file.h"

namespace attnserve::model {

enum class WeightNaming { kSeed, kTorch, kSplit };

// "seed", "torch", "split".
std::string_view NamingName(WeightNaming naming);
// Parses NamingName()'s output; InvalidArgument naming the accepted values otherwise.
absl::StatusOr<WeightNaming> ParseNaming(std::string_view name);

// A tensor a scheme requires for a config, with its shape.
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
};
// The exact tensor set `naming` uses for `config` (valid); split naming lists out_proj.*.
std::vector<ExpectedTensor> ExpectedTensors(const core::AttentionConfig& config,
                                            WeightNaming naming);

// Which scheme `index` uses, from the names present: W_Q → seed, in_proj_weight → torch,
// q_proj.weight → split. InvalidArgument listing the names looked for when none is present, or
// both markers when two are.
absl::StatusOr<WeightNaming> DetectNaming(const SafetensorsIndex& index);

// The weights `index` holds under `naming` (usually DetectNaming's answer), converted to the
// internal layout for `config` (valid). InvalidArgument naming the tensor for a missing tensor
// (with its expected shape), an extra tensor, a wrong shape (expected and actual), an unsupported
// dtype, or a non-finite value (its index and value).
absl::StatusOr<core::AttentionWeights> ReadWeights(const SafetensorsIndex& index,
                                                   const core::AttentionConfig& config,
                                                   WeightNaming naming);

// A named fp32 tensor, as a writer needs it.
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};
// `weights` (valid for `config`) as the tensors `naming` uses, in ExpectedTensors() order:
// ReadWeights of a file holding them gives `weights` back exactly.
std::vector<NamedTensor> WeightsToTensors(const core::AttentionConfig& config,
                                          const core::AttentionWeights& weights,
                                          WeightNaming naming);

}  // namespace attnserve::model

#endif  // ATTNSERVE_CORE_MODEL_WEIGHT_NAMING_H_
