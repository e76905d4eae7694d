#include "client/cli/random_values.h"

namespace attnserve::cli {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::vector<float> RandomValues(size_t count, uint64_t seed) {
  std::vector<float> values(count);
  uint64_t state = seed;
  for (float& value : values) {
    // The top 24 bits give every float in [0, 1) a float32-exact step of 2^-24.
    const double unit = static_cast<double>(SplitMix64(state) >> 40) * 0x1.0p-24;
    value = static_cast<float>(2.0 * unit - 1.0);
  }
  return values;
}

}  // namespace attnserve::cli
