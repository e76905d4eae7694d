#include "core/forward/attention_batch.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/forward/finite_values.h"

namespace attnserve::core {
namespace {

absl::Status ValidateRagged(absl::string_view name, const RaggedBatch& batch, int64_t width) {
  if (batch.offsets.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ".offsets: expected at least 2 entries (one sequence), got ", batch.offsets.size()));
  }
  if (batch.offsets[0] != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ".offsets[0]: expected 0, got ", batch.offsets[0]));
  }
  // Compared, never subtracted or multiplied: offsets come from the caller and may be absurd.
  for (int64_t i = 0; i < batch.num_sequences(); ++i) {
    if (batch.offsets[i + 1] <= batch.offsets[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " sequence ", i, ": expected length >= 1, i.e. offsets[", i + 1, "] > offsets[", i,
          "] = ", batch.offsets[i], ", got offsets[", i + 1, "] = ", batch.offsets[i + 1]));
    }
  }
  const uint64_t values = batch.data.size();
  if (values % static_cast<uint64_t>(width) != 0 ||
      static_cast<uint64_t>(batch.rows()) != values / static_cast<uint64_t>(width)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".data: expected offsets.back() (",
                                                   batch.rows(), ") rows x ", width,
                                                   " values, got ", values, " values"));
  }
  if (const int64_t bad = FindNonFinite(batch.data); bad >= 0) {
    const int64_t row = bad / width;
    return absl::InvalidArgumentError(absl::StrCat(
        name, ".data[", bad, "] (sequence ", batch.SequenceOfRow(row), ", row ", row, ", column ",
        bad % width, "): expected a finite value, got ", batch.data[bad]));
  }
  return absl::OkStatus();
}

// Σ T_i·S_i, or an error if it (or num_heads times it) does not fit in int64. Row counts are
// bounded by the data size at this point, but their products are not.
absl::Status CheckScoreSize(const AttentionInputs& in, int64_t num_heads) {
  int64_t total = 0;
  for (int64_t i = 0; i < in.query.num_sequences(); ++i) {
    int64_t product = 0;
    if (__builtin_mul_overflow(in.query.length(i), KeyLength(in, i), &product) ||
        __builtin_add_overflow(total, product, &total) ||
        __builtin_mul_overflow(total, num_heads, &product)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "query/memory lengths: num_heads * sum of T_i*S_i overflows at sequence ", i));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t ScoreElements(const AttentionInputs& in, int64_t first, int64_t end) {
  int64_t total = 0;
  for (int64_t i = first; i < end; ++i) {
    total += in.query.length(i) * KeyLength(in, i);
  }
  return total;
}

absl::Status ValidateBatch(const AttentionConfig& config, const AttentionInputs& in,
                           const AttentionOutputs& out) {
  if (auto s = config.Validate(); !s.ok()) return s;
  const int64_t d = config.d_model;
  if (auto s = ValidateRagged("query", in.query, d); !s.ok()) return s;
  if (in.memory) {
    if (auto s = ValidateRagged("memory", *in.memory, d); !s.ok()) return s;
    if (in.memory->num_sequences() != in.query.num_sequences()) {
      return absl::InvalidArgumentError(
          absl::StrCat("memory: expected one sequence per query sequence (",
                       in.query.num_sequences(), "), got ", in.memory->num_sequences()));
    }
  }
  if (auto s = CheckScoreSize(in, config.num_heads); !s.ok()) return s;
  const int64_t scores = ScoreElements(in);
  if (!in.mask.explicit_mask.empty() &&
      static_cast<int64_t>(in.mask.explicit_mask.size()) != scores) {
    return absl::InvalidArgumentError(
        absl::StrCat("mask.explicit_mask: expected sum of T_i*S_i = ", scores, " entries, got ",
                     in.mask.explicit_mask.size()));
  }
  if (!in.head_mask.empty() && static_cast<int64_t>(in.head_mask.size()) != config.num_heads) {
    return absl::InvalidArgumentError(absl::StrCat("head_mask: expected ", config.num_heads,
                                                   " entries (one per head), got ",
                                                   in.head_mask.size()));
  }
  const int64_t out_size = in.query.rows() * d;
  if (static_cast<int64_t>(out.output.size()) != out_size) {
    return absl::InvalidArgumentError(absl::StrCat("output: expected ", in.query.rows(), " x ", d,
                                                   " = ", out_size, " floats, got ",
                                                   out.output.size()));
  }
  const int64_t weights_size = config.num_heads * scores;
  if (!out.weights.empty() && static_cast<int64_t>(out.weights.size()) != weights_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights: expected num_heads * sum of T_i*S_i = ", weights_size,
                     " floats, got ", out.weights.size()));
  }
  return absl::OkStatus();
}

}  // namespace attnserve::core
