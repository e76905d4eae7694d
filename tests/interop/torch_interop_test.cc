// attnserve against torch.nn.MultiheadAttention: every case make_torch_cases.py wrote is a torch
// layer exported by tools/export_torch.py plus torch's outputs on padded inputs. Each is loaded
// through the real model path (LoadModelFolder), run as attnserve's ragged batch, and compared
// on the valid rows: output and per-head weights within kTolerance (absolute).
//
// The cases folder comes from ATTNSERVE_TORCH_CASES (CTest sets it after running the generator;
// see tests/interop/CMakeLists.txt). case.safetensors' layout is documented in the generator.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/forward/attention_batch.h"
#include "core/forward/attention_executor.h"
#include "core/forward/onednn_support.h"
#include "core/model/model.h"
#include "core/model/safetensors_file.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

namespace fs = std::filesystem;
using model::SafetensorsIndex;
using model::TensorDtype;
using model::TensorView;

constexpr char kCasesEnv[] = "ATTNSERVE_TORCH_CASES";
constexpr char kManifestFileName[] = "cases.txt";
constexpr char kCaseFileName[] = "case.safetensors";
constexpr char kModelFolderName[] = "model";
constexpr double kTolerance = 1e-4;

// The cases folder, or nullopt with a test failure saying how to get one.
std::optional<fs::path> CasesFolder() {
  const char* folder = std::getenv(kCasesEnv);
  if (folder == nullptr || *folder == '\0') {
    ADD_FAILURE() << kCasesEnv
                  << " is not set: point it at the folder tests/interop/make_torch_cases.py "
                     "--out wrote (ctest -L interop runs the generator and sets it)";
    return std::nullopt;
  }
  return fs::path(folder);
}

// The case names the generator listed in cases.txt, one per line, in order.
absl::StatusOr<std::vector<std::string>> ReadManifest(const fs::path& folder) {
  std::ifstream in(folder / kManifestFileName);
  if (!in) {
    return absl::NotFoundError(absl::StrCat((folder / kManifestFileName).string(),
                                            " is missing: the generator did not finish"));
  }
  std::vector<std::string> names;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) names.push_back(line);
  }
  return names;
}

// A case's tensors in torch's padded layout ([B, T, d] and so on) and the metadata flags.
struct TorchCase {
  int64_t batch = 0, max_query = 0, max_key = 0, d_model = 0, num_heads = 0;
  std::vector<float> query, memory, expected_output, expected_weights, reference_output;
  std::vector<int64_t> query_lengths, memory_lengths;
  std::vector<uint8_t> attn_mask, key_padding_mask;  // torch convention: nonzero = blocked.
  std::string mask;                                  // "none", "causal" or "explicit".
  bool cross = false;
  bool need_weights = false;
  std::map<std::string, std::string> metadata;
};

absl::Status CheckShape(const TensorView& tensor, const std::vector<int64_t>& shape) {
  if (tensor.shape != shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(tensor.name, ": shape [", absl::StrJoin(tensor.shape, ","), "], expected [",
                     absl::StrJoin(shape, ","), "]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> FloatTensor(const SafetensorsIndex& index, const char* name,
                                               const std::vector<int64_t>& shape) {
  const TensorView* tensor = index.Find(name);
  if (tensor == nullptr) return absl::NotFoundError(absl::StrCat("no tensor ", name));
  if (absl::Status s = CheckShape(*tensor, shape); !s.ok()) return s;
  return model::ReadFloat32(*tensor);
}

// Raw little-endian elements of a tensor of `dtype` (I64 or BOOL here), copied out.
template <typename T>
absl::StatusOr<std::vector<T>> RawTensor(const SafetensorsIndex& index, const char* name,
                                         TensorDtype dtype, const std::vector<int64_t>& shape) {
  const TensorView* tensor = index.Find(name);
  if (tensor == nullptr) return absl::NotFoundError(absl::StrCat("no tensor ", name));
  if (tensor->dtype != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": dtype ", std::string(model::DtypeName(tensor->dtype)), ", expected ",
                     std::string(model::DtypeName(dtype))));
  }
  if (absl::Status s = CheckShape(*tensor, shape); !s.ok()) return s;
  std::vector<T> values(tensor->num_elements());
  std::memcpy(values.data(), tensor->bytes.data(), values.size() * sizeof(T));
  return values;
}

std::string MetadataValue(const SafetensorsIndex& index, const std::string& key) {
  auto it = index.metadata.find(key);
  return it == index.metadata.end() ? "" : it->second;
}

// Moves a successful `value` into `out`.
template <typename T>
absl::Status MoveInto(absl::StatusOr<T> value, T& out) {
  if (!value.ok()) return value.status();
  out = *std::move(value);
  return absl::OkStatus();
}

// The [B, rows, d] shape of a 3-D tensor, or an error naming it.
absl::StatusOr<std::vector<int64_t>> Shape3(const SafetensorsIndex& index, const char* name) {
  const TensorView* tensor = index.Find(name);
  if (tensor == nullptr || tensor->shape.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(name, " must be a [B, rows, d] tensor"));
  }
  return tensor->shape;
}

// Every length lies in [1, max_rows]: the comparison indexes padded tensors with them.
absl::Status CheckLengths(const char* name, const std::vector<int64_t>& lengths, int64_t max_rows) {
  for (const int64_t length : lengths) {
    if (length < 1 || length > max_rows) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": length ", length, " outside [1, ", max_rows, "]"));
    }
  }
  return absl::OkStatus();
}

// query, its lengths and torch's output: every case has them.
absl::Status ReadQuerySide(const SafetensorsIndex& index, TorchCase& c) {
  const absl::StatusOr<std::vector<int64_t>> shape = Shape3(index, "query");
  if (!shape.ok()) return shape.status();
  c.batch = (*shape)[0];
  c.max_query = c.max_key = (*shape)[1];
  c.d_model = (*shape)[2];
  absl::Status s = MoveInto(FloatTensor(index, "query", *shape), c.query);
  if (s.ok()) {
    s = MoveInto(RawTensor<int64_t>(index, "query_lengths", TensorDtype::kI64, {c.batch}),
                 c.query_lengths);
  }
  if (s.ok()) s = CheckLengths("query_lengths", c.query_lengths, c.max_query);
  if (s.ok()) s = MoveInto(FloatTensor(index, "expected_output", *shape), c.expected_output);
  if (s.ok()) s = MoveInto(FloatTensor(index, "reference_output", *shape), c.reference_output);
  return s;
}

// memory and its lengths (cross-attention only); sets max_key.
absl::Status ReadMemorySide(const SafetensorsIndex& index, TorchCase& c) {
  if (!c.cross) return absl::OkStatus();
  const absl::StatusOr<std::vector<int64_t>> shape = Shape3(index, "memory");
  if (!shape.ok()) return shape.status();
  c.max_key = (*shape)[1];
  absl::Status s =
      MoveInto(FloatTensor(index, "memory", {c.batch, c.max_key, c.d_model}), c.memory);
  if (s.ok()) {
    s = MoveInto(RawTensor<int64_t>(index, "memory_lengths", TensorDtype::kI64, {c.batch}),
                 c.memory_lengths);
  }
  if (s.ok()) s = CheckLengths("memory_lengths", c.memory_lengths, c.max_key);
  return s;
}

// key_padding_mask and attn_mask when torch got them, and the per-head weights when requested.
absl::Status ReadMasksAndWeights(const SafetensorsIndex& index, TorchCase& c) {
  absl::Status s;
  if (index.Find("key_padding_mask") != nullptr) {
    s = MoveInto(
        RawTensor<uint8_t>(index, "key_padding_mask", TensorDtype::kBool, {c.batch, c.max_key}),
        c.key_padding_mask);
  }
  if (s.ok() && c.mask != "none") {
    s = MoveInto(
        RawTensor<uint8_t>(index, "attn_mask", TensorDtype::kBool, {c.max_query, c.max_key}),
        c.attn_mask);
  }
  if (s.ok() && c.need_weights) {
    s = MoveInto(
        FloatTensor(index, "expected_weights", {c.batch, c.num_heads, c.max_query, c.max_key}),
        c.expected_weights);
  }
  return s;
}

absl::StatusOr<TorchCase> ReadCase(const fs::path& path) {
  absl::StatusOr<model::SafetensorsFile> file = model::SafetensorsFile::Open(path);
  if (!file.ok()) return file.status();
  const SafetensorsIndex& index = file->index();
  TorchCase c;
  c.metadata = index.metadata;
  c.mask = MetadataValue(index, "mask");
  c.cross = MetadataValue(index, "cross") == "true";
  c.need_weights = MetadataValue(index, "need_weights") == "true";
  c.num_heads = std::atoll(MetadataValue(index, "num_heads").c_str());
  absl::Status s = ReadQuerySide(index, c);
  if (s.ok()) s = ReadMemorySide(index, c);
  if (s.ok()) s = ReadMasksAndWeights(index, c);
  if (!s.ok()) return s;
  return c;
}

int64_t KeyLength(const TorchCase& c, int64_t i) {
  return c.cross ? c.memory_lengths[i] : c.query_lengths[i];
}

// torch saw key_padding_mask (or no padding at all); attnserve sees the lengths. Both must say
// the same, or the comparison would be meaningless.
void ExpectPaddingMatchesLengths(const TorchCase& c) {
  for (int64_t i = 0; i < c.batch; ++i) {
    for (int64_t j = 0; j < c.max_key; ++j) {
      const bool padded = j >= KeyLength(c, i);
      const bool torch_padded =
          !c.key_padding_mask.empty() && c.key_padding_mask[i * c.max_key + j];
      ASSERT_EQ(torch_padded, padded) << "key_padding_mask[" << i << "][" << j << "]";
    }
  }
}

// Torch's causal attn_mask must be the top-left triangle attnserve's mask.causal means.
void ExpectCausalMaskIsTopLeft(const TorchCase& c) {
  for (int64_t r = 0; r < c.max_query; ++r) {
    for (int64_t j = 0; j < c.max_key; ++j) {
      ASSERT_EQ(c.attn_mask[r * c.max_key + j] != 0, j > r)
          << "attn_mask[" << r << "][" << j << "]";
    }
  }
}

// The valid rows of a padded [B, max_rows, d] tensor, packed, and their offsets.
struct Packed {
  std::vector<float> data;
  std::vector<int64_t> offsets{0};
};
Packed Pack(const std::vector<float>& padded, const std::vector<int64_t>& lengths, int64_t max_rows,
            int64_t d) {
  Packed packed;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const auto first = padded.begin() + static_cast<int64_t>(i) * max_rows * d;
    packed.data.insert(packed.data.end(), first, first + lengths[i] * d);
    packed.offsets.push_back(packed.offsets.back() + lengths[i]);
  }
  return packed;
}

// attnserve's explicit mask: per sequence the top-left [T_i, S_i] block of torch's attn_mask,
// inverted (attnserve: 0 = blocked; torch: True = blocked).
std::vector<uint8_t> ExplicitMask(const TorchCase& c) {
  std::vector<uint8_t> mask;
  for (int64_t i = 0; i < c.batch; ++i) {
    for (int64_t r = 0; r < c.query_lengths[i]; ++r) {
      for (int64_t j = 0; j < KeyLength(c, i); ++j) {
        mask.push_back(c.attn_mask[r * c.max_key + j] ? 0 : 1);
      }
    }
  }
  return mask;
}

// Folds |actual - expected| into `worst`; a NaN makes it infinite.
void Track(double& worst, float actual, float expected) {
  const double diff = std::fabs(static_cast<double>(actual) - expected);
  worst = std::isnan(diff) ? INFINITY : std::max(worst, diff);
}

// Largest difference between attnserve's packed output and torch's over the valid query rows.
double OutputError(const TorchCase& c, const std::vector<int64_t>& offsets,
                   const std::vector<float>& output) {
  double worst = 0;
  for (int64_t i = 0; i < c.batch; ++i) {
    for (int64_t r = 0; r < c.query_lengths[i]; ++r) {
      for (int64_t k = 0; k < c.d_model; ++k) {
        Track(worst, output[(offsets[i] + r) * c.d_model + k],
              c.expected_output[(i * c.max_query + r) * c.d_model + k]);
      }
    }
  }
  return worst;
}

// Largest difference between attnserve's per-sequence [h, T_i, S_i] weights and torch's
// [B, h, T, S] ones over valid query rows; torch's weights on padded keys count against zero.
double WeightsError(const TorchCase& c, const std::vector<float>& weights) {
  double worst = 0;
  int64_t offset = 0;
  for (int64_t i = 0; i < c.batch; ++i) {
    const int64_t t = c.query_lengths[i], s = KeyLength(c, i);
    for (int64_t h = 0; h < c.num_heads; ++h) {
      for (int64_t r = 0; r < t; ++r) {
        const float* expected =
            &c.expected_weights[((i * c.num_heads + h) * c.max_query + r) * c.max_key];
        for (int64_t j = 0; j < s; ++j)
          Track(worst, weights[offset + (h * t + r) * s + j], expected[j]);
        // torch gives padded keys zero weight: what attnserve, never seeing them, implies.
        for (int64_t j = s; j < c.max_key; ++j) Track(worst, 0.0f, expected[j]);
      }
    }
    offset += c.num_heads * t * s;
  }
  return worst;
}

struct CaseResult {
  double output_error = 0;
  double weights_error = 0;
};

// Runs `c` through `layer` and returns the largest absolute differences from torch on valid
// rows (infinite for a NaN); a gtest failure if the forward pass fails.
CaseResult RunAndCompare(const TorchCase& c, const core::AttentionLayer& layer) {
  const Packed query = Pack(c.query, c.query_lengths, c.max_query, c.d_model);
  Packed memory;
  core::AttentionInputs in{.query = {.data = query.data, .offsets = query.offsets}};
  if (c.cross) {
    memory = Pack(c.memory, c.memory_lengths, c.max_key, c.d_model);
    in.memory = core::RaggedBatch{.data = memory.data, .offsets = memory.offsets};
  }
  std::vector<uint8_t> explicit_mask;
  in.mask.causal = c.mask == "causal";
  if (c.mask == "explicit") {
    explicit_mask = ExplicitMask(c);
    in.mask.explicit_mask = explicit_mask;
  }
  std::vector<float> output(query.data.size(), NAN);
  std::vector<float> weights;
  if (c.need_weights) weights.assign(core::WeightsSize(layer.config(), in), NAN);

  core::AttentionExecutor executor;
  const absl::Status status = executor.Forward(layer, in, {.output = output, .weights = weights});
  EXPECT_TRUE(status.ok()) << status;
  if (!status.ok()) return {};

  return {.output_error = OutputError(c, query.offsets, output),
          .weights_error = c.need_weights ? WeightsError(c, weights) : 0.0};
}

// What the generator's cases cover; the test insists on each kind, so a shrunken case list fails.
struct Coverage {
  int bias = 0, no_bias = 0, causal = 0, explicit_mask = 0, cross_longer_memory = 0,
      cross_shorter_memory = 0, padded = 0, weights = 0, split = 0, f16 = 0, bf16 = 0;
  std::set<int64_t> d_models, heads;

  void Add(const TorchCase& c) {
    (c.metadata.at("bias") == "true" ? bias : no_bias)++;
    causal += c.mask == "causal";
    explicit_mask += c.mask == "explicit";
    for (int64_t i = 0; c.cross && i < c.batch; ++i) {
      cross_longer_memory += c.memory_lengths[i] > c.query_lengths[i];
      cross_shorter_memory += c.memory_lengths[i] < c.query_lengths[i];
    }
    padded += !c.key_padding_mask.empty() && c.batch >= 3;
    weights += c.need_weights;
    split += c.metadata.at("naming") == "split";
    f16 += c.metadata.at("dtype") == "f16";
    bf16 += c.metadata.at("dtype") == "bf16";
    d_models.insert(c.d_model);
    heads.insert(c.num_heads);
  }
};

TEST(TorchInteropTest, CasesFolderHoldsExactlyTheGeneratedCases) {
  const std::optional<fs::path> folder = CasesFolder();
  if (!folder) return;
  const absl::StatusOr<std::vector<std::string>> manifest = ReadManifest(*folder);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  ASSERT_FALSE(manifest->empty()) << "the generator listed no cases";

  std::set<std::string> on_disk;
  for (const fs::directory_entry& entry : fs::directory_iterator(*folder)) {
    if (fs::exists(entry.path() / kCaseFileName)) on_disk.insert(entry.path().filename().string());
  }
  const std::set<std::string> listed(manifest->begin(), manifest->end());
  EXPECT_EQ(listed.size(), manifest->size()) << "duplicate case names in " << kManifestFileName;
  EXPECT_EQ(on_disk, listed) << "case folders and " << kManifestFileName << " disagree";
}

TEST(TorchInteropTest, AttnserveMatchesTorch) {
  const std::optional<fs::path> folder = CasesFolder();
  if (!folder) return;
  const absl::StatusOr<std::vector<std::string>> manifest = ReadManifest(*folder);
  ASSERT_TRUE(manifest.ok()) << manifest.status();

  Coverage coverage;
  int compared = 0;
  for (const std::string& name : *manifest) {
    SCOPED_TRACE("case " + name);
    const fs::path case_folder = *folder / name;
    const absl::StatusOr<TorchCase> c = ReadCase(case_folder / kCaseFileName);
    ASSERT_TRUE(c.ok()) << c.status();
    const auto loaded = model::LoadModelFolder(case_folder / kModelFolderName);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const model::Model& m = **loaded;

    // The loader must have read the file the way the exporter wrote it.
    EXPECT_EQ(m.name, kModelFolderName);
    ASSERT_EQ(m.config.attention.d_model, c->d_model);
    ASSERT_EQ(m.config.attention.num_heads, c->num_heads);
    EXPECT_EQ(m.config.attention.bias, c->metadata.at("bias") == "true");
    EXPECT_EQ(m.weight_naming, c->metadata.at("naming"));
    std::string file_dtype = c->metadata.at("dtype");
    std::transform(file_dtype.begin(), file_dtype.end(), file_dtype.begin(), ::toupper);
    EXPECT_EQ(m.file_dtype, file_dtype);

    ASSERT_NO_FATAL_FAILURE(ExpectPaddingMatchesLengths(*c));
    if (c->mask == "causal") {
      ASSERT_NO_FATAL_FAILURE(ExpectCausalMaskIsTopLeft(*c));
    }
    ASSERT_TRUE(c->mask == "none" || c->mask == "causal" || c->mask == "explicit") << c->mask;

    const CaseResult result = RunAndCompare(*c, *m.layer);
    EXPECT_LE(result.output_error, kTolerance) << "output: largest |attnserve - torch|";
    EXPECT_LE(result.weights_error, kTolerance) << "weights: largest |attnserve - torch|";
    std::cout << "[ case     ] " << name << ": output " << result.output_error
              << (c->need_weights ? absl::StrCat(", weights ", result.weights_error) : "")
              << " (torch fp32 vs fp64 " << c->metadata.at("torch_fp32_error") << ")\n";
    coverage.Add(*c);
    ++compared;
  }

  EXPECT_EQ(compared, static_cast<int>(manifest->size()));
  EXPECT_GT(coverage.bias, 0);
  EXPECT_GT(coverage.no_bias, 0);
  EXPECT_GT(coverage.causal, 0);
  EXPECT_GT(coverage.explicit_mask, 0);
  EXPECT_GT(coverage.cross_longer_memory, 0);
  EXPECT_GT(coverage.cross_shorter_memory, 0);
  EXPECT_GT(coverage.padded, 0) << "no key-padding case with B >= 3";
  EXPECT_GT(coverage.weights, 0);
  EXPECT_GT(coverage.split, 0);
  EXPECT_GT(coverage.f16, 0);
  EXPECT_GT(coverage.bf16, 0);
  const std::set<int64_t> d_models{64, 256}, heads{1, 4, 8};
  EXPECT_TRUE(std::includes(coverage.d_models.begin(), coverage.d_models.end(), d_models.begin(),
                            d_models.end()));
  EXPECT_TRUE(
      std::includes(coverage.heads.begin(), coverage.heads.end(), heads.begin(), heads.end()));
}

// attnserve's bf16 compute against torch's own CPU bf16 nn.MultiheadAttention on the same
// inputs and weights, both measured against torch in float64 (max abs over valid rows): summed
// over the cases ours may not be larger, and no single case more than 10 % larger (a case's
// maximum of two different rounding sequences is noisy: measured 0.87-1.003x torch's per case
// when written, 0.75x summed).
TEST(TorchInteropTest, Bf16ErrorNoLargerThanTorchBf16) {
  if (!core::HasBf16Kernels()) GTEST_SKIP() << "no bf16 kernels on " << core::OneDnnIsa();
  const std::optional<fs::path> folder = CasesFolder();
  if (!folder) return;
  const absl::StatusOr<std::vector<std::string>> manifest = ReadManifest(*folder);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  double ours_total = 0, torch_total = 0;
  for (const std::string& name : *manifest) {
    SCOPED_TRACE("case " + name);
    const fs::path case_folder = *folder / name;
    absl::StatusOr<TorchCase> c = ReadCase(case_folder / kCaseFileName);
    ASSERT_TRUE(c.ok()) << c.status();
    const auto loaded = model::LoadModelFolder(
        case_folder / kModelFolderName,
        {.compute_type = core::ComputeType::kBFloat16, .allow_bf16_emulation = true});
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const double torch_bf16 = std::stod(c->metadata.at("torch_bf16_error"));
    c->expected_output = c->reference_output;  // Compare with float64 torch, not fp32 torch.
    c->need_weights = false;
    const CaseResult result = RunAndCompare(*c, *(*loaded)->layer);
    EXPECT_LE(result.output_error, 1.1 * torch_bf16) << "attnserve bf16 error above torch bf16's";
    ours_total += result.output_error;
    torch_total += torch_bf16;
    std::cout << "[ bf16     ] " << name << ": attnserve " << result.output_error << ", torch "
              << torch_bf16 << "\n";
  }
  EXPECT_LE(ours_total, torch_total) << "summed over the cases";
  std::cout << "[ bf16     ] summed: attnserve " << ours_total << ", torch " << torch_total << "\n";
}

}  // namespace
}  // namespace attnserve
