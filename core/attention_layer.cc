#include "core/attention_layer.h"

namespace attnserve::core {

absl::StatusOr<std::shared_ptr<const AttentionLayer>> AttentionLayer::Create(
    const AttentionConfig& config, const AttentionWeights& weights) {
  if (auto s = config.Validate(); !s.ok()) return s;
  if (auto s = weights.ValidateFor(config); !s.ok()) return s;

  const int64_t d = config.d_model;
  const std::span<const float> w_qkv(weights.w_qkv);
  std::shared_ptr<AttentionLayer> layer(new AttentionLayer());
  layer->config_ = config;
  auto packed = [](absl::StatusOr<PackedMatrix> m, PackedMatrix& into) {
    if (m.ok()) into = std::move(*m);
    return m.status();
  };
  if (auto s = packed(PackMatrix(w_qkv, d, 3 * d, 3 * d), layer->qkv_); !s.ok()) return s;
  if (auto s = packed(PackMatrix(w_qkv, d, d, 3 * d), layer->q_); !s.ok()) return s;
  if (auto s = packed(PackMatrix(w_qkv.subspan(d), d, 2 * d, 3 * d), layer->kv_); !s.ok()) {
    return s;
  }
  if (config.HasOutputProjection()) {
    if (auto s = packed(PackMatrix(weights.w_o, d, d, d), layer->o_); !s.ok()) return s;
  }
  layer->qkv_bias_ = weights.b_qkv;
  layer->o_bias_ = weights.b_o;
  return std::shared_ptr<const AttentionLayer>(std::move(layer));
}

}  // namespace attnserve::core
