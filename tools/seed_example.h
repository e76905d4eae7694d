// The worked example of the multi-head attention seed article: np.random.seed(42), T = 4 tokens,
// d_model = 8, h = 2, X ~ randn(4, 8), W_Q, W_K, W_V, W_O ~ randn(8, 8) · 0.1, no bias, no mask,
// drawn in that order — rebuilt bit-exactly, so attnserve prints the article's numbers.
#ifndef ATTNSERVE_TOOLS_SEED_EXAMPLE_H_
#define ATTNSERVE_TOOLS_SEED_EXAMPLE_H_

#include <vector>

#include "core/forward/attention_config.h"
#include "core/forward/attention_weights.h"

namespace attnserve::tools {

struct SeedExample {
  core::AttentionConfig config;
  core::AttentionWeights weights;  // Internal layout (the seed's X @ W matches it directly).
  std::vector<float> x;            // [4, 8] row-major.
  int64_t tokens = 0;
};

SeedExample MakeSeedExample();

}  // namespace attnserve::tools

#endif  // ATTNSERVE_TOOLS_SEED_EXAMPLE_H_
