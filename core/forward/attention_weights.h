// AttentionWeights: the parameters of one attention layer in attnserve's single internal layout,
// and the conversions into it from the two layouts users bring.
//
// Internal layout ("input-major", as in the seed's X @ W), all row-major fp32:
//   w_qkv [d_model, 3·d_model]  column block [0, d) is W_Q, [d, 2d) W_K, [2d, 3d) W_V; inside each
//                               block head i owns columns [i·d_k, (i+1)·d_k).
//   b_qkv [3·d_model]           b_Q | b_K | b_V; empty when the config has no bias.
//   w_o   [d_model, d_model]    row = concatenated head feature, column = output feature; empty for
//                               the single-head variant.
//   b_o   [d_model]             empty without bias or for the single-head variant.
// A row vector x maps to x · w_qkv + b_qkv. Conversion happens once, when a model is loaded.
#ifndef ATTNSERVE_CORE_FORWARD_ATTENTION_WEIGHTS_H_
#define ATTNSERVE_CORE_FORWARD_ATTENTION_WEIGHTS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/forward/attention_config.h"

namespace attnserve::core {

struct AttentionWeights {
  std::vector<float> w_qkv;
  std::vector<float> b_qkv;
  std::vector<float> w_o;
  std::vector<float> b_o;

  // OK when every tensor has the size `config` implies and every value is finite; otherwise
  // InvalidArgument naming the tensor with the expected and actual size, or the first non-finite
  // value and its index. `config` must be valid.
  absl::Status ValidateFor(const AttentionConfig& config) const;
};

// How a user's projection matrix is oriented.
enum class WeightOrientation {
  // W is [d_in, d_out] and applied as X @ W (the seed's NumPy code).
  kInputMajor,
  // W is [d_out, d_in] and applied as x Wᵀ + b (PyTorch nn.Linear / nn.MultiheadAttention).
  kOutputMajor,
};

// Separate per-projection tensors, each d_model × d_model (biases d_model), borrowed for the
// duration of PackWeights. Biases are empty when the config has no bias; w_o and b_o are empty for
// the single-head variant.
struct SeparateProjections {
  WeightOrientation orientation = WeightOrientation::kInputMajor;
  std::span<const float> w_q = {}, w_k = {}, w_v = {}, w_o = {};
  std::span<const float> b_q = {}, b_k = {}, b_v = {}, b_o = {};
};

// Converts `projections` into the internal layout for `config` (which must be valid).
// InvalidArgument naming the tensor when a size does not match the config.
absl::StatusOr<AttentionWeights> PackWeights(const AttentionConfig& config,
                                             const SeparateProjections& projections);

// Deterministic pseudo-random weights for `config`: uniform with variance 1/d_model (biases
// variance 0.01), from a portable generator, so the same seed gives the same weights everywhere.
// Used for the embedded demo model, tests and benchmarks.
AttentionWeights MakeRandomWeights(const AttentionConfig& config, uint64_t seed);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_FORWARD_ATTENTION_WEIGHTS_H_
