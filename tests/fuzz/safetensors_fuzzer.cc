// Fuzzes the safetensors reader (core/model/safetensors_file.h) on a whole file image, in memory
// (ParseSafetensors is what SafetensorsFile::Open runs on the bytes FileBytes read), and what a
// model load does next with an accepted file: ReadFloat32 of every tensor, DetectNaming and
// ReadWeights against the config the file implies, and AttentionLayer::Create.
//
// Invariants, beyond "no crash, no sanitizer report": a refused file is INVALID_ARGUMENT; an
// accepted index is self-consistent (every view inside the image with shape × dtype bytes, Find
// returns it); the writer can write back what the reader accepted and reading that again gives
// the same tensors; weights ReadWeights accepts make a layer, and WeightsToTensors of them reads
// back exactly.
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/forward/attention_config.h"
#include "core/forward/attention_layer.h"
#include "core/forward/attention_weights.h"
#include "core/model/safetensors_file.h"
#include "core/model/safetensors_writer.h"
#include "core/model/weight_naming.h"
#include "tests/fuzz/fuzz_check.h"

namespace attnserve::fuzz {
namespace {

using model::SafetensorsIndex;
using model::TensorDtype;
using model::TensorView;

bool Convertible(TensorDtype dtype) {
  return dtype == TensorDtype::kF32 || dtype == TensorDtype::kF16 || dtype == TensorDtype::kBF16;
}

// Equal bit for bit, except that any NaN equals any NaN (F16/BF16 → fp32 → F16/BF16 need not
// keep a NaN's payload).
bool SameValues(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return false;
  }
  return true;
}

void CheckIndex(std::span<const std::byte> image, const SafetensorsIndex& index) {
  for (const TensorView& tensor : index.tensors) {
    FuzzCheck(index.Find(tensor.name) == &tensor, absl::StrCat("Find(\"", tensor.name, "\")"));
    FuzzCheck(tensor.bytes.data() >= image.data() &&
                  tensor.bytes.data() + tensor.bytes.size() <= image.data() + image.size(),
              absl::StrCat("tensor \"", tensor.name, "\" lies outside the image"));
    FuzzCheck(static_cast<int64_t>(tensor.bytes.size()) ==
                  tensor.num_elements() * model::DtypeSize(tensor.dtype),
              absl::StrCat("tensor \"", tensor.name, "\": bytes != shape × dtype size"));
    absl::StatusOr<std::vector<float>> values = model::ReadFloat32(tensor);
    if (Convertible(tensor.dtype)) {
      FuzzCheck(values.ok() && static_cast<int64_t>(values->size()) == tensor.num_elements(),
                "ReadFloat32 of an F32/F16/BF16 tensor", values.status());
    } else {
      FuzzCheck(values.status().code() == absl::StatusCode::kInvalidArgument,
                "ReadFloat32 of another dtype", values.status());
    }
  }
}

// The writer writes back every index it can represent (F32/F16/BF16 tensors with names), and the
// reader reads the same tensors and metadata from the result.
void CheckRewrite(const SafetensorsIndex& index) {
  std::vector<std::vector<float>> values;
  for (const TensorView& tensor : index.tensors) {
    // The writer refuses empty names on purpose (safetensors_writer.h).
    if (!Convertible(tensor.dtype) || tensor.name.empty()) return;
    values.push_back(*model::ReadFloat32(tensor));
  }
  std::vector<model::TensorToWrite> tensors;
  for (size_t i = 0; i < index.tensors.size(); ++i) {
    const TensorView& t = index.tensors[i];
    tensors.push_back({.name = t.name, .dtype = t.dtype, .shape = t.shape, .values = values[i]});
  }
  absl::StatusOr<std::string> image = model::SerializeSafetensors(tensors, index.metadata);
  FuzzCheck(image.ok(), "SerializeSafetensors of an index the reader accepted", image.status());
  absl::StatusOr<SafetensorsIndex> again =
      model::ParseSafetensors(std::as_bytes(std::span(*image)));
  FuzzCheck(again.ok(), "ParseSafetensors of the writer's output", again.status());
  FuzzCheck(again->tensors.size() == index.tensors.size() && again->metadata == index.metadata,
            "rewritten file: tensor count or metadata differ");
  for (size_t i = 0; i < index.tensors.size(); ++i) {
    const TensorView& a = index.tensors[i];
    const TensorView& b = again->tensors[i];
    FuzzCheck(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape &&
                  SameValues(values[i], *model::ReadFloat32(b)),
              absl::StrCat("rewritten file: tensor \"", a.name, "\" differs"));
  }
}

// The config a model folder holding this file would need: d_model from the first matrix (its
// input width in every naming), bias and output projection from the names present. Two heads
// when d_model is even, so heads are split.
absl::StatusOr<core::AttentionConfig> ImpliedConfig(const SafetensorsIndex& index) {
  int64_t d = 0;
  bool bias = false;
  bool output = false;
  for (const TensorView& t : index.tensors) {
    if (d == 0 && t.shape.size() == 2) d = t.shape[1];
    bias = bias || t.name.starts_with("b_") || t.name.ends_with("bias");
    output = output || t.name == "W_O" || t.name == "out_proj.weight" || t.name == "o_proj.weight";
  }
  // Small layers only: the reader is under test, not oneDNN's packing of big weights.
  if (d < 1 || d > 64) return absl::InvalidArgumentError("no small matrix");
  core::AttentionConfig config{.d_model = d, .num_heads = 1, .bias = bias};
  if (output) {
    config.variant = core::AttentionVariant::kMultiHead;
    config.num_heads = d % 2 == 0 ? 2 : 1;
  } else {
    config.variant = core::AttentionVariant::kSingleHead;
  }
  return config;
}

void CheckWeights(const SafetensorsIndex& index) {
  absl::StatusOr<model::WeightNaming> naming = model::DetectNaming(index);
  if (!naming.ok()) {
    FuzzCheck(naming.status().code() == absl::StatusCode::kInvalidArgument, "DetectNaming",
              naming.status());
    return;
  }
  absl::StatusOr<core::AttentionConfig> config = ImpliedConfig(index);
  if (!config.ok()) return;
  absl::StatusOr<core::AttentionWeights> weights = model::ReadWeights(index, *config, *naming);
  if (!weights.ok()) {
    FuzzCheck(weights.status().code() == absl::StatusCode::kInvalidArgument, "ReadWeights",
              weights.status());
    return;
  }
  FuzzCheck(weights->ValidateFor(*config).ok(), "ReadWeights gave weights its config refuses");
  auto layer = core::AttentionLayer::Create(*config, *weights);
  FuzzCheck(layer.ok() || layer.status().code() == absl::StatusCode::kResourceExhausted,
            "AttentionLayer::Create of weights ReadWeights accepted", layer.status());

  // WeightsToTensors is ReadWeights' inverse: written as F32 and read back, the same weights.
  std::vector<model::NamedTensor> named = model::WeightsToTensors(*config, *weights, *naming);
  std::vector<model::TensorToWrite> tensors;
  for (const model::NamedTensor& t : named) {
    tensors.push_back({.name = t.name, .shape = t.shape, .values = t.values});
  }
  absl::StatusOr<std::string> image = model::SerializeSafetensors(tensors, {});
  FuzzCheck(image.ok(), "SerializeSafetensors of WeightsToTensors", image.status());
  absl::StatusOr<SafetensorsIndex> again =
      model::ParseSafetensors(std::as_bytes(std::span(*image)));
  FuzzCheck(again.ok(), "ParseSafetensors of WeightsToTensors' file", again.status());
  absl::StatusOr<core::AttentionWeights> reread = model::ReadWeights(*again, *config, *naming);
  FuzzCheck(reread.ok(), "ReadWeights of WeightsToTensors' file", reread.status());
  FuzzCheck(SameValues(reread->w_qkv, weights->w_qkv) &&
                SameValues(reread->b_qkv, weights->b_qkv) &&
                SameValues(reread->w_o, weights->w_o) && SameValues(reread->b_o, weights->b_o),
            "WeightsToTensors then ReadWeights changed the weights");
}

}  // namespace
}  // namespace attnserve::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using attnserve::fuzz::FuzzCheck;
  const std::span<const std::byte> image(reinterpret_cast<const std::byte*>(data), size);
  absl::StatusOr<attnserve::model::SafetensorsIndex> index =
      attnserve::model::ParseSafetensors(image);
  if (!index.ok()) {
    // ResourceExhausted: the JSON parser ran out of memory (json_text.h).
    FuzzCheck(index.status().code() == absl::StatusCode::kInvalidArgument ||
                  index.status().code() == absl::StatusCode::kResourceExhausted,
              "a refused file is not INVALID_ARGUMENT", index.status());
    return 0;
  }
  attnserve::fuzz::CheckIndex(image, *index);
  attnserve::fuzz::CheckRewrite(*index);
  attnserve::fuzz::CheckWeights(*index);
  return 0;
}
