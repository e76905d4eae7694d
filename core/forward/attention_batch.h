// The inputs and outputs of one forward pass over a ragged batch.
//
// A batch holds B sequences of different lengths packed row-wise with no padding: sequence i is
// rows [offsets[i], offsets[i+1]) of a [offsets[B], d_model] row-major matrix. All types here
// borrow the caller's memory (spans); the caller keeps it alive for the duration of the call.
#ifndef ATTNSERVE_CORE_FORWARD_ATTENTION_BATCH_H_
#define ATTNSERVE_CORE_FORWARD_ATTENTION_BATCH_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>

#include "absl/status/status.h"
#include "core/forward/attention_config.h"

namespace attnserve::core {

// B ≥ 1 non-empty sequences packed row-wise. `offsets` has B + 1 entries: offsets[0] == 0,
// strictly increasing, offsets[B] == rows; `data` holds rows × width finite floats.
struct RaggedBatch {
  std::span<const float> data = {};
  std::span<const int64_t> offsets = {};

  int64_t num_sequences() const {
    return offsets.empty() ? 0 : static_cast<int64_t>(offsets.size()) - 1;
  }
  int64_t rows() const { return offsets.empty() ? 0 : offsets.back(); }
  int64_t length(int64_t i) const { return offsets[i + 1] - offsets[i]; }
  // The sequence holding `row` (0 <= row < rows()); offsets must be valid.
  int64_t SequenceOfRow(int64_t row) const {
    return std::upper_bound(offsets.begin(), offsets.end(), row) - offsets.begin() - 1;
  }
};

// Which keys each query may see. Blocked scores become -∞ before the softmax. A query row whose
// keys are all blocked (possible only with an explicit mask) gets all-zero attention weights and
// so a zero attention output — never NaN; after W_O its layer output is exactly b_O.
struct AttentionMask {
  // Query i sees key j only if j <= i (top-left aligned, as PyTorch's is_causal). With S > T the
  // trailing keys are never seen; with S < T the last queries see every key.
  bool causal = false;
  // Empty, or one row-major [T_i, S_i] block per sequence, concatenated in sequence order
  // (Σ T_i·S_i bytes); 0 = blocked, anything else = visible. ANDed with `causal`.
  std::span<const uint8_t> explicit_mask = {};
};

struct AttentionInputs {
  // Query sequences (and, for self-attention, also the key/value source).
  RaggedBatch query = {};
  // Cross-attention: per-sequence key/value source [S_i, d_model], with the same number of
  // sequences as `query`; S_i may differ from T_i. Unset for self-attention (S_i = T_i).
  std::optional<RaggedBatch> memory = std::nullopt;
  AttentionMask mask = {};
  // Empty, or num_heads flags; false disables a head (its output and weights are zeros), as in
  // head pruning (Michel et al., 2019).
  std::span<const bool> head_mask = {};
};

struct AttentionOutputs {
  // [query.rows(), d_model], row-major; every element is written.
  std::span<float> output = {};
  // Empty (not requested), or per-sequence [num_heads, T_i, S_i] blocks concatenated in sequence
  // order (WeightsSize() floats); every element is written.
  std::span<float> weights = {};
};

// Key length S_i of sequence i: the memory length for cross-attention, T_i otherwise.
inline int64_t KeyLength(const AttentionInputs& in, int64_t i) {
  return in.memory ? in.memory->length(i) : in.query.length(i);
}

// Σ T_i·S_i over the sequences first..end-1 of `in` (0 <= first <= end <= B): their share of an
// explicit mask, and of the weights output divided by num_heads.
int64_t ScoreElements(const AttentionInputs& in, int64_t first, int64_t end);

// Σ T_i·S_i over every sequence: the size of an explicit mask for these inputs.
inline int64_t ScoreElements(const AttentionInputs& in) {
  return ScoreElements(in, 0, in.query.num_sequences());
}

// num_heads · Σ T_i·S_i: the size of the weights output for these inputs.
inline int64_t WeightsSize(const AttentionConfig& config, const AttentionInputs& in) {
  return config.num_heads * ScoreElements(in);
}

// OK when `config` is valid, `in` and `out` are consistent with each other and with it, and every
// input value is finite; otherwise InvalidArgument naming the field, the expected and the
// received value.
absl::Status ValidateBatch(const AttentionConfig& config, const AttentionInputs& in,
                           const AttentionOutputs& out);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_FORWARD_ATTENTION_BATCH_H_
