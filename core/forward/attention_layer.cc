#include "core/forward/attention_layer.h"

#include <new>

namespace attnserve::core {

absl::StatusOr<std::shared_ptr<const AttentionLayer>> AttentionLayer::Create(
    const AttentionConfig& config, const AttentionWeights& weights) {
  if (auto s = config.Validate(); !s.ok()) return s;
  if (auto s = weights.ValidateFor(config); !s.ok()) return s;
  try {
    std::shared_ptr<AttentionLayer> layer(new AttentionLayer());
    layer->config_ = config;
    if (auto s = layer->Pack(weights); !s.ok()) return s;
    return std::shared_ptr<const AttentionLayer>(std::move(layer));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("AttentionLayer::Create: out of memory packing weights");
  }
}

absl::Status AttentionLayer::Pack(const AttentionWeights& weights) {
  const int64_t d = config_.d_model;
  const std::span<const float> w_qkv(weights.w_qkv);
  // bf16 compute packs the weights in bf16 once; the f32 biases are added in f32 either way.
  const dnnl::memory::data_type type = config_.compute_type == ComputeType::kBFloat16
                                           ? dnnl::memory::data_type::bf16
                                           : dnnl::memory::data_type::f32;
  auto pack = [](absl::StatusOr<PackedMatrix> packed, PackedMatrix& into) {
    if (packed.ok()) into = *std::move(packed);
    return packed.status();
  };
  // W_Q and W_KV are column blocks of the fused matrix, read in place through its row stride.
  // Packed, they are usually byte ranges of the packed fused matrix too: then they share it.
  if (auto s = pack(PackMatrix(w_qkv, d, 3 * d, 3 * d, type), qkv_); !s.ok()) return s;
  if (auto s = pack(PackMatrix(w_qkv, d, d, 3 * d, type), q_); !s.ok()) return s;
  if (auto s = pack(PackMatrix(w_qkv.subspan(d), d, 2 * d, 3 * d, type), kv_); !s.ok()) return s;
  q_ = ShareIfIdentical(std::move(q_), qkv_, 0);
  kv_ = ShareIfIdentical(std::move(kv_), qkv_, q_.bytes() / sizeof(float));
  if (config_.HasOutputProjection()) {
    if (auto s = pack(PackMatrix(weights.w_o, d, d, d, type), o_); !s.ok()) return s;
  }
  qkv_bias_ = weights.b_qkv;
  o_bias_ = weights.b_o;
  return absl::OkStatus();
}

}  // namespace attnserve::core
