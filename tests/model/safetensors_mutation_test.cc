// Mutation tests: thousands of seeded, deterministic corruptions of valid weights.safetensors
// images and config.json texts. Each corrupted input must either load or fail with a clear status
// (InvalidArgument with a non-empty message; LoadModelFolder also NotFound, and its messages start
// with the path) — never crash, hang or throw. A corrupted image that does parse must still keep
// every promise of ParseSafetensors (ranges tile the data section, sizes match the shapes).
//
// The generator is a fixed splitmix64 stream, so a failure names a case that reruns identically.
// About 16,000 inputs; about 0.2 s in Release. Run it under ASan/UBSan too.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/forward/attention_config.h"
#include "core/forward/attention_weights.h"
#include "core/model/model.h"
#include "core/model/model_config.h"
#include "core/model/safetensors_file.h"
#include "core/model/safetensors_writer.h"
#include "core/model/weight_naming.h"
#include "core/util/half_float.h"
#include "gtest/gtest.h"
#include "tests/model/mutations.h"
#include "tests/support/temp_folder.h"

namespace attnserve::model::safetensors_mutation_test {
namespace {

namespace fs = std::filesystem;

using ::attnserve::testing::MutateBytes;
using ::attnserve::testing::MutateJson;
using ::attnserve::testing::Rng;

// --- Valid starting points -------------------------------------------------------------------

struct SeedImage {
  std::string label;
  core::AttentionConfig config;
  std::string image;
};

core::AttentionConfig Config(int64_t d, int64_t heads, bool single_head, bool bias) {
  return {.d_model = d,
          .num_heads = heads,
          .variant = single_head ? core::AttentionVariant::kSingleHead
                                 : core::AttentionVariant::kMultiHead,
          .bias = bias};
}

// Every naming, dtype, variant and bias setting, a metadata block, the o_proj alias and a file
// mixing dtypes; d is small so the headers dominate the images.
std::vector<SeedImage> SeedImages() {
  struct Spec {
    const char* label;
    core::AttentionConfig config;
    WeightNaming naming;
    std::vector<TensorDtype> dtypes;  // Cycled over the tensors.
    bool metadata;
    bool o_proj;
  };
  const std::vector<Spec> specs = {
      {"seed F32 multi_head bias",
       Config(4, 2, false, true),
       WeightNaming::kSeed,
       {TensorDtype::kF32},
       true,
       false},
      {"torch F16 single_head",
       Config(4, 1, true, false),
       WeightNaming::kTorch,
       {TensorDtype::kF16},
       false,
       false},
      {"split BF16 multi_head bias",
       Config(6, 3, false, true),
       WeightNaming::kSplit,
       {TensorDtype::kBF16},
       false,
       false},
      {"torch F32 multi_head",
       Config(8, 2, false, false),
       WeightNaming::kTorch,
       {TensorDtype::kF32},
       true,
       false},
      {"split o_proj mixed dtypes bias",
       Config(4, 2, false, true),
       WeightNaming::kSplit,
       {TensorDtype::kF32, TensorDtype::kF16, TensorDtype::kBF16},
       true,
       true},
      {"seed BF16 single_head bias",
       Config(2, 1, true, true),
       WeightNaming::kSeed,
       {TensorDtype::kBF16},
       false,
       false},
  };
  std::vector<SeedImage> seeds;
  for (size_t s = 0; s < specs.size(); ++s) {
    const Spec& spec = specs[s];
    std::vector<NamedTensor> tensors =
        WeightsToTensors(spec.config, core::MakeRandomWeights(spec.config, 11 + s), spec.naming);
    std::vector<TensorToWrite> to_write;
    for (size_t i = 0; i < tensors.size(); ++i) {
      std::string name = tensors[i].name;
      if (spec.o_proj && name.starts_with("out_proj.")) name.replace(0, 3, "o");
      to_write.push_back(
          {name, spec.dtypes[i % spec.dtypes.size()], tensors[i].shape, tensors[i].values});
    }
    const std::map<std::string, std::string> metadata =
        spec.metadata ? std::map<std::string, std::string>{{"format", "pt"}, {"seed", "11"}}
                      : std::map<std::string, std::string>{};
    absl::StatusOr<std::string> image = SerializeSafetensors(to_write, metadata);
    EXPECT_TRUE(image.ok()) << spec.label << ": " << image.status();
    seeds.push_back({spec.label, spec.config, image.value_or("")});
  }
  return seeds;
}

std::span<const std::byte> Bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

uint64_t HeaderLength(std::string_view image) {
  uint64_t n = 0;
  std::memcpy(&n, image.data(), sizeof(n));
  return n;
}

void SetHeaderLength(std::string& image, uint64_t n) {
  if (image.size() >= sizeof(n)) std::memcpy(image.data(), &n, sizeof(n));
}

// --- Checking one input ----------------------------------------------------------------------

// Counts problems and reports the first few in full, so a systematic bug does not print
// thousands of failures.
class Checker {
 public:
  // A failed status must be one of `codes` with a non-empty message starting with `prefix`.
  void ExpectClearError(const absl::Status& status, std::initializer_list<absl::StatusCode> codes,
                        const std::string& prefix, const std::string& what) {
    ++errors_;
    const bool code_ok = std::find(codes.begin(), codes.end(), status.code()) != codes.end();
    if (!code_ok || status.message().empty() ||
        !absl::StartsWith(status.message(), absl::string_view(prefix))) {
      Fail(what, absl::StrCat("unclear error: ", status.ToString()));
    }
  }

  void Fail(const std::string& what, std::string_view problem) {
    if (++failures_ <= 10) ADD_FAILURE() << what << ": " << problem;
  }

  // Runs `check`, turning an escaping exception into a failure (a throw would be a crash in a
  // server that does not expect one).
  template <typename F>
  void Guarded(const std::string& what, F check) {
    ++cases_;
    try {
      check();
    } catch (const std::exception& e) {
      Fail(what, absl::StrCat("threw ", e.what()));
    } catch (...) {
      Fail(what, "threw a non-std exception");
    }
  }

  // Inputs that got through a stage: how deep the mutations reach.
  int parsed = 0;  // ParseSafetensors or ParseModelConfig succeeded.
  int loaded = 0;  // ReadWeights (detected naming) or LoadModelFolder succeeded.

  int cases() const { return cases_; }
  int errors() const { return errors_; }
  int failures() const { return failures_; }

 private:
  int cases_ = 0;
  int errors_ = 0;
  int failures_ = 0;
};

// What ParseSafetensors promises about an index it returns.
void CheckIndexInvariants(const SafetensorsIndex& index, std::string_view image,
                          const std::string& what, Checker& checker) {
  const size_t data_begin = 8 + static_cast<size_t>(HeaderLength(image));
  const std::byte* expected = Bytes(image).data() + data_begin;
  for (const TensorView& t : index.tensors) {
    const int64_t elements = t.num_elements();
    if (elements < 0 || static_cast<uint64_t>(elements) * DtypeSize(t.dtype) != t.bytes.size()) {
      checker.Fail(what, absl::StrCat("tensor \"", t.name, "\": shape and byte count disagree"));
    }
    if (t.bytes.data() != expected && !t.bytes.empty()) {
      checker.Fail(what, absl::StrCat("tensor \"", t.name, "\" is not where the last ended"));
    }
    if (!t.bytes.empty()) expected = t.bytes.data() + t.bytes.size();
  }
  if (expected != Bytes(image).data() + image.size()) {
    checker.Fail(what, "the tensors do not end at the end of the file");
  }
}

// Parses `image` and, when that works, reads every tensor and the weights under every naming.
void CheckImage(const std::string& image, const core::AttentionConfig& config,
                const std::string& what, Checker& checker) {
  checker.Guarded(what, [&] {
    const absl::StatusOr<SafetensorsIndex> index = ParseSafetensors(Bytes(image));
    if (!index.ok()) {
      checker.ExpectClearError(index.status(), {absl::StatusCode::kInvalidArgument}, "", what);
      return;
    }
    ++checker.parsed;
    CheckIndexInvariants(*index, image, what, checker);
    for (const TensorView& t : index->tensors) {
      const absl::StatusOr<std::vector<float>> values = ReadFloat32(t);
      if (!values.ok()) {
        checker.ExpectClearError(values.status(), {absl::StatusCode::kInvalidArgument},
                                 absl::StrCat("tensor \"", t.name, "\""), what);
      } else if (values->size() != static_cast<size_t>(t.num_elements())) {
        checker.Fail(what, absl::StrCat("ReadFloat32 of \"", t.name, "\" has the wrong size"));
      }
    }
    const absl::StatusOr<WeightNaming> detected = DetectNaming(*index);
    if (!detected.ok()) {
      checker.ExpectClearError(detected.status(), {absl::StatusCode::kInvalidArgument}, "", what);
    } else if (ReadWeights(*index, config, *detected).ok()) {
      ++checker.loaded;
    }
    for (WeightNaming naming : {WeightNaming::kSeed, WeightNaming::kTorch, WeightNaming::kSplit}) {
      const absl::StatusOr<core::AttentionWeights> weights = ReadWeights(*index, config, naming);
      if (!weights.ok()) {
        checker.ExpectClearError(weights.status(), {absl::StatusCode::kInvalidArgument}, "", what);
      } else if (absl::Status s = weights->ValidateFor(config); !s.ok()) {
        checker.Fail(what, absl::StrCat("ReadWeights gave invalid weights: ", s.ToString()));
      }
    }
  });
}

// Writes `config_json` and `image` as a model folder and loads it as the server would.
void CheckFolder(const fs::path& folder, const std::string& config_json, const std::string& image,
                 const std::string& what, Checker& checker) {
  checker.Guarded(what, [&] {
    // Plain writes into a fresh folder (WriteFileAtomically's fsync would dominate the runtime).
    fs::create_directories(folder);
    std::ofstream(folder / kConfigFileName, std::ios::binary) << config_json;
    std::ofstream(folder / kWeightsFileName, std::ios::binary) << image;
    const absl::StatusOr<std::shared_ptr<const Model>> model = LoadModelFolder(folder);
    if (model.ok()) ++checker.loaded;
    if (!model.ok()) {
      checker.ExpectClearError(model.status(),
                               {absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound},
                               folder.string(), what);
    }
  });
}

// A corrupted copy of `seed` and what was done to it.
struct Mutant {
  std::string image;
  std::string what;
};

Mutant MutateImage(const std::string& seed, Rng& rng) {
  const size_t header_end = 8 + static_cast<size_t>(HeaderLength(seed));
  std::string header = seed.substr(8, header_end - 8);
  std::string data = seed.substr(header_end);
  std::string what;
  bool fix_length = true;
  const size_t edits = 1 + rng.Below(3);
  for (size_t e = 0; e < edits; ++e) {
    switch (rng.Below(4)) {
      case 0:
      case 1:
        what += MutateJson(header, rng) + "; ";
        break;
      case 2:
        what += "header bytes: " + MutateBytes(header, 0, header.size(), rng) + "; ";
        fix_length = !rng.OneIn(3);
        break;
      default:
        if (!data.empty()) what += "data bytes: " + MutateBytes(data, 0, data.size(), rng) + "; ";
        break;
    }
  }
  std::string image(8, '\0');
  SetHeaderLength(image, header.size());
  image += header;
  image += data;
  if (!fix_length || rng.OneIn(8)) {
    constexpr std::array<uint64_t, 9> kLengths = {
        0, 1, 7, 100'000'000, 100'000'001, UINT64_MAX, uint64_t{1} << 63, 8, 2};
    uint64_t length = HeaderLength(seed);
    switch (rng.Below(4)) {
      case 0:
        length = rng.Pick(kLengths);
        break;
      case 1:
        length = header.size() + rng.Below(17) - 8;
        break;
      case 2:
        length = image.size() - 8 + rng.Below(3) - 1;
        break;
      default:
        length = rng.Next();
        break;
    }
    SetHeaderLength(image, length);
    what += absl::StrCat("length ", length, "; ");
  }
  if (rng.OneIn(10)) {
    const size_t cut = rng.Below(image.size());
    image.resize(cut);
    what += absl::StrCat("truncated to ", cut, "; ");
  }
  return {std::move(image), std::move(what)};
}

// Overwrites elements of the data section with special values of their dtype (NaN, ±∞, the
// largest finite, subnormals, -0): ReadWeights must refuse the non-finite ones by name.
Mutant PoisonData(const std::string& seed, Rng& rng) {
  const absl::StatusOr<SafetensorsIndex> index = ParseSafetensors(Bytes(seed));
  std::string image = seed;
  std::string what = "poison:";
  if (!index.ok() || index->tensors.empty()) return {image, "poison: no tensors"};
  const size_t count = 1 + rng.Below(3);
  for (size_t i = 0; i < count; ++i) {
    const TensorView& t = index->tensors[rng.Below(index->tensors.size())];
    if (t.num_elements() == 0) continue;
    const size_t element = rng.Below(static_cast<size_t>(t.num_elements()));
    const size_t offset =
        static_cast<size_t>(t.bytes.data() - Bytes(seed).data()) + element * DtypeSize(t.dtype);
    if (t.dtype == TensorDtype::kF32) {
      constexpr std::array<uint32_t, 7> kBits = {0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu,
                                                 0x00000001u, 0x80000000u, 0x7f800001u};
      const uint32_t bits = rng.Pick(kBits);
      std::memcpy(image.data() + offset, &bits, sizeof(bits));
    } else {
      constexpr std::array<uint16_t, 7> kBits = {0x7e00u, 0x7c00u, 0xfc00u, 0x7bffu,
                                                 0x0001u, 0x8000u, 0x7f80u};
      const uint16_t bits = rng.Pick(kBits);
      std::memcpy(image.data() + offset, &bits, sizeof(bits));
    }
    what += absl::StrCat(" \"", t.name, "\"[", element, "]");
  }
  return {std::move(image), std::move(what)};
}

// --- Tests -----------------------------------------------------------------------------------

class SafetensorsMutationTest : public ::testing::Test {
 protected:
  void TearDown() override {
    EXPECT_EQ(checker_.failures(), 0) << checker_.failures() << " of " << checker_.cases()
                                      << " cases failed (the first 10 are shown above)";
    if (checker_.cases() > 0) {
      std::printf("%d cases: %d parsed, %d loaded; %d clean errors\n", checker_.cases(),
                  checker_.parsed, checker_.loaded, checker_.errors());
    }
  }

  const std::vector<SeedImage> seeds_ = SeedImages();
  Checker checker_;
};

TEST_F(SafetensorsMutationTest, SeedImagesLoad) {
  for (const SeedImage& seed : seeds_) {
    const absl::StatusOr<SafetensorsIndex> index = ParseSafetensors(Bytes(seed.image));
    ASSERT_TRUE(index.ok()) << seed.label << ": " << index.status();
    const absl::StatusOr<WeightNaming> naming = DetectNaming(*index);
    ASSERT_TRUE(naming.ok()) << seed.label << ": " << naming.status();
    EXPECT_TRUE(ReadWeights(*index, seed.config, *naming).ok()) << seed.label;
  }
}

TEST_F(SafetensorsMutationTest, TruncatedAtEveryHeaderPositionAndInTheData) {
  Rng rng(1);
  for (const SeedImage& seed : seeds_) {
    const size_t header_end = 8 + static_cast<size_t>(HeaderLength(seed.image));
    for (size_t cut = 0; cut <= header_end; ++cut) {
      CheckImage(seed.image.substr(0, cut), seed.config,
                 absl::StrCat(seed.label, ": truncated to ", cut), checker_);
    }
    for (int i = 0; i < 16; ++i) {
      const size_t cut = header_end + 1 + rng.Below(seed.image.size() - header_end - 1);
      CheckImage(seed.image.substr(0, cut), seed.config,
                 absl::StrCat(seed.label, ": truncated to ", cut), checker_);
    }
  }
}

TEST_F(SafetensorsMutationTest, RandomMutationsOfHeaderLengthAndData) {
  Rng rng(2);
  for (const SeedImage& seed : seeds_) {
    for (int i = 0; i < 1500; ++i) {
      const Mutant m = MutateImage(seed.image, rng);
      CheckImage(m.image, seed.config, absl::StrCat(seed.label, " #", i, ": ", m.what), checker_);
    }
  }
}

TEST_F(SafetensorsMutationTest, NonFiniteValuesAreRefused) {
  Rng rng(3);
  for (const SeedImage& seed : seeds_) {
    for (int i = 0; i < 60; ++i) {
      const Mutant m = PoisonData(seed.image, rng);
      CheckImage(m.image, seed.config, absl::StrCat(seed.label, " #", i, ": ", m.what), checker_);
    }
  }
}

TEST_F(SafetensorsMutationTest, MutatedFoldersLoadOrFailWithThePath) {
  attnserve::testing::TempFolder temp("mutation_test");
  Rng rng(4);
  for (size_t s = 0; s < seeds_.size(); ++s) {
    const SeedImage& seed = seeds_[s];
    ModelConfig config;
    config.attention = seed.config;
    const std::string config_json = ModelConfigToJson(config);
    for (int i = 0; i < 20; ++i) {
      const Mutant m = i < 3 ? PoisonData(seed.image, rng) : MutateImage(seed.image, rng);
      CheckFolder(temp.path() / absl::StrCat("m", s, "_", i), config_json, m.image,
                  absl::StrCat(seed.label, " folder #", i, ": ", m.what), checker_);
    }
  }
}

// --- config.json -----------------------------------------------------------------------------

std::vector<std::string> SeedConfigs() {
  ModelConfig full;
  full.attention = Config(64, 4, false, true);
  full.max_sequence_length = 4096;
  full.batching = {.max_batch_sequences = 64,
                   .max_batch_tokens = 8192,
                   .max_queue_delay_us = 1000,
                   .max_queue_size = 1024,
                   .max_queued_bytes = 1 << 28};
  ModelConfig single;
  single.attention = Config(8, 1, true, false);
  return {ModelConfigToJson(full), ModelConfigToJson(single),
          R"({"d_model":4,"num_heads":2,"bias":true,"batching":{"max_queue_size":1}})",
          R"({ "num_heads" : 1 , "d_model" : 2 , "variant" : "single_head" })"};
}

void CheckConfig(const std::string& text, const std::string& what, Checker& checker) {
  checker.Guarded(what, [&] {
    const absl::StatusOr<ModelConfig> config = ParseModelConfig(text);
    if (!config.ok()) {
      checker.ExpectClearError(config.status(), {absl::StatusCode::kInvalidArgument}, "", what);
      return;
    }
    ++checker.parsed;
    // What parses is valid, and survives a round trip.
    if (absl::Status s = config->attention.Validate(); !s.ok()) {
      checker.Fail(what, absl::StrCat("parsed an invalid config: ", s.ToString()));
    }
    const absl::StatusOr<ModelConfig> back = ParseModelConfig(ModelConfigToJson(*config));
    if (!back.ok() || back->attention.d_model != config->attention.d_model ||
        back->attention.num_heads != config->attention.num_heads ||
        back->attention.variant != config->attention.variant ||
        back->attention.bias != config->attention.bias ||
        back->max_sequence_length != config->max_sequence_length ||
        back->batching != config->batching) {
      checker.Fail(what, "the parsed config does not round-trip through ModelConfigToJson");
    }
  });
}

using ConfigMutationTest = SafetensorsMutationTest;

TEST_F(ConfigMutationTest, TruncatedAtEveryPosition) {
  for (const std::string& seed : SeedConfigs()) {
    ASSERT_TRUE(ParseModelConfig(seed).ok()) << seed;
    for (size_t cut = 0; cut < seed.size(); ++cut) {
      CheckConfig(seed.substr(0, cut), absl::StrCat("truncated to ", cut, ": ", seed), checker_);
    }
  }
}

TEST_F(ConfigMutationTest, RandomMutations) {
  Rng rng(5);
  const std::vector<std::string> seeds = SeedConfigs();
  for (size_t s = 0; s < seeds.size(); ++s) {
    for (int i = 0; i < 1000; ++i) {
      std::string text = seeds[s];
      std::string what = absl::StrCat("config ", s, " #", i, ": ");
      const size_t edits = 1 + rng.Below(3);
      for (size_t e = 0; e < edits; ++e) {
        what +=
            (rng.Below(3) == 0 ? MutateBytes(text, 0, text.size(), rng) : MutateJson(text, rng)) +
            "; ";
      }
      CheckConfig(text, what, checker_);
    }
  }
}

TEST_F(ConfigMutationTest, MutatedConfigsInFoldersLoadOrFailWithThePath) {
  attnserve::testing::TempFolder temp("config_mutation_test");
  Rng rng(6);
  // Weights for d_model 4 with bias, seed naming: most configs that parse will not match them.
  const SeedImage& seed = seeds_[0];
  ModelConfig config;
  config.attention = seed.config;
  const std::string good = ModelConfigToJson(config);
  for (int i = 0; i < 40; ++i) {
    std::string text = good;
    const std::string what = absl::StrCat("config folder #", i, ": ", MutateJson(text, rng));
    CheckFolder(temp.path() / absl::StrCat("c", i), text, seed.image, what, checker_);
  }
}

}  // namespace
}  // namespace attnserve::model::safetensors_mutation_test
