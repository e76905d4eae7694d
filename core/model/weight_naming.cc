#include "core/model/weight_naming.h"

#include <algorithm>
#include <array>
#include <span>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/forward/finite_values.h"

namespace attnserve::model {
namespace {

// Names whose presence identifies each scheme. out_proj.* is shared by torch and split naming,
// so it identifies neither.
constexpr std::array<std::string_view, 8> kSeedMarkers = {"W_Q", "W_K", "W_V", "W_O",
                                                          "b_Q", "b_K", "b_V", "b_O"};
constexpr std::array<std::string_view, 2> kTorchMarkers = {"in_proj_weight", "in_proj_bias"};
constexpr std::array<std::string_view, 8> kSplitMarkers = {
    "q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
    "v_proj.weight", "v_proj.bias", "o_proj.weight", "o_proj.bias"};

// The first marker of `markers` present in `index`, or empty.
std::string_view FirstPresent(const SafetensorsIndex& index,
                              std::span<const std::string_view> markers) {
  for (std::string_view name : markers) {
    if (index.Find(name) != nullptr) return name;
  }
  return {};
}

// "[3, 7]" for flat index `flat` of a tensor with `shape`.
std::string MultiIndex(int64_t flat, std::span<const int64_t> shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    index[i] = flat % shape[i];
    flat /= shape[i];
  }
  return FormatShape(index);
}

// A short explanation for a tensor the config does not use.
std::string WhyUnexpected(std::string_view name, const core::AttentionConfig& config,
                          WeightNaming naming, const std::vector<ExpectedTensor>& expected) {
  const bool is_bias = name.starts_with("b_") || name.ends_with("bias");
  if (is_bias && !config.bias) return "config.json has \"bias\": false";
  const bool is_output = name == "W_O" || name == "b_O" || name.starts_with("out_proj.") ||
                         name.starts_with("o_proj.");
  if (is_output && !config.HasOutputProjection()) {
    return "the single_head variant has no output projection";
  }
  std::vector<std::string> names;
  for (const ExpectedTensor& t : expected) names.push_back(t.name);
  return absl::StrCat(std::string(NamingName(naming)),
                      " naming for this config uses: ", absl::StrJoin(names, ", "));
}

// Reads `tensor` as finite fp32 values with the expected shape.
absl::StatusOr<std::vector<float>> ReadChecked(const TensorView& tensor,
                                               const ExpectedTensor& expected,
                                               const core::AttentionConfig& config) {
  if (tensor.shape != expected.shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor \"", tensor.name, "\" has shape ", FormatShape(tensor.shape), ", expected ",
        FormatShape(expected.shape), " (d_model ", config.d_model, " from config.json)"));
  }
  absl::StatusOr<std::vector<float>> values = ReadFloat32(tensor);
  if (!values.ok()) return values.status();
  if (const int64_t bad = core::FindNonFinite(*values); bad >= 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor \"", tensor.name, "\" element ",
                                                   MultiIndex(bad, tensor.shape), " is ",
                                                   (*values)[bad], "; weights must be finite"));
  }
  return values;
}

// Split naming accepts o_proj.* (Llama-style) for out_proj.*.
void ApplyOutputAlias(const SafetensorsIndex& index, std::vector<ExpectedTensor>& expected) {
  if (index.Find("out_proj.weight") != nullptr || index.Find("o_proj.weight") == nullptr) return;
  for (ExpectedTensor& t : expected) {
    // StrCat rather than std::string::replace or operator+: GCC 12 reports a false -Wrestrict
    // on both (under -fsanitize=address, or inlined at -O2).
    if (t.name.starts_with("out_proj.")) {
      t.name = absl::StrCat("o", absl::string_view(t.name).substr(3));
    }
  }
}

}  // namespace

std::string_view NamingName(WeightNaming naming) {
  switch (naming) {
    case WeightNaming::kSeed:
      return "seed";
    case WeightNaming::kTorch:
      return "torch";
    case WeightNaming::kSplit:
      return "split";
  }
  return "unknown";
}

absl::StatusOr<WeightNaming> ParseNaming(std::string_view name) {
  for (WeightNaming n : {WeightNaming::kSeed, WeightNaming::kTorch, WeightNaming::kSplit}) {
    if (name == NamingName(n)) return n;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("naming: expected seed, torch or split, got \"", std::string(name), "\""));
}

std::vector<ExpectedTensor> ExpectedTensors(const core::AttentionConfig& config,
                                            WeightNaming naming) {
  const int64_t d = config.d_model;
  const bool o = config.HasOutputProjection();
  const bool b = config.bias;
  std::vector<ExpectedTensor> t;
  switch (naming) {
    case WeightNaming::kSeed:
      for (const char* w : {"W_Q", "W_K", "W_V"}) t.push_back({w, {d, d}});
      if (o) t.push_back({"W_O", {d, d}});
      if (b) {
        for (const char* w : {"b_Q", "b_K", "b_V"}) t.push_back({w, {d}});
        if (o) t.push_back({"b_O", {d}});
      }
      break;
    case WeightNaming::kTorch:
      t.push_back({"in_proj_weight", {3 * d, d}});
      if (b) t.push_back({"in_proj_bias", {3 * d}});
      if (o) t.push_back({"out_proj.weight", {d, d}});
      if (o && b) t.push_back({"out_proj.bias", {d}});
      break;
    case WeightNaming::kSplit:
      for (const char* p : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
        if (std::string_view(p) == "out_proj" && !o) break;
        t.push_back({absl::StrCat(p, ".weight"), {d, d}});
        if (b) t.push_back({absl::StrCat(p, ".bias"), {d}});
      }
      break;
  }
  return t;
}

absl::StatusOr<WeightNaming> DetectNaming(const SafetensorsIndex& index) {
  struct Candidate {
    WeightNaming naming;
    std::string_view marker;
  };
  std::vector<Candidate> found;
  if (auto m = FirstPresent(index, kSeedMarkers); !m.empty())
    found.push_back({WeightNaming::kSeed, m});
  if (auto m = FirstPresent(index, kTorchMarkers); !m.empty()) {
    found.push_back({WeightNaming::kTorch, m});
  }
  if (auto m = FirstPresent(index, kSplitMarkers); !m.empty()) {
    found.push_back({WeightNaming::kSplit, m});
  }
  if (found.size() == 1) return found[0].naming;
  if (found.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor names mix two naming schemes: \"", std::string(found[0].marker), "\" (",
        std::string(NamingName(found[0].naming)), ") and \"", std::string(found[1].marker), "\" (",
        std::string(NamingName(found[1].naming)), ")"));
  }
  std::vector<std::string> held;
  for (const TensorView& t : index.tensors) {
    if (held.size() == 5) {
      held.push_back("...");
      break;
    }
    held.push_back(absl::StrCat("\"", t.name, "\""));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "no attention weights found: expected W_Q (seed naming), in_proj_weight (torch naming) or "
      "q_proj.weight (split naming); the file holds ",
      held.empty() ? "no tensors" : absl::StrJoin(held, ", ")));
}

absl::StatusOr<core::AttentionWeights> ReadWeights(const SafetensorsIndex& index,
                                                   const core::AttentionConfig& config,
                                                   WeightNaming naming) {
  std::vector<ExpectedTensor> expected = ExpectedTensors(config, naming);
  ApplyOutputAlias(index, expected);

  for (const TensorView& t : index.tensors) {
    const bool known = std::any_of(expected.begin(), expected.end(),
                                   [&](const ExpectedTensor& e) { return e.name == t.name; });
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected tensor \"", t.name, "\" ", FormatShape(t.shape), ": ",
                       WhyUnexpected(t.name, config, naming, expected)));
    }
  }
  // Values in ExpectedTensors() order.
  std::vector<std::vector<float>> values;
  for (const ExpectedTensor& e : expected) {
    const TensorView* t = index.Find(e.name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "missing tensor \"", e.name, "\" ", FormatShape(e.shape), " (",
          std::string(NamingName(naming)), " naming, ",
          std::string(core::VariantName(config.variant)), config.bias ? " with bias)" : ")"));
    }
    absl::StatusOr<std::vector<float>> v = ReadChecked(*t, e, config);
    if (!v.ok()) return v.status();
    values.push_back(*std::move(v));
  }

  const size_t dd = static_cast<size_t>(config.d_model * config.d_model);
  const size_t d = static_cast<size_t>(config.d_model);
  const bool o = config.HasOutputProjection();
  const bool b = config.bias;
  core::SeparateProjections p;
  size_t next = 0;
  auto take = [&] { return std::span<const float>(values[next++]); };
  switch (naming) {
    case WeightNaming::kSeed:
      p.orientation = core::WeightOrientation::kInputMajor;
      p.w_q = take(), p.w_k = take(), p.w_v = take();
      if (o) p.w_o = take();
      if (b) p.b_q = take(), p.b_k = take(), p.b_v = take();
      if (o && b) p.b_o = take();
      break;
    case WeightNaming::kTorch: {
      p.orientation = core::WeightOrientation::kOutputMajor;
      std::span<const float> in = take();
      p.w_q = in.subspan(0, dd), p.w_k = in.subspan(dd, dd), p.w_v = in.subspan(2 * dd, dd);
      if (b) {
        std::span<const float> bias = take();
        p.b_q = bias.subspan(0, d), p.b_k = bias.subspan(d, d), p.b_v = bias.subspan(2 * d, d);
      }
      if (o) p.w_o = take();
      if (o && b) p.b_o = take();
      break;
    }
    case WeightNaming::kSplit: {
      p.orientation = core::WeightOrientation::kOutputMajor;
      std::span<const float>* weights[] = {&p.w_q, &p.w_k, &p.w_v, &p.w_o};
      std::span<const float>* biases[] = {&p.b_q, &p.b_k, &p.b_v, &p.b_o};
      for (int i = 0; i < (o ? 4 : 3); ++i) {
        *weights[i] = take();
        if (b) *biases[i] = take();
      }
      break;
    }
  }
  return core::PackWeights(config, p);
}

std::vector<NamedTensor> WeightsToTensors(const core::AttentionConfig& config,
                                          const core::AttentionWeights& weights,
                                          WeightNaming naming) {
  const int64_t d = config.d_model;
  const bool transpose = naming != WeightNaming::kSeed;
  // Column block `part` (0 = Q, 1 = K, 2 = V) of w_qkv as a d×d matrix, transposed for the
  // output-major namings.
  auto qkv_weight = [&](int64_t part) {
    std::vector<float> out(static_cast<size_t>(d * d));
    for (int64_t in = 0; in < d; ++in) {
      for (int64_t o = 0; o < d; ++o) {
        out[transpose ? o * d + in : in * d + o] = weights.w_qkv[in * 3 * d + part * d + o];
      }
    }
    return out;
  };
  auto qkv_bias = [&](int64_t part) {
    return std::vector<float>(weights.b_qkv.begin() + part * d,
                              weights.b_qkv.begin() + (part + 1) * d);
  };
  auto out_weight = [&] {
    std::vector<float> out = weights.w_o;
    if (!transpose) return out;
    for (int64_t in = 0; in < d; ++in) {
      for (int64_t o = 0; o < d; ++o) out[o * d + in] = weights.w_o[in * d + o];
    }
    return out;
  };
  auto values_of = [&](std::string_view name) -> std::vector<float> {
    if (name == "in_proj_weight") {
      std::vector<float> all;  // Rows Q | K | V, each [d_out, d_in].
      for (int64_t part = 0; part < 3; ++part) {
        std::vector<float> w = qkv_weight(part);
        all.insert(all.end(), w.begin(), w.end());
      }
      return all;
    }
    if (name == "in_proj_bias") return weights.b_qkv;
    if (name == "W_O" || name == "out_proj.weight") return out_weight();
    if (name == "b_O" || name == "out_proj.bias") return weights.b_o;
    constexpr std::string_view kQkvWeights[3][2] = {
        {"W_Q", "q_proj.weight"}, {"W_K", "k_proj.weight"}, {"W_V", "v_proj.weight"}};
    constexpr std::string_view kQkvBiases[3][2] = {
        {"b_Q", "q_proj.bias"}, {"b_K", "k_proj.bias"}, {"b_V", "v_proj.bias"}};
    for (int64_t part = 0; part < 3; ++part) {
      for (std::string_view n : kQkvWeights[part]) {
        if (name == n) return qkv_weight(part);
      }
      for (std::string_view n : kQkvBiases[part]) {
        if (name == n) return qkv_bias(part);
      }
    }
    return {};  // Unreachable: ExpectedTensors() only yields the names above.
  };
  std::vector<NamedTensor> out;
  for (ExpectedTensor& e : ExpectedTensors(config, naming)) {
    std::vector<float> values = values_of(e.name);
    out.push_back({std::move(e.name), std::move(e.shape), std::move(values)});
  }
  return out;
}

}  // namespace attnserve::model
