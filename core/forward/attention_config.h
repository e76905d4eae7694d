// AttentionConfig: the shape of one attention layer (sizes, variant, bias, compute type).
//
// A plain value type; copy freely. Thread-safe as any const value.
#ifndef ATTNSERVE_CORE_FORWARD_ATTENTION_CONFIG_H_
#define ATTNSERVE_CORE_FORWARD_ATTENTION_CONFIG_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace attnserve::core {

// Which parameterisation of attention a layer uses.
enum class AttentionVariant {
  // MultiHead(X) = Concat(head_1..head_h) · W_O, with Q, K, V projected by one fused matrix and
  // split into h heads of width d_model / h. 4·d² weights (+ 4·d biases), even when h == 1.
  kMultiHead,
  // The native single head: softmax(Q Kᵀ / √d + mask) V with Q, K, V of width d_model and no
  // output projection. 3·d² weights (+ 3·d biases). num_heads must be 1.
  kSingleHead,
};

// The arithmetic the layer computes in. Inputs and outputs are fp32 at the API either way.
enum class ComputeType {
  kFloat32,
  // Projections, QKᵀ and P·V as oneDNN bf16 matmuls with f32 accumulation, weights packed in
  // bf16; scale, masks and softmax in f32 (probabilities rounded to bf16 for P·V and the weights
  // output). About twice fp32's throughput where the CPU has AVX512-BF16 or AMX; relative error
  // of the output ~1e-2 (tests/core/bf16_sweep_test.cc).
  kBFloat16,
};

// "multi_head" / "single_head"; the names used in config files and on the wire.
std::string_view VariantName(AttentionVariant variant);
// Parses VariantName()'s output; InvalidArgument naming the accepted values otherwise.
absl::StatusOr<AttentionVariant> ParseVariant(std::string_view name);
// "fp32" / "bf16"; the names used in config files, flags and on the wire.
std::string_view ComputeTypeName(ComputeType type);
// Parses ComputeTypeName()'s output; InvalidArgument naming the accepted values otherwise.
absl::StatusOr<ComputeType> ParseComputeType(std::string_view name);

struct AttentionConfig {
  // Model width: the last dimension of every input, memory and output row. Must be > 0.
  int64_t d_model = 512;
  // Number of heads; must divide d_model. Must be 1 for kSingleHead.
  int64_t num_heads = 8;
  AttentionVariant variant = AttentionVariant::kMultiHead;
  // Whether every projection adds a bias (b_Q, b_K, b_V and, for multi-head, b_O).
  bool bias = false;
  ComputeType compute_type = ComputeType::kFloat32;

  // OK, or InvalidArgument naming the offending field, the expected and the received value.
  absl::Status Validate() const;

  // Width of one head: d_model / num_heads (d_k = d_v). Meaningful only for a valid config.
  int64_t HeadDim() const { return d_model / num_heads; }
  // Whether the layer has an output projection W_O.
  bool HasOutputProjection() const { return variant == AttentionVariant::kMultiHead; }
  // Number of trainable parameters: 4·d² (+4·d) for multi-head, 3·d² (+3·d) for single-head.
  // d=512, h=8 multi-head without bias: 1,048,576; native single head: 786,432.
  int64_t ParameterCount() const;
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_FORWARD_ATTENTION_CONFIG_H_
