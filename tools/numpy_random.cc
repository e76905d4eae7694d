#include "tools/numpy_random.h"

#include <cmath>

namespace attnserve::tools {

double NumpyLegacyRandom::Uniform() {
  const uint32_t a = static_cast<uint32_t>(engine_()) >> 5;
  const uint32_t b = static_cast<uint32_t>(engine_()) >> 6;
  return (a * 67108864.0 + b) / 9007199254740992.0;
}

double NumpyLegacyRandom::Normal() {
  if (has_cached_normal_) {
    has_cached_normal_ = false;
    return cached_normal_;
  }
  double x1, x2, r2;
  do {
    x1 = 2.0 * Uniform() - 1.0;
    x2 = 2.0 * Uniform() - 1.0;
    r2 = x1 * x1 + x2 * x2;
  } while (r2 >= 1.0 || r2 == 0.0);
  const double f = std::sqrt(-2.0 * std::log(r2) / r2);
  cached_normal_ = f * x1;
  has_cached_normal_ = true;
  return f * x2;
}

}  // namespace attnserve::tools
