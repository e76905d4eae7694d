// Per-model compute type: config.json's "compute_dtype", the load-time override, and the refusal
// of bf16 where the CPU has no native bf16 unless emulation is allowed.
//
// ctest runs this binary three times: as is (native bf16 on AVX512-BF16/AMX machines; the tests
// that need the other kind of CPU skip), with ONEDNN_MAX_CPU_ISA=AVX512_CORE (bf16 emulated: the
// refusal and the allowed-emulation paths) and with AVX2 (no bf16 kernels at all: refused either
// way). With a cap set, the refusal test asserts the cap took effect instead of skipping.
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/forward/attention_executor.h"
#include "core/forward/attention_weights.h"
#include "core/forward/onednn_support.h"
#include "core/model/model.h"
#include "core/model/model_config.h"
#include "core/model/model_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/repository/model_repository.h"
#include "tests/support/temp_folder.h"

namespace attnserve::model {
namespace {

namespace fs = std::filesystem;
using ::attnserve::testing::TempFolder;
using ::testing::HasSubstr;

ModelConfig Config(core::ComputeType type) {
  ModelConfig config;
  config.attention = {.d_model = 16, .num_heads = 2, .bias = true, .compute_type = type};
  return config;
}

fs::path WriteFolder(const TempFolder& repo, const std::string& name, core::ComputeType type) {
  const ModelConfig config = Config(type);
  EXPECT_TRUE(WriteModelFolder(repo.path() / name, config,
                               core::MakeRandomWeights(config.attention, 3), WeightNaming::kSeed,
                               TensorDtype::kF32)
                  .ok());
  return repo.path() / name;
}

// The model runs and gives a finite output.
void ExpectRuns(const Model& model) {
  const int64_t d = model.config.attention.d_model;
  std::vector<float> x(5 * d, 0.25f), out(x.size());
  const std::vector<int64_t> offsets = {0, 2, 5};
  core::AttentionExecutor executor;
  ASSERT_TRUE(
      executor.Forward(*model.layer, {.query = {.data = x, .offsets = offsets}}, {.output = out})
          .ok());
  for (float v : out) ASSERT_TRUE(std::isfinite(v));
}

bool IsaCappedByEnvironment() {
  return std::getenv("ONEDNN_MAX_CPU_ISA") != nullptr || std::getenv("DNNL_MAX_CPU_ISA") != nullptr;
}

TEST(ComputeDtypeConfigTest, ParsesDefaultsAndRoundTrips) {
  absl::StatusOr<ModelConfig> plain = ParseModelConfig(R"({"d_model": 8, "num_heads": 2})");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->attention.compute_type, core::ComputeType::kFloat32);
  absl::StatusOr<ModelConfig> bf16 =
      ParseModelConfig(R"({"d_model": 8, "num_heads": 2, "compute_dtype": "bf16"})");
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->attention.compute_type, core::ComputeType::kBFloat16);
  absl::StatusOr<ModelConfig> again = ParseModelConfig(ModelConfigToJson(*bf16));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->attention.compute_type, core::ComputeType::kBFloat16);
}

TEST(ComputeDtypeConfigTest, UnknownComputeDtypeNamesTheKeyAndValues) {
  for (const char* value : {R"("fp16")", R"(16)", R"("BF16")"}) {
    absl::StatusOr<ModelConfig> c = ParseModelConfig(
        std::string(R"({"d_model": 8, "num_heads": 2, "compute_dtype": )") + value + "}");
    ASSERT_FALSE(c.ok()) << value;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(c.status().message(), HasSubstr("compute_dtype"));
    EXPECT_THAT(c.status().message(), HasSubstr("\"bf16\""));
  }
}

// The server's --kv-cache-dtype fills config.json's kv_cache_dtype where it is unset; a folder's
// own value wins.
TEST(KvCacheDtypeLoadTest, TheDefaultFillsAnUnsetKeyAndTheFoldersOwnValueWins) {
  TempFolder repo;
  const fs::path plain = WriteFolder(repo, "plain", core::ComputeType::kFloat32);
  ModelConfig pinned_config = Config(core::ComputeType::kFloat32);
  pinned_config.kv_cache_dtype = KvCacheDtype::kAuto;
  ASSERT_TRUE(WriteModelFolder(repo.path() / "pinned", pinned_config,
                               core::MakeRandomWeights(pinned_config.attention, 3),
                               WeightNaming::kSeed, TensorDtype::kF32)
                  .ok());
  for (const KvCacheDtype fallback : {KvCacheDtype::kAuto, KvCacheDtype::kInt8}) {
    const LoadOptions options{.default_kv_cache_dtype = fallback};
    absl::StatusOr<std::shared_ptr<const Model>> a = LoadModelFolder(plain, options);
    absl::StatusOr<std::shared_ptr<const Model>> b =
        LoadModelFolder(repo.path() / "pinned", options);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
    EXPECT_EQ((*a)->config.kv_cache_dtype, fallback);
    EXPECT_EQ((*b)->config.kv_cache_dtype, KvCacheDtype::kAuto);
  }
}

TEST(ComputeDtypeLoadTest, OverrideReplacesEveryConfigValue) {
  TempFolder repo;
  const fs::path fp32 = WriteFolder(repo, "fp32", core::ComputeType::kFloat32);
  const fs::path bf16 = WriteFolder(repo, "bf16", core::ComputeType::kBFloat16);
  // Emulation allowed so that this test means the same on every CPU.
  if (!core::HasBf16Kernels()) GTEST_SKIP() << "no bf16 kernels on " << core::OneDnnIsa();
  const LoadOptions to_bf16{.compute_type = core::ComputeType::kBFloat16,
                            .allow_bf16_emulation = true};
  const LoadOptions to_fp32{.compute_type = core::ComputeType::kFloat32};
  for (const fs::path& folder : {fp32, bf16}) {
    absl::StatusOr<std::shared_ptr<const Model>> as_bf16 = LoadModelFolder(folder, to_bf16);
    ASSERT_TRUE(as_bf16.ok()) << as_bf16.status();
    EXPECT_EQ((*as_bf16)->layer->config().compute_type, core::ComputeType::kBFloat16);
    ExpectRuns(**as_bf16);
    absl::StatusOr<std::shared_ptr<const Model>> as_fp32 = LoadModelFolder(folder, to_fp32);
    ASSERT_TRUE(as_fp32.ok()) << as_fp32.status();
    EXPECT_EQ((*as_fp32)->layer->config().compute_type, core::ComputeType::kFloat32);
    ExpectRuns(**as_fp32);
  }
}

TEST(ComputeDtypeLoadTest, NativeBf16LoadsBf16Models) {
  if (!core::HasNativeBf16()) GTEST_SKIP() << "oneDNN ISA " << core::OneDnnIsa();
  TempFolder repo;
  absl::StatusOr<std::shared_ptr<const Model>> m =
      LoadModelFolder(WriteFolder(repo, "m", core::ComputeType::kBFloat16));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->config.attention.compute_type, core::ComputeType::kBFloat16);
  ExpectRuns(**m);
}

TEST(ComputeDtypeLoadTest, WithoutNativeBf16RefusesUnlessEmulationAllowed) {
  if (IsaCappedByEnvironment()) {
    ASSERT_FALSE(core::HasNativeBf16()) << "the ISA cap did not take effect: " << core::OneDnnIsa();
  }
  if (core::HasNativeBf16()) GTEST_SKIP() << "native bf16 (" << core::OneDnnIsa() << ")";
  TempFolder repo;
  const fs::path folder = WriteFolder(repo, "m", core::ComputeType::kBFloat16);
  absl::StatusOr<std::shared_ptr<const Model>> refused = LoadModelFolder(folder);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("compute_dtype bf16"));
  EXPECT_THAT(refused.status().message(), HasSubstr("ISA is " + core::OneDnnIsa()));
  EXPECT_THAT(refused.status().message(), HasSubstr("--allow-bf16-emulation"));
  // The override refuses the same way; fp32 models are unaffected.
  const fs::path fp32 = WriteFolder(repo, "fp32", core::ComputeType::kFloat32);
  EXPECT_EQ(LoadModelFolder(fp32, {.compute_type = core::ComputeType::kBFloat16}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(LoadModelFolder(fp32).ok());

  absl::StatusOr<std::shared_ptr<const Model>> emulated =
      LoadModelFolder(folder, {.allow_bf16_emulation = true});
  if (!core::HasBf16Kernels()) {
    // Below avx512_core oneDNN 2.6 cannot even emulate: a clear refusal, not a packing error.
    EXPECT_EQ(emulated.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(emulated.status().message(), HasSubstr("ISA " + core::OneDnnIsa()));
    return;
  }
  ASSERT_TRUE(emulated.ok()) << emulated.status();
  ExpectRuns(**emulated);
}

TEST(ComputeDtypeLoadTest, OverrideAppliesToTheEmbeddedDemoModel) {
  TempFolder repo;
  auto open = [&](std::optional<core::ComputeType> type) {
    return repository::ModelRepository::Open(
        {.root = repo.path() / "absent",
         .demo_model = repository::DemoModelPolicy::kAlways,
         .load = {.compute_type = type, .allow_bf16_emulation = true}});
  };
  auto fp32 = open(std::nullopt);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  absl::StatusOr<std::shared_ptr<const Model>> demo = (*fp32)->Get(kDemoModelName);
  ASSERT_TRUE(demo.ok()) << demo.status();
  EXPECT_EQ((*demo)->layer->config().compute_type, core::ComputeType::kFloat32);
  if (!core::HasBf16Kernels()) return;
  auto bf16 = open(core::ComputeType::kBFloat16);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  demo = (*bf16)->Get(kDemoModelName);
  ASSERT_TRUE(demo.ok()) << demo.status();
  EXPECT_EQ((*demo)->layer->config().compute_type, core::ComputeType::kBFloat16);
  EXPECT_EQ((*demo)->config.attention.compute_type, core::ComputeType::kBFloat16);
  ExpectRuns(**demo);
}

}  // namespace
}  // namespace attnserve::model
