// An independent, double-precision reference for attnserve's attention layer.
//
// Plain loops straight from the formula, sharing no computation code with core/:
//   MultiHead(X) = Concat(head_1..head_h) · W_O + b_O
//   head_i       = softmax(Q_i K_iᵀ / √d_k + mask) V_i,  Q = X·W_Q + b_Q, K = M·W_K + b_K,
//                  V = M·W_V + b_V  (M = X for self-attention, the memory for cross-attention)
// The single-head variant has no W_O: its output is the one head's output (width d_model).
//
// It takes the core's plain data types (config, weights in the internal layout, ragged inputs)
// as its interface, but computes everything itself, in double. Conventions (as documented in
// core/forward/attention_weights.h and core/forward/attention_batch.h):
//   * w_qkv is [d, 3d] input-major, column blocks Q | K | V; head i owns columns i·d_k.. of each.
//   * causal: key j is visible to query i iff j <= i (top-left aligned).
//   * explicit mask: per sequence a row-major [T_i, S_i] uint8 block, 0 = blocked; ANDed with
//     causal. A query row with every key blocked gets zero weights and a zero head output.
//   * head_mask: a disabled head has zero weights and a zero slice in the concatenated heads.
//   * weights: per sequence [num_heads, T_i, S_i], concatenated in sequence order.
//
// Meant for tests and benchmarks: simple and slow (O(rows · d²) per projection), not fast.
#ifndef ATTNSERVE_TESTS_REFERENCE_REFERENCE_ATTENTION_H_
#define ATTNSERVE_TESTS_REFERENCE_REFERENCE_ATTENTION_H_

#include <vector>

#include "absl/status/statusor.h"
#include "core/forward/attention_batch.h"
#include "core/forward/attention_config.h"
#include "core/forward/attention_weights.h"

namespace attnserve::reference {

struct ReferenceOutputs {
  // [query rows, d_model], row-major.
  std::vector<double> output;
  // Per sequence [num_heads, T_i, S_i], concatenated in sequence order.
  std::vector<double> weights;
};

// Computes the layer on `in`. InvalidArgument (from the reference's own checks) when the config,
// the weights or the inputs are inconsistent; never reads out of bounds.
absl::StatusOr<ReferenceOutputs> Attention(const core::AttentionConfig& config,
                                           const core::AttentionWeights& weights,
                                           const core::AttentionInputs& in);

}  // namespace attnserve::reference

#endif  // ATTNSERVE_TESTS_REFERENCE_REFERENCE_ATTENTION_H_
