#include "tests/reference/reference_attention.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnserve::reference {
namespace {

absl::Status Invalid(const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("reference: ", message));
}

absl::Status CheckSize(const char* name, size_t actual, size_t expected) {
  if (actual == expected) return absl::OkStatus();
  return Invalid(absl::StrCat(name, " has ", actual, " values, expected ", expected));
}

absl::Status CheckRagged(const char* name, const core::RaggedBatch& batch, int64_t width) {
  if (batch.offsets.size() < 2) return Invalid(absl::StrCat(name, ": no sequences"));
  if (batch.offsets[0] != 0) return Invalid(absl::StrCat(name, ": offsets[0] != 0"));
  for (size_t i = 1; i < batch.offsets.size(); ++i) {
    if (batch.offsets[i] <= batch.offsets[i - 1]) {
      return Invalid(absl::StrCat(name, ": offsets not strictly increasing at ", i));
    }
  }
  // Divide instead of multiplying so that absurd offsets cannot overflow.
  const int64_t rows = batch.offsets.back();
  if (batch.data.size() % static_cast<size_t>(width) != 0 ||
      static_cast<int64_t>(batch.data.size() / static_cast<size_t>(width)) != rows) {
    return Invalid(absl::StrCat(name, ": data has ", batch.data.size(), " values for ", rows,
                                " rows of width ", width));
  }
  return absl::OkStatus();
}

// out[rows, cols] = x[rows, k] · w[:, col0 .. col0 + cols) + bias[col0 ..]; x rows start at row0
// of a row-major matrix of width k, w is row-major with leading dimension ld. Loops in i-k-j
// order so that the inner loop walks contiguous memory.
std::vector<double> Project(std::span<const float> x, int64_t row0, int64_t rows, int64_t k,
                            std::span<const float> w, int64_t ld, int64_t col0, int64_t cols,
                            std::span<const float> bias) {
  std::vector<double> out(static_cast<size_t>(rows * cols), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    double* out_row = out.data() + i * cols;
    if (!bias.empty()) {
      for (int64_t j = 0; j < cols; ++j) out_row[j] = static_cast<double>(bias[col0 + j]);
    }
    const float* x_row = x.data() + (row0 + i) * k;
    for (int64_t p = 0; p < k; ++p) {
      const double xv = static_cast<double>(x_row[p]);
      const float* w_row = w.data() + p * ld + col0;
      for (int64_t j = 0; j < cols; ++j) out_row[j] += xv * static_cast<double>(w_row[j]);
    }
  }
  return out;
}

// Same as Project, but for a double-precision left operand (the concatenated heads).
void ProjectConcat(const std::vector<double>& concat, int64_t rows, int64_t d,
                   std::span<const float> w, std::span<const float> bias, double* out) {
  for (int64_t i = 0; i < rows; ++i) {
    double* out_row = out + i * d;
    for (int64_t j = 0; j < d; ++j) out_row[j] = bias.empty() ? 0.0 : static_cast<double>(bias[j]);
    const double* c_row = concat.data() + i * d;
    for (int64_t p = 0; p < d; ++p) {
      const double cv = c_row[p];
      const float* w_row = w.data() + p * d;
      for (int64_t j = 0; j < d; ++j) out_row[j] += cv * static_cast<double>(w_row[j]);
    }
  }
}

}  // namespace

absl::StatusOr<ReferenceOutputs> Attention(const core::AttentionConfig& config,
                                           const core::AttentionWeights& weights,
                                           const core::AttentionInputs& in) {
  const int64_t d = config.d_model;
  const int64_t h = config.num_heads;
  const bool multi_head = config.variant == core::AttentionVariant::kMultiHead;
  if (d <= 0) return Invalid("d_model must be positive");
  if (h <= 0 || d % h != 0) return Invalid("num_heads must be positive and divide d_model");
  if (!multi_head && h != 1) return Invalid("single_head needs num_heads == 1");

  const size_t dd = static_cast<size_t>(d * d);
  const size_t bias_size = config.bias ? static_cast<size_t>(d) : 0;
  if (auto s = CheckSize("w_qkv", weights.w_qkv.size(), 3 * dd); !s.ok()) return s;
  if (auto s = CheckSize("b_qkv", weights.b_qkv.size(), 3 * bias_size); !s.ok()) return s;
  if (auto s = CheckSize("w_o", weights.w_o.size(), multi_head ? dd : 0); !s.ok()) return s;
  if (auto s = CheckSize("b_o", weights.b_o.size(), multi_head ? bias_size : 0); !s.ok()) return s;

  if (auto s = CheckRagged("query", in.query, d); !s.ok()) return s;
  const core::RaggedBatch& source = in.memory ? *in.memory : in.query;
  if (in.memory) {
    if (auto s = CheckRagged("memory", *in.memory, d); !s.ok()) return s;
    if (in.memory->offsets.size() != in.query.offsets.size()) {
      return Invalid("memory and query have different sequence counts");
    }
  }
  const size_t num_sequences = in.query.offsets.size() - 1;
  int64_t total_scores = 0;
  for (size_t n = 0; n < num_sequences; ++n) {
    total_scores += (in.query.offsets[n + 1] - in.query.offsets[n]) *
                    (source.offsets[n + 1] - source.offsets[n]);
  }
  const bool has_explicit = !in.mask.explicit_mask.empty();
  if (has_explicit) {
    if (auto s = CheckSize("explicit_mask", in.mask.explicit_mask.size(),
                           static_cast<size_t>(total_scores));
        !s.ok()) {
      return s;
    }
  }
  if (!in.head_mask.empty()) {
    if (auto s = CheckSize("head_mask", in.head_mask.size(), static_cast<size_t>(h)); !s.ok()) {
      return s;
    }
  }

  const int64_t dk = d / h;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
  const std::span<const float> w_qkv(weights.w_qkv);
  const std::span<const float> b_qkv(weights.b_qkv);

  ReferenceOutputs result;
  result.output.assign(static_cast<size_t>(in.query.offsets.back() * d), 0.0);
  result.weights.assign(static_cast<size_t>(h * total_scores), 0.0);

  int64_t score_offset = 0;  // Σ T·S of the sequences before this one.
  std::vector<double> scores, probabilities;
  std::vector<char> visible;
  for (size_t n = 0; n < num_sequences; ++n) {
    const int64_t q0 = in.query.offsets[n];
    const int64_t t = in.query.offsets[n + 1] - q0;
    const int64_t k0 = source.offsets[n];
    const int64_t s = source.offsets[n + 1] - k0;

    // Q [t, d]; K and V [s, d]. b_qkv (empty without bias) is b_Q | b_K | b_V, so each block's
    // bias starts at the same column as the block.
    const std::vector<double> q = Project(in.query.data, q0, t, d, w_qkv, 3 * d, 0, d, b_qkv);
    const std::vector<double> k = Project(source.data, k0, s, d, w_qkv, 3 * d, d, d, b_qkv);
    const std::vector<double> v = Project(source.data, k0, s, d, w_qkv, 3 * d, 2 * d, d, b_qkv);

    std::vector<double> concat(static_cast<size_t>(t * d), 0.0);
    scores.resize(static_cast<size_t>(s));
    probabilities.resize(static_cast<size_t>(s));
    visible.resize(static_cast<size_t>(s));
    for (int64_t head = 0; head < h; ++head) {
      const bool enabled = in.head_mask.empty() || in.head_mask[head];
      if (!enabled) continue;  // Weights and head output stay zero.
      double* head_weights = result.weights.data() + h * score_offset + head * t * s;
      for (int64_t i = 0; i < t; ++i) {
        const double* q_row = q.data() + i * d + head * dk;
        double max_score = -std::numeric_limits<double>::infinity();
        bool any_visible = false;
        for (int64_t j = 0; j < s; ++j) {
          bool open = !in.mask.causal || j <= i;
          if (has_explicit) open = open && in.mask.explicit_mask[score_offset + i * s + j] != 0;
          visible[j] = open;
          if (!open) continue;
          const double* k_row = k.data() + j * d + head * dk;
          double dot = 0.0;
          for (int64_t c = 0; c < dk; ++c) dot += q_row[c] * k_row[c];
          scores[j] = dot * scale;
          any_visible = true;
          if (scores[j] > max_score) max_score = scores[j];
        }
        if (!any_visible) continue;  // Every key blocked: zero weights, zero head output.
        double sum = 0.0;
        for (int64_t j = 0; j < s; ++j) {
          probabilities[j] = visible[j] ? std::exp(scores[j] - max_score) : 0.0;
          sum += probabilities[j];
        }
        double* out_row = concat.data() + i * d + head * dk;
        for (int64_t j = 0; j < s; ++j) {
          const double p = probabilities[j] / sum;
          head_weights[i * s + j] = p;
          if (p == 0.0) continue;
          const double* v_row = v.data() + j * d + head * dk;
          for (int64_t c = 0; c < dk; ++c) out_row[c] += p * v_row[c];
        }
      }
    }

    double* out = result.output.data() + q0 * d;
    if (multi_head) {
      ProjectConcat(concat, t, d, weights.w_o, weights.b_o, out);
    } else {
      for (int64_t e = 0; e < t * d; ++e) out[e] = concat[e];
    }
    score_offset += t * s;
  }
  return result;
}

}  // namespace attnserve::reference
