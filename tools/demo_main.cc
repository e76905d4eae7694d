// attnserve-demo: runs the seed article's example (T=4, d_model=8, h=2) through the oneDNN core
// and prints the output shape and each head's attention weights.
#include <cstdio>
#include <vector>

#include "core/attention_executor.h"
#include "core/attention_layer.h"
#include "core/onednn_support.h"

namespace core = attnserve::core;

int main() {
  const core::AttentionConfig config{.d_model = 8, .num_heads = 2};
  auto layer = core::AttentionLayer::Create(config, core::MakeRandomWeights(config, 42));
  if (!layer.ok()) {
    std::fprintf(stderr, "attnserve-demo: %s\n", layer.status().ToString().c_str());
    return 1;
  }
  constexpr int64_t kTokens = 4;
  std::vector<float> x(kTokens * config.d_model);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 37 % 17)) / 8.0f - 1.0f;
  const std::vector<int64_t> offsets{0, kTokens};
  std::vector<float> output(x.size()), weights(config.num_heads * kTokens * kTokens);

  core::AttentionExecutor executor;
  const core::AttentionInputs in{.query = {.data = x, .offsets = offsets}};
  if (auto s = executor.Forward(**layer, in, {.output = output, .weights = weights}); !s.ok()) {
    std::fprintf(stderr, "attnserve-demo: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("oneDNN %s (%s)\n", core::OneDnnVersion().c_str(), core::OneDnnIsa().c_str());
  std::printf("input shape:  (%ld, %ld)\n", kTokens, config.d_model);
  std::printf("output shape: (%ld, %ld)\n", kTokens, config.d_model);
  for (int64_t h = 0; h < config.num_heads; ++h) {
    std::printf("\nhead %ld attention weights:\n", h + 1);
    for (int64_t i = 0; i < kTokens; ++i) {
      for (int64_t j = 0; j < kTokens; ++j) {
        std::printf(" %6.3f", weights[(h * kTokens + i) * kTokens + j]);
      }
      std::printf("\n");
    }
  }
  return 0;
}
