// attnserve's KV cache against torch 1.13 incremental decoding: every case
// make_torch_decode_cases.py wrote (a torch MHA exported as a model folder, a sequence, and torch's
// output of each step fed the growing prefix) is loaded through the real model path, run as a
// prefill of a few tokens followed by one-token decode steps over the paged cache, and compared
// row by row. The cases folder comes from ATTNSERVE_TORCH_DECODE_CASES (set by CTest).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/kv_cache/cached_attention.h"
#include "core/model/model.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

namespace fs = std::filesystem;

// As torch_interop_test: torch's and oneDNN's fp32 differ in summation order.
constexpr double kTolerance = 1e-4;

std::vector<float> ReadFloats(const fs::path& path, size_t count) {
  std::vector<float> values(count);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(count * 4));
  EXPECT_TRUE(in.good() && in.peek() == EOF) << path << ": expected exactly " << count << " floats";
  return values;
}

TEST(TorchDecodeInteropTest, PrefillThenDecodeStepsMatchTorchFedTheGrowingPrefix) {
  const char* env = std::getenv("ATTNSERVE_TORCH_DECODE_CASES");
  ASSERT_NE(env, nullptr) << "ATTNSERVE_TORCH_DECODE_CASES is not set: point it at the folder "
                             "tests/interop/make_torch_decode_cases.py --out wrote";
  const fs::path folder(env);
  std::ifstream manifest(folder / "cases.txt");
  ASSERT_TRUE(manifest.good()) << folder / "cases.txt";
  int cases = 0;
  std::string line;
  while (std::getline(manifest, line)) {
    std::istringstream fields(line);
    std::string name;
    int64_t length = 0, d = 0;
    ASSERT_TRUE(fields >> name >> length >> d) << line;
    SCOPED_TRACE("case " + name);
    const auto loaded = model::LoadModelFolder(folder / name / "model");
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const core::AttentionLayer& layer = *(*loaded)->layer;
    ASSERT_EQ(layer.config().d_model, d);
    const std::vector<float> x = ReadFloats(folder / name / "query.f32", length * d);
    const std::vector<float> expected = ReadFloats(folder / name / "expected.f32", length * d);

    auto pool = core::KvBlockPool::Create(
        layer.config(),
        {.block_tokens = 8, .budget_bytes = 4 << 20, .max_sequence_tokens = length});
    ASSERT_TRUE(pool.ok()) << pool.status();
    core::CachedAttentionExecutor executor;
    core::KvSequence seq;
    core::KvSequence* caches[] = {&seq};
    std::vector<float> out(x.size());
    constexpr int64_t kPrefill = 5;
    for (int64_t r = 0; r < length;) {
      const int64_t n = r == 0 ? kPrefill : 1;
      const std::vector<int64_t> offsets{0, n};
      const core::CachedAttentionInputs in{.query = {std::span(x).subspan(r * d, n * d), offsets},
                                           .caches = caches,
                                           .mask = {.causal = true}};
      const absl::Status s =
          executor.Forward(layer, **pool, in, {.output = std::span(out).subspan(r * d, n * d)});
      ASSERT_TRUE(s.ok()) << s;
      r += n;
    }
    double worst = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      worst = std::max(worst, std::fabs(double{out[i]} - expected[i]));
    }
    EXPECT_LE(worst, kTolerance) << "largest |attnserve - torch| over " << length << " steps";
    std::cout << "[ case     ] " << name << ": " << length << " steps, max |diff| " << worst
              << "\n";
    (*pool)->Release(seq);
    ++cases;
  }
  EXPECT_GE(cases, 3) << "the generator's case list shrank";
}

}  // namespace
}  // namespace attnserve
