// attnserve-demo: runs the seed article's example (np.random.seed(42), T=4, d_model=8, h=2)
// through the oneDNN core and prints the output shape and each head's attention weights — the
// same numbers the article's NumPy code prints.
#include <cstdio>
#include <vector>

#include "core/forward/attention_executor.h"
#include "core/forward/attention_layer.h"
#include "core/forward/onednn_support.h"
#include "tools/seed_example.h"

namespace core = attnserve::core;

int main() {
  const attnserve::tools::SeedExample example = attnserve::tools::MakeSeedExample();
  const core::AttentionConfig& config = example.config;
  auto layer = core::AttentionLayer::Create(config, example.weights);
  if (!layer.ok()) {
    std::fprintf(stderr, "attnserve-demo: %s\n", layer.status().ToString().c_str());
    return 1;
  }
  const int64_t t = example.tokens, d = config.d_model, h = config.num_heads;
  const std::vector<int64_t> offsets{0, t};
  std::vector<float> output(t * d), weights(h * t * t);
  core::AttentionExecutor executor;
  const core::AttentionInputs in{.query = {.data = example.x, .offsets = offsets}};
  if (auto s = executor.Forward(**layer, in, {.output = output, .weights = weights}); !s.ok()) {
    std::fprintf(stderr, "attnserve-demo: %s\n", s.ToString().c_str());
    return 1;
  }

  std::printf("attnserve core on oneDNN %s (%s)\n", core::OneDnnVersion().c_str(),
              core::OneDnnIsa().c_str());
  std::printf("seed example: np.random.seed(42), T=%ld, d_model=%ld, h=%ld, %ld parameters\n", t, d,
              h, config.ParameterCount());
  std::printf("input shape:  (%ld, %ld)\n", t, d);
  std::printf("output shape: (%ld, %ld)\n", t, d);
  for (int64_t head = 0; head < h; ++head) {
    std::printf("\nhead %ld attention weights:\n", head + 1);
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t j = 0; j < t; ++j) std::printf(" %6.3f", weights[(head * t + i) * t + j]);
      std::printf("\n");
    }
  }
  std::printf("\noutput:\n");
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < d; ++j) std::printf(" %8.4f", output[i * d + j]);
    std::printf("\n");
  }
  return 0;
}
