// AttentionLayer: one attention layer ready to run — its config, its weights packed for oneDNN,
// and its biases.
//
// Immutable once created: share one instance (through the shared_ptr) between any number of
// threads and AttentionExecutors. Swapping a model means creating a new layer; work in flight
// keeps the old one alive through its shared_ptr.
#ifndef ATTNSERVE_CORE_FORWARD_ATTENTION_LAYER_H_
#define ATTNSERVE_CORE_FORWARD_ATTENTION_LAYER_H_

#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "core/forward/attention_config.h"
#include "core/forward/attention_weights.h"
#include "core/forward/packed_matrix.h"

namespace attnserve::core {

class AttentionLayer {
 public:
  // Validates `config` and `weights` (InvalidArgument naming the field or tensor) and packs the
  // weights (Internal if oneDNN fails, ResourceExhausted if memory runs out). Holds the packed
  // fused Q|K|V matrix and W_O; the packed W_Q and W_KV that cross-attention needs are byte
  // ranges of the fused one when oneDNN's layout allows it (AVX-512 blocked layouts with d_model
  // a multiple of 64) and separate copies otherwise (then 7·d² floats instead of 4·d²).
  static absl::StatusOr<std::shared_ptr<const AttentionLayer>> Create(
      const AttentionConfig& config, const AttentionWeights& weights);

  const AttentionConfig& config() const { return config_; }

  // Packed projections, [d_model, N] each: fused Q|K|V (N = 3d), Q alone (d), K|V (2d), and W_O
  // (d; only for the multi-head variant).
  const PackedMatrix& qkv() const { return qkv_; }
  const PackedMatrix& q() const { return q_; }
  const PackedMatrix& kv() const { return kv_; }
  const PackedMatrix& o() const { return o_; }

  // Biases matching the projections above; empty without bias.
  std::span<const float> qkv_bias() const { return qkv_bias_; }
  std::span<const float> q_bias() const { return std::span(qkv_bias_).first(q_bias_size()); }
  std::span<const float> kv_bias() const { return std::span(qkv_bias_).subspan(q_bias_size()); }
  std::span<const float> o_bias() const { return o_bias_; }

 private:
  AttentionLayer() = default;
  // Packs every projection of `weights` (already validated against config_).
  absl::Status Pack(const AttentionWeights& weights);
  size_t q_bias_size() const { return qkv_bias_.empty() ? 0 : config_.d_model; }

  AttentionConfig config_;
  PackedMatrix qkv_, q_, kv_, o_;
  std::vector<float> qkv_bias_, o_bias_;
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_FORWARD_ATTENTION_LAYER_H_
