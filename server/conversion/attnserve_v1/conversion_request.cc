// conversion.h, request side: AttendRequest → AttendWork, every field validated.
#include <algorithm>
#include <bit>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/forward/attention_config.h"
#include "core/forward/finite_values.h"
#include "core/util/checked_math.h"
#include "core/util/float_format.h"
#include "server/conversion/attnserve_v1/conversion.h"
#include "server/conversion/attnserve_v1/conversion_internal.h"

namespace attnserve::server {
namespace {

using ::attnserve::CheckedProduct;
using conversion_internal::Internal;
using conversion_internal::Invalid;
using conversion_internal::kFloatBytes;

// A hostile shape may have millions of dims; messages show only the first few.
constexpr int kMaxShownDims = 6;

std::string OfModel(const model::Model& model) {
  return absl::StrCat("of model \"", model.name, "\"");
}

std::string FormatShape(const v1::Tensor& tensor) {
  std::string text = "[";
  for (int i = 0; i < tensor.shape_size() && i < kMaxShownDims; ++i) {
    absl::StrAppend(&text, i == 0 ? "" : ", ", tensor.shape(i));
  }
  if (tensor.shape_size() > kMaxShownDims) absl::StrAppend(&text, ", ...");
  return absl::StrCat(text, "]");
}

// "[b, t, c]" for a batched request, "[t, c]" otherwise: an element's position in the request.
std::string Position(bool batched, int64_t sequence, int64_t row, int64_t column) {
  if (!batched) return absl::StrCat("[", row, ", ", column, "]");
  return absl::StrCat("[", sequence, ", ", row, ", ", column, "]");
}

// A checked tensor's elements as bytes, whichever of values / raw holds them, and their encoding.
struct FloatData {
  const char* bytes;
  FloatFormat format;
  int64_t element_bytes() const { return FloatFormatBytes(format); }
};

FloatData DataOf(const v1::Tensor& tensor) {
  if (tensor.raw().empty()) {
    return {reinterpret_cast<const char*>(tensor.values().data()), FloatFormat::kFloat32};
  }
  // CheckData has refused unknown dtypes.
  return {tensor.raw().data(), *conversion_internal::FormatOf(tensor.dtype())};
}

absl::Status CheckDimsPositive(const std::string& name, const v1::Tensor& tensor) {
  for (int i = 0; i < tensor.shape_size(); ++i) {
    if (tensor.shape(i) <= 0) {
      return Invalid(name, ".shape[", i, "]: expected > 0, got ", tensor.shape(i));
    }
  }
  return absl::OkStatus();
}

// Exactly one of values / raw, raw in a known dtype (and values with the default one), and as many
// elements as the shape (already checked: every dim > 0) implies.
absl::Status CheckData(const std::string& name, const v1::Tensor& tensor) {
  const bool has_values = tensor.values_size() > 0;
  const bool has_raw = !tensor.raw().empty();
  if (has_values == has_raw) {
    return Invalid(name, ": expected exactly one of values or raw, got ",
                   has_values ? absl::StrCat("both (", tensor.values_size(), " values and ",
                                             tensor.raw().size(), " raw bytes)")
                              : "neither");
  }
  const std::optional<FloatFormat> format = conversion_internal::FormatOf(tensor.dtype());
  if (!format) {
    return Invalid(name, ".dtype: expected DATA_TYPE_FP32 (0), DATA_TYPE_BF16 (1) or ",
                   "DATA_TYPE_FP16 (2), got ", static_cast<int>(tensor.dtype()));
  }
  if (has_values && *format != FloatFormat::kFloat32) {
    return Invalid(name, ".dtype: expected DATA_TYPE_FP32 with values (dtype encodes raw), got ",
                   v1::DataType_Name(tensor.dtype()));
  }
  const std::optional<int64_t> elements =
      CheckedProduct(std::span<const int64_t>(tensor.shape().data(), tensor.shape_size()));
  if (has_raw) {
    const int64_t element_bytes = FloatFormatBytes(*format);
    const std::optional<int64_t> expected =
        elements ? CheckedProduct({*elements, element_bytes}) : std::nullopt;
    if (expected && *expected == static_cast<int64_t>(tensor.raw().size())) {
      return absl::OkStatus();
    }
    return Invalid(name, ".raw: expected ",
                   expected ? absl::StrCat(*expected) : std::string("more than 2^63"), " bytes (",
                   elements ? absl::StrCat(*elements) : std::string("more than 2^63"), " ",
                   v1::DataType_Name(tensor.dtype()), " elements of shape ", FormatShape(tensor),
                   ", ", element_bytes, " bytes each), got ", tensor.raw().size(), " bytes");
  }
  if (elements && *elements == tensor.values_size()) return absl::OkStatus();
  return Invalid(name, ".values: expected ",
                 elements ? absl::StrCat(*elements) : std::string("more than 2^63"),
                 " elements (the product of shape ", FormatShape(tensor), "), got ",
                 tensor.values_size());
}

// The first lengths[b] rows of every padded [padded, width] block of `tensor`, packed row-wise.
std::vector<float> PackRows(const v1::Tensor& tensor, const std::vector<int64_t>& lengths,
                            int64_t padded, int64_t width) {
  int64_t rows = 0;
  for (int64_t length : lengths) rows += length;
  std::vector<float> packed(static_cast<size_t>(rows * width));
  const FloatData source = DataOf(tensor);
  float* destination = packed.data();
  for (size_t b = 0; b < lengths.size(); ++b) {
    const int64_t block = static_cast<int64_t>(b) * padded * width;
    DecodeFloats(source.bytes + block * source.element_bytes(), lengths[b] * width, source.format,
                 destination);
    destination += lengths[b] * width;
  }
  return packed;
}

// OK if every packed value is finite; otherwise names the first bad one by its request position.
absl::Status CheckFinite(const std::string& name, const std::vector<float>& packed,
                         const std::vector<int64_t>& lengths, int64_t width, bool batched) {
  const int64_t bad = core::FindNonFinite(packed);
  if (bad < 0) return absl::OkStatus();
  int64_t row = bad / width;
  size_t sequence = 0;
  while (row >= lengths[sequence]) row -= lengths[sequence++];
  return Invalid(name, Position(batched, static_cast<int64_t>(sequence), row, bad % width),
                 ": expected a finite value, got ", packed[bad]);
}

// `lengths` resolved against B sequences of padded length `padded`: empty means all full length.
absl::StatusOr<std::vector<int64_t>> ResolveLengths(
    const std::string& field, const google::protobuf::RepeatedField<int32_t>& given, int64_t batch,
    int64_t padded, const std::string& padded_name) {
  if (given.empty()) return std::vector<int64_t>(static_cast<size_t>(batch), padded);
  if (given.size() != batch) {
    return Invalid(field, ": expected ", batch, " entries (one per sequence) or none, got ",
                   given.size());
  }
  std::vector<int64_t> lengths(given.begin(), given.end());
  for (int64_t i = 0; i < batch; ++i) {
    if (lengths[i] < 1 || lengths[i] > padded) {
      return Invalid(field, "[", i, "]: expected 1..", padded, " (", padded_name, "), got ",
                     lengths[i]);
    }
  }
  return lengths;
}

// Everything ParseAttendRequest has established so far; its steps read and extend it.
struct ParseState {
  const v1::AttendRequest& request;
  const model::Model& model;
  const ModelLimits& limits;
  int64_t d_model = 0;
  int64_t num_heads = 0;
  bool batched = false;
  int64_t batch = 1;
  int64_t query_length = 0;   // padded T
  int64_t memory_length = 0;  // padded S (T without memory)
  std::vector<int64_t> query_lengths = {};
  std::vector<int64_t> memory_lengths = {};  // T_i without memory
};

absl::Status CheckSequenceLimit(const ParseState& state, const std::string& field, int64_t length) {
  if (length <= state.limits.request.max_sequence_length) return absl::OkStatus();
  return Invalid(field, ": expected a sequence length <= max_sequence_length ",
                 state.limits.request.max_sequence_length, " ", OfModel(state.model), ", got ",
                 length);
}

absl::Status CheckInput(ParseState& state) {
  if (!state.request.has_input()) {
    return Invalid("input: expected a [T, d_model] or [B, T, d_model] tensor, got none");
  }
  const v1::Tensor& input = state.request.input();
  const int rank = input.shape_size();
  if (rank != 2 && rank != 3) {
    return Invalid("input.shape: expected rank 2 ([T, d_model]) or 3 ([B, T, d_model]), got rank ",
                   rank, " ", FormatShape(input));
  }
  if (auto s = CheckDimsPositive("input", input); !s.ok()) return s;
  if (input.shape(rank - 1) != state.d_model) {
    return Invalid("input.shape[", rank - 1, "]: expected d_model ", state.d_model, " ",
                   OfModel(state.model), ", got ", input.shape(rank - 1));
  }
  state.batched = rank == 3;
  state.batch = state.batched ? input.shape(0) : 1;
  state.query_length = input.shape(rank - 2);
  if (state.batch > state.limits.batching.max_batch_sequences) {
    return Invalid("input.shape[0]: expected a batch size <= max_batch_sequences ",
                   state.limits.batching.max_batch_sequences, " ", OfModel(state.model), ", got ",
                   state.batch);
  }
  const std::string t_field = absl::StrCat("input.shape[", rank - 2, "]");
  if (auto s = CheckSequenceLimit(state, t_field, state.query_length); !s.ok()) return s;
  return CheckData("input", input);
}

absl::Status CheckLengths(ParseState& state) {
  auto lengths = ResolveLengths("lengths", state.request.lengths(), state.batch, state.query_length,
                                "T, the input's padded length");
  if (!lengths.ok()) return lengths.status();
  state.query_lengths = *std::move(lengths);
  int64_t tokens = 0;
  for (int64_t length : state.query_lengths) tokens += length;
  if (tokens > state.limits.batching.max_batch_tokens) {
    return Invalid("lengths: expected a total of valid input rows <= max_batch_tokens ",
                   state.limits.batching.max_batch_tokens, " ", OfModel(state.model), ", got ",
                   tokens);
  }
  return absl::OkStatus();
}

absl::Status CheckMemoryShape(const ParseState& state, const v1::Tensor& memory) {
  const int rank = memory.shape_size();
  const int input_rank = state.batched ? 3 : 2;
  if (rank != input_rank) {
    return Invalid("memory.shape: expected rank ", input_rank, " (the input's rank), got rank ",
                   rank, " ", FormatShape(memory));
  }
  if (auto s = CheckDimsPositive("memory", memory); !s.ok()) return s;
  if (memory.shape(rank - 1) != state.d_model) {
    return Invalid("memory.shape[", rank - 1, "]: expected d_model ", state.d_model, " ",
                   OfModel(state.model), ", got ", memory.shape(rank - 1));
  }
  if (state.batched && memory.shape(0) != state.batch) {
    return Invalid("memory.shape[0]: expected ", state.batch, " (B, the input's batch size), got ",
                   memory.shape(0));
  }
  return CheckSequenceLimit(state, absl::StrCat("memory.shape[", rank - 2, "]"),
                            memory.shape(rank - 2));
}

absl::Status CheckMemory(ParseState& state) {
  if (!state.request.has_memory()) {
    if (!state.request.memory_lengths().empty()) {
      return Invalid("memory_lengths: expected none without memory (self-attention), got ",
                     state.request.memory_lengths_size(), " entries");
    }
    state.memory_length = state.query_length;
    state.memory_lengths = state.query_lengths;
    return absl::OkStatus();
  }
  const v1::Tensor& memory = state.request.memory();
  if (auto s = CheckMemoryShape(state, memory); !s.ok()) return s;
  if (auto s = CheckData("memory", memory); !s.ok()) return s;
  state.memory_length = memory.shape(memory.shape_size() - 2);
  auto lengths = ResolveLengths("memory_lengths", state.request.memory_lengths(), state.batch,
                                state.memory_length, "S, the memory's padded length");
  if (!lengths.ok()) return lengths.status();
  state.memory_lengths = *std::move(lengths);
  return absl::OkStatus();
}

absl::Status CheckAttnMaskShape(const ParseState& state, const v1::Tensor& mask) {
  const int rank = state.batched ? 3 : 2;
  if (mask.shape_size() != rank) {
    return Invalid("attn_mask.shape: expected rank ", rank,
                   state.batched ? " ([B, T, S])" : " ([T, S])", ", got rank ", mask.shape_size(),
                   " ", FormatShape(mask));
  }
  const std::string s_name = state.request.has_memory() ? "S, the memory's padded length"
                                                        : "S = T, the input's padded length";
  const int64_t expected[] = {state.batch, state.query_length, state.memory_length};
  const std::string names[] = {"B, the input's batch size", "T, the input's padded length", s_name};
  for (int i = 0; i < rank; ++i) {
    const int j = i + 3 - rank;  // index into expected / names
    if (mask.shape(i) != expected[j]) {
      return Invalid("attn_mask.shape[", i, "]: expected ", expected[j], " (", names[j], "), got ",
                     mask.shape(i));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const ParseState& state) {
  const int mask = static_cast<int>(state.request.mask());
  if (mask != v1::MASK_NONE && mask != v1::MASK_CAUSAL) {
    return Invalid("mask: expected MASK_NONE (0) or MASK_CAUSAL (1), got ", mask);
  }
  if (state.request.has_attn_mask()) {
    if (auto s = CheckAttnMaskShape(state, state.request.attn_mask()); !s.ok()) return s;
    if (auto s = CheckData("attn_mask", state.request.attn_mask()); !s.ok()) return s;
  }
  if (auto s = conversion_internal::CheckOutputDtype("raw_output_dtype", state.request.raw_output(),
                                                     state.request.raw_output_dtype());
      !s.ok()) {
    return s;
  }
  const int heads = state.request.head_mask_size();
  if (heads != 0 && heads != state.num_heads) {
    return Invalid("head_mask: expected none or ", state.num_heads, " entries (num_heads ",
                   OfModel(state.model), "), got ", heads);
  }
  return absl::OkStatus();
}

// The padded response (output, plus weights if asked for) must fit the limit and a protobuf.
absl::Status CheckResponseSize(const ParseState& state) {
  const auto output = CheckedProduct({state.batch, state.query_length, state.d_model, kFloatBytes});
  std::optional<int64_t> weights = 0;
  if (state.request.return_weights()) {
    weights = CheckedProduct(
        {state.batch, state.num_heads, state.query_length, state.memory_length, kFloatBytes});
  }
  int64_t total = 0;
  const bool overflow = !output || !weights || __builtin_add_overflow(*output, *weights, &total);
  const int64_t limit = std::min(state.limits.request.max_response_bytes, kMaxMessageBytes);
  if (!overflow && total <= limit) return absl::OkStatus();
  return Invalid(
      "response size (input.shape, memory.shape, return_weights): expected <= "
      "max_response_bytes ",
      limit, " ", OfModel(state.model), ", got ", overflow ? "more than 2^63" : absl::StrCat(total),
      " bytes (padded output plus padded weights when return_weights)");
}

// attn_mask, checked finite on its valid entries, as one [T_i, S_i] block per sequence.
absl::StatusOr<std::vector<uint8_t>> PackAttnMask(const ParseState& state) {
  const v1::Tensor& tensor = state.request.attn_mask();
  const FloatData source = DataOf(tensor);
  const int64_t t_pad = state.query_length;
  const int64_t s_pad = state.memory_length;
  std::vector<float> row(static_cast<size_t>(s_pad));
  int64_t entries = 0;  // at most the tensor's size: T_i <= T and S_i <= S
  for (int64_t b = 0; b < state.batch; ++b) {
    entries += state.query_lengths[b] * state.memory_lengths[b];
  }
  std::vector<uint8_t> mask;
  mask.reserve(static_cast<size_t>(entries));
  for (int64_t b = 0; b < state.batch; ++b) {
    const int64_t keys = state.memory_lengths[b];
    for (int64_t t = 0; t < state.query_lengths[b]; ++t) {
      DecodeFloats(source.bytes + ((b * t_pad + t) * s_pad) * source.element_bytes(), keys,
                   source.format, row.data());
      const int64_t bad = core::FindNonFinite(std::span(row.data(), keys));
      if (bad >= 0) {
        return Invalid("attn_mask", Position(state.batched, b, t, bad),
                       ": expected a finite value, got ", row[bad]);
      }
      for (int64_t s = 0; s < keys; ++s) mask.push_back(row[s] != 0.0f ? 1 : 0);
    }
  }
  return mask;
}

// Packs the checked request into `work`, checking that every valid value is finite.
absl::Status Pack(const ParseState& state, AttendWork& work) {
  const v1::AttendRequest& request = state.request;
  work.query = PackRows(request.input(), state.query_lengths, state.query_length, state.d_model);
  if (auto s = CheckFinite("input", work.query, state.query_lengths, state.d_model, state.batched);
      !s.ok()) {
    return s;
  }
  work.query_lengths = state.query_lengths;
  work.cross_attention = request.has_memory();
  if (work.cross_attention) {
    work.memory =
        PackRows(request.memory(), state.memory_lengths, state.memory_length, state.d_model);
    if (auto s =
            CheckFinite("memory", work.memory, state.memory_lengths, state.d_model, state.batched);
        !s.ok()) {
      return s;
    }
    work.memory_lengths = state.memory_lengths;
  }
  if (request.has_attn_mask()) {
    auto mask = PackAttnMask(state);
    if (!mask.ok()) return mask.status();
    work.explicit_mask = *std::move(mask);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AttendWork> ParseAttendRequest(const v1::AttendRequest& request,
                                              std::shared_ptr<const model::Model> model,
                                              const ModelLimits& limits) {
  if (model == nullptr || model->layer == nullptr) {
    return Internal("ParseAttendRequest: expected a loaded model, got none");
  }
  ParseState state{.request = request,
                   .model = *model,
                   .limits = limits,
                   .d_model = model->config.attention.d_model,
                   .num_heads = model->config.attention.num_heads};
  // Shapes, counts and limits first (cheap, and they bound every size used later); the scan of
  // every value last.
  for (auto* step : {&CheckInput, &CheckLengths, &CheckMemory}) {
    if (auto s = step(state); !s.ok()) return s;
  }
  if (auto s = CheckOptions(state); !s.ok()) return s;
  if (auto s = CheckResponseSize(state); !s.ok()) return s;
  AttendWork work;
  if (auto s = Pack(state, work); !s.ok()) return s;
  work.causal = request.mask() == v1::MASK_CAUSAL;
  work.head_mask.assign(request.head_mask().begin(), request.head_mask().end());
  work.return_weights = request.return_weights();
  work.batched = state.batched;
  work.padded_query_length = state.query_length;
  work.padded_memory_length = state.memory_length;
  work.raw_output = request.raw_output();
  work.raw_output_format = *conversion_internal::FormatOf(request.raw_output_dtype());
  work.request_id = request.request_id();
  work.model = std::move(model);
  return work;
}

namespace conversion_internal {

absl::Status CheckOutputDtype(const std::string& name, bool raw_output, int dtype) {
  const std::optional<FloatFormat> output_format = FormatOf(dtype);
  if (!output_format) {
    return Invalid(name, ": expected DATA_TYPE_FP32 (0), DATA_TYPE_BF16 (1) or ",
                   "DATA_TYPE_FP16 (2), got ", dtype);
  }
  if (*output_format != FloatFormat::kFloat32 && !raw_output) {
    return Invalid(name, ": expected DATA_TYPE_FP32 without raw_output (it encodes the ",
                   "answer's raw bytes), got ",
                   v1::DataType_Name(static_cast<v1::DataType>(dtype)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> DecodeRows(const std::string& name, const v1::Tensor& tensor,
                                              int64_t width, const std::string& width_name) {
  if (tensor.shape_size() != 2) {
    return Invalid(name, ".shape: expected rank 2 ([rows, ", width_name, "]), got rank ",
                   tensor.shape_size(), " ", FormatShape(tensor));
  }
  if (auto s = CheckDimsPositive(name, tensor); !s.ok()) return s;
  if (tensor.shape(1) != width) {
    return Invalid(name, ".shape[1]: expected ", width_name, " ", width, ", got ", tensor.shape(1));
  }
  if (auto s = CheckData(name, tensor); !s.ok()) return s;
  const std::vector<int64_t> lengths = {tensor.shape(0)};
  std::vector<float> rows = PackRows(tensor, lengths, tensor.shape(0), width);
  if (auto s = CheckFinite(name, rows, lengths, width, /*batched=*/false); !s.ok()) return s;
  return rows;
}

}  // namespace conversion_internal

}  // namespace attnserve::server
