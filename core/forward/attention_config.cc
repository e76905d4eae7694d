#include "core/forward/attention_config.h"

#include "absl/strings/str_cat.h"

namespace attnserve::core {

std::string_view VariantName(AttentionVariant variant) {
  switch (variant) {
    case AttentionVariant::kMultiHead:
      return "multi_head";
    case AttentionVariant::kSingleHead:
      return "single_head";
  }
  return "unknown";
}

absl::StatusOr<AttentionVariant> ParseVariant(std::string_view name) {
  if (name == "multi_head") return AttentionVariant::kMultiHead;
  if (name == "single_head") return AttentionVariant::kSingleHead;
  return absl::InvalidArgumentError(absl::StrCat(
      "variant: expected \"multi_head\" or \"single_head\", got \"", std::string(name), "\""));
}

std::string_view ComputeTypeName(ComputeType type) {
  switch (type) {
    case ComputeType::kFloat32:
      return "fp32";
    case ComputeType::kBFloat16:
      return "bf16";
  }
  return "unknown";
}

absl::StatusOr<ComputeType> ParseComputeType(std::string_view name) {
  if (name == "fp32") return ComputeType::kFloat32;
  if (name == "bf16") return ComputeType::kBFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("compute_type: expected \"fp32\" or \"bf16\", got \"", std::string(name), "\""));
}

absl::Status AttentionConfig::Validate() const {
  // Bounded so that every derived size (3·d² weights, h·T·S scores) fits comfortably in int64.
  constexpr int64_t kMaxDModel = 1 << 16;
  if (d_model <= 0 || d_model > kMaxDModel) {
    return absl::InvalidArgumentError(
        absl::StrCat("d_model: expected 1..", kMaxDModel, ", got ", d_model));
  }
  if (num_heads <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_heads: expected > 0, got ", num_heads));
  }
  if (variant == AttentionVariant::kSingleHead && num_heads != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_heads: the single_head variant has exactly 1 head of width d_model, got ", num_heads));
  }
  if (variant != AttentionVariant::kMultiHead && variant != AttentionVariant::kSingleHead) {
    return absl::InvalidArgumentError("variant: expected multi_head or single_head");
  }
  if (d_model % num_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_heads: must divide d_model (", d_model, "), got ", num_heads));
  }
  if (compute_type != ComputeType::kFloat32 && compute_type != ComputeType::kBFloat16) {
    return absl::InvalidArgumentError("compute_type: expected fp32 or bf16");
  }
  return absl::OkStatus();
}

int64_t AttentionConfig::ParameterCount() const {
  const int64_t projections = HasOutputProjection() ? 4 : 3;
  return projections * d_model * d_model + (bias ? projections * d_model : 0);
}

}  // namespace attnserve::core
