// Tensor naming schemes: detection, exact round trips for every naming × variant × bias, the
// meaning of each layout (checked on hand-written matrices), and one clear error per mistake.
#include "core/model/weight_naming.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/forward/attention_weights.h"
#include "core/model/safetensors_file.h"
#include "core/model/safetensors_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attnserve::model::weight_naming_test {
namespace {

using ::testing::HasSubstr;

// A serialized safetensors image and its parsed index (which borrows the image).
struct Image {
  std::string bytes;
  SafetensorsIndex index;
};

std::unique_ptr<Image> MakeImage(const std::vector<NamedTensor>& tensors,
                                 TensorDtype dtype = TensorDtype::kF32) {
  std::vector<TensorToWrite> to_write;
  for (const NamedTensor& t : tensors) to_write.push_back({t.name, dtype, t.shape, t.values});
  absl::StatusOr<std::string> bytes = SerializeSafetensors(to_write, {});
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  auto image = std::make_unique<Image>();
  image->bytes = bytes.value_or("");
  absl::StatusOr<SafetensorsIndex> index = ParseSafetensors(std::as_bytes(std::span(image->bytes)));
  EXPECT_TRUE(index.ok()) << index.status();
  if (index.ok()) image->index = *std::move(index);
  return image;
}

core::AttentionConfig Config(int64_t d, int64_t heads, bool single_head, bool bias) {
  return {.d_model = d,
          .num_heads = heads,
          .variant = single_head ? core::AttentionVariant::kSingleHead
                                 : core::AttentionVariant::kMultiHead,
          .bias = bias};
}

std::vector<NamedTensor> TensorsFor(const core::AttentionConfig& config, WeightNaming naming,
                                    uint64_t seed = 7) {
  return WeightsToTensors(config, core::MakeRandomWeights(config, seed), naming);
}

absl::Status ReadError(const std::vector<NamedTensor>& tensors,
                       const core::AttentionConfig& config) {
  std::unique_ptr<Image> image = MakeImage(tensors);
  absl::StatusOr<WeightNaming> naming = DetectNaming(image->index);
  if (!naming.ok()) return naming.status();
  return ReadWeights(image->index, config, *naming).status();
}

std::vector<NamedTensor> Without(std::vector<NamedTensor> tensors, const std::string& name) {
  std::erase_if(tensors, [&](const NamedTensor& t) { return t.name == name; });
  return tensors;
}

struct RoundTripCase {
  WeightNaming naming;
  bool single_head;
  bool bias;
};

class WeightNamingRoundTripTest : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(WeightNamingRoundTripTest, ReadWeightsInvertsWeightsToTensorsExactly) {
  const RoundTripCase& c = GetParam();
  const core::AttentionConfig config = Config(24, c.single_head ? 1 : 3, c.single_head, c.bias);
  const core::AttentionWeights weights = core::MakeRandomWeights(config, 11);
  const std::vector<NamedTensor> tensors = WeightsToTensors(config, weights, c.naming);

  const std::vector<ExpectedTensor> expected = ExpectedTensors(config, c.naming);
  ASSERT_EQ(tensors.size(), expected.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(tensors[i].name, expected[i].name);
    EXPECT_EQ(tensors[i].shape, expected[i].shape);
  }
  std::unique_ptr<Image> image = MakeImage(tensors);
  absl::StatusOr<WeightNaming> naming = DetectNaming(image->index);
  ASSERT_TRUE(naming.ok()) << naming.status();
  EXPECT_EQ(*naming, c.naming);
  absl::StatusOr<core::AttentionWeights> back = ReadWeights(image->index, config, *naming);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->w_qkv, weights.w_qkv);
  EXPECT_EQ(back->b_qkv, weights.b_qkv);
  EXPECT_EQ(back->w_o, weights.w_o);
  EXPECT_EQ(back->b_o, weights.b_o);
}

std::vector<RoundTripCase> AllRoundTripCases() {
  std::vector<RoundTripCase> cases;
  for (WeightNaming n : {WeightNaming::kSeed, WeightNaming::kTorch, WeightNaming::kSplit}) {
    for (bool single : {false, true}) {
      for (bool bias : {false, true}) cases.push_back({n, single, bias});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, WeightNamingRoundTripTest, ::testing::ValuesIn(AllRoundTripCases()),
                         [](const auto& p) {
                           return std::string(NamingName(p.param.naming)) +
                                  (p.param.single_head ? "_SingleHead" : "_MultiHead") +
                                  (p.param.bias ? "_Bias" : "_NoBias");
                         });

// The meaning of each layout, on d = 2 matrices written out by hand. Internally w_qkv is
// [d, 3d] with x · w_qkv, so w_qkv[in][0..d) is W_Q's row `in` in the seed's X @ W orientation.
TEST(WeightNamingTest, SeedMatricesAreUsedAsXTimesW) {
  const core::AttentionConfig config = Config(2, 1, false, false);
  std::vector<NamedTensor> tensors = {{"W_Q", {2, 2}, {1, 2, 3, 4}},
                                      {"W_K", {2, 2}, {5, 6, 7, 8}},
                                      {"W_V", {2, 2}, {9, 10, 11, 12}},
                                      {"W_O", {2, 2}, {13, 14, 15, 16}}};
  std::unique_ptr<Image> image = MakeImage(tensors);
  absl::StatusOr<core::AttentionWeights> w = ReadWeights(image->index, config, WeightNaming::kSeed);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->w_qkv, (std::vector<float>{1, 2, 5, 6, 9, 10, 3, 4, 7, 8, 11, 12}));
  EXPECT_EQ(w->w_o, (std::vector<float>{13, 14, 15, 16}));
}

TEST(WeightNamingTest, TorchMatricesAreUsedAsXTimesWTransposed) {
  const core::AttentionConfig config = Config(2, 1, false, true);
  // in_proj_weight rows: q0, q1, k0, k1, v0, v1 (each row = one output feature).
  std::vector<NamedTensor> tensors = {
      {"in_proj_weight", {6, 2}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}},
      {"in_proj_bias", {6}, {-1, -2, -3, -4, -5, -6}},
      {"out_proj.weight", {2, 2}, {13, 14, 15, 16}},
      {"out_proj.bias", {2}, {-7, -8}}};
  std::unique_ptr<Image> image = MakeImage(tensors);
  absl::StatusOr<core::AttentionWeights> w =
      ReadWeights(image->index, config, WeightNaming::kTorch);
  ASSERT_TRUE(w.ok()) << w.status();
  // w_qkv[in][out] = in_proj_weight[out][in].
  EXPECT_EQ(w->w_qkv, (std::vector<float>{1, 3, 5, 7, 9, 11, 2, 4, 6, 8, 10, 12}));
  EXPECT_EQ(w->b_qkv, (std::vector<float>{-1, -2, -3, -4, -5, -6}));
  EXPECT_EQ(w->w_o, (std::vector<float>{13, 15, 14, 16}));
  EXPECT_EQ(w->b_o, (std::vector<float>{-7, -8}));
}

TEST(WeightNamingTest, SplitNamingAcceptsOProjAlias) {
  const core::AttentionConfig config = Config(8, 2, false, true);
  std::vector<NamedTensor> tensors = TensorsFor(config, WeightNaming::kSplit);
  for (NamedTensor& t : tensors) {
    if (t.name.starts_with("out_proj.")) t.name.replace(0, 3, "o");
  }
  std::unique_ptr<Image> image = MakeImage(tensors);
  absl::StatusOr<core::AttentionWeights> w =
      ReadWeights(image->index, config, WeightNaming::kSplit);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->w_o, core::MakeRandomWeights(config, 7).w_o);
}

TEST(WeightNamingTest, UnexpectedTensorHintFollowsTheOProjAlias) {
  const core::AttentionConfig config = Config(8, 2, false, false);
  std::vector<NamedTensor> tensors = TensorsFor(config, WeightNaming::kSplit);
  for (NamedTensor& t : tensors) {
    if (t.name.starts_with("out_proj.")) t.name.replace(0, 3, "o");
  }
  tensors.push_back({"x_proj.weight", {8, 8}, std::vector<float>(64, 0.f)});
  absl::Status s = ReadError(tensors, config);
  EXPECT_THAT(s.message(), HasSubstr("q_proj.weight, k_proj.weight, v_proj.weight, o_proj.weight"));
}

TEST(WeightNamingTest, SixteenBitFilesConvertAtLoad) {
  const core::AttentionConfig config = Config(16, 2, false, true);
  // Values exactly representable in both formats survive unchanged.
  std::vector<NamedTensor> tensors = TensorsFor(config, WeightNaming::kTorch);
  for (NamedTensor& t : tensors) {
    for (size_t i = 0; i < t.values.size(); ++i) t.values[i] = static_cast<float>(i % 7) * 0.25f;
  }
  for (TensorDtype dtype : {TensorDtype::kF16, TensorDtype::kBF16}) {
    std::unique_ptr<Image> image = MakeImage(tensors, dtype);
    absl::StatusOr<core::AttentionWeights> w =
        ReadWeights(image->index, config, WeightNaming::kTorch);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->b_qkv, tensors[1].values) << DtypeName(dtype);
  }
}

TEST(WeightNamingTest, DetectsNoNamingAndListsTheFilesTensors) {
  absl::Status s =
      ReadError({{"encoder.weight", {2, 2}, {1, 2, 3, 4}}}, Config(2, 1, false, false));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("no attention weights found"));
  EXPECT_THAT(s.message(), HasSubstr("in_proj_weight (torch naming)"));
  EXPECT_THAT(s.message(), HasSubstr("\"encoder.weight\""));
}

TEST(WeightNamingTest, RejectsMixedNamings) {
  const core::AttentionConfig config = Config(4, 1, false, false);
  std::vector<NamedTensor> tensors = TensorsFor(config, WeightNaming::kSeed);
  tensors.push_back({"in_proj_weight", {12, 4}, std::vector<float>(48, 0.f)});
  absl::Status s = ReadError(tensors, config);
  EXPECT_THAT(s.message(), HasSubstr("mix two naming schemes"));
  EXPECT_THAT(s.message(), HasSubstr("\"W_Q\" (seed)"));
  EXPECT_THAT(s.message(), HasSubstr("\"in_proj_weight\" (torch)"));
}

TEST(WeightNamingTest, MissingTensorNamesItsShape) {
  const core::AttentionConfig config = Config(8, 2, false, true);
  absl::Status s = ReadError(Without(TensorsFor(config, WeightNaming::kSeed), "W_O"), config);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("missing tensor \"W_O\" [8, 8]"));
  EXPECT_THAT(s.message(), HasSubstr("seed naming, multi_head with bias"));
}

TEST(WeightNamingTest, MissingBiasWhenConfigSaysBias) {
  const core::AttentionConfig with_bias = Config(8, 2, false, true);
  const core::AttentionConfig no_bias = Config(8, 2, false, false);
  absl::Status s = ReadError(TensorsFor(no_bias, WeightNaming::kTorch), with_bias);
  EXPECT_THAT(s.message(), HasSubstr("missing tensor \"in_proj_bias\" [24]"));
}

TEST(WeightNamingTest, ExtraBiasWhenConfigSaysNoBias) {
  const core::AttentionConfig with_bias = Config(8, 2, false, true);
  const core::AttentionConfig no_bias = Config(8, 2, false, false);
  absl::Status s = ReadError(TensorsFor(with_bias, WeightNaming::kSplit), no_bias);
  EXPECT_THAT(s.message(), HasSubstr("unexpected tensor \"q_proj.bias\""));
  EXPECT_THAT(s.message(), HasSubstr("\"bias\": false"));
}

TEST(WeightNamingTest, OutputProjectionIsExtraForSingleHead) {
  const core::AttentionConfig single = Config(8, 1, true, false);
  const core::AttentionConfig multi = Config(8, 1, false, false);
  absl::Status s = ReadError(TensorsFor(multi, WeightNaming::kSeed), single);
  EXPECT_THAT(s.message(), HasSubstr("unexpected tensor \"W_O\""));
  EXPECT_THAT(s.message(), HasSubstr("single_head variant has no output projection"));
}

TEST(WeightNamingTest, UnknownExtraTensorListsWhatTheNamingUses) {
  const core::AttentionConfig config = Config(4, 1, false, false);
  std::vector<NamedTensor> tensors = TensorsFor(config, WeightNaming::kSeed);
  tensors.push_back({"W_X", {4, 4}, std::vector<float>(16, 0.f)});
  absl::Status s = ReadError(tensors, config);
  EXPECT_THAT(s.message(), HasSubstr("unexpected tensor \"W_X\" [4, 4]: "));
  EXPECT_THAT(s.message(), HasSubstr("seed naming for this config uses: W_Q, W_K, W_V, W_O"));
}

TEST(WeightNamingTest, WrongDModelNamesExpectedAndActualShape) {
  const core::AttentionConfig file_config = Config(8, 2, false, false);
  const core::AttentionConfig config = Config(16, 2, false, false);
  absl::Status s = ReadError(TensorsFor(file_config, WeightNaming::kTorch), config);
  EXPECT_THAT(s.message(), HasSubstr("tensor \"in_proj_weight\" has shape [24, 8], expected "
                                     "[48, 16] (d_model 16 from config.json)"));
}

TEST(WeightNamingTest, NonFiniteValueNamesTensorElementAndValue) {
  const core::AttentionConfig config = Config(4, 1, false, true);
  std::vector<NamedTensor> tensors = TensorsFor(config, WeightNaming::kSeed);
  tensors[2].values[1 * 4 + 3] = std::numeric_limits<float>::quiet_NaN();  // W_V[1, 3]
  absl::Status s = ReadError(tensors, config);
  EXPECT_THAT(s.message(), HasSubstr("tensor \"W_V\" element [1, 3] is nan"));
  tensors = TensorsFor(config, WeightNaming::kSeed);
  tensors.back().values[2] = -std::numeric_limits<float>::infinity();  // b_O[2]
  s = ReadError(tensors, config);
  EXPECT_THAT(s.message(), HasSubstr("tensor \"b_O\" element [2] is -inf"));
}

TEST(WeightNamingTest, UnsupportedDtypeNamesTensor) {
  const core::AttentionConfig config = Config(2, 1, true, false);
  // Hand-built image: W_Q and W_K as F32, W_V as I32 (same byte size).
  std::vector<TensorToWrite> to_write;
  std::vector<NamedTensor> tensors = TensorsFor(config, WeightNaming::kSeed);
  for (const NamedTensor& t : tensors)
    to_write.push_back({t.name, TensorDtype::kF32, t.shape, t.values});
  absl::StatusOr<std::string> bytes = SerializeSafetensors(to_write, {});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string needle = R"("W_V":{"dtype":"F32")";
  const size_t at = bytes->find(needle);
  ASSERT_NE(at, std::string::npos) << *bytes;
  bytes->replace(at, needle.size(), R"("W_V":{"dtype":"I32")");
  absl::StatusOr<SafetensorsIndex> index = ParseSafetensors(std::as_bytes(std::span(*bytes)));
  ASSERT_TRUE(index.ok()) << index.status();
  absl::Status s = ReadWeights(*index, config, WeightNaming::kSeed).status();
  EXPECT_THAT(s.message(), HasSubstr("\"W_V\" has dtype I32; expected F32, F16 or BF16"));
}

TEST(WeightNamingTest, ParseNaming) {
  EXPECT_EQ(ParseNaming("torch").value(), WeightNaming::kTorch);
  EXPECT_THAT(ParseNaming("pytorch").status().message(),
              HasSubstr("expected seed, torch or split, got \"pytorch\""));
}

}  // namespace
}  // namespace attnserve::model::weight_naming_test
