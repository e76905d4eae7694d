// NumpyLegacyRandom: bit-exact NumPy legacy random streams (np.random.seed / rand / randn), so
// that C++ programs can rebuild the seed article's example data exactly.
//
// NumPy's legacy RandomState is MT19937 seeded with init_genrand(seed), doubles built from two
// 32-bit draws (a >> 5, b >> 6) and normals from the Marsaglia polar method, which caches the
// second value of each pair. Not thread-safe.
#ifndef ATTNSERVE_TOOLS_NUMPY_RANDOM_H_
#define ATTNSERVE_TOOLS_NUMPY_RANDOM_H_

#include <cstdint>
#include <random>

namespace attnserve::tools {

class NumpyLegacyRandom {
 public:
  // As np.random.seed(seed).
  explicit NumpyLegacyRandom(uint32_t seed) : engine_(seed) {}

  // As np.random.random_sample(): uniform on [0, 1) with 53 random bits.
  double Uniform();
  // As np.random.randn() / standard_normal().
  double Normal();

 private:
  std::mt19937 engine_;
  bool has_cached_normal_ = false;
  double cached_normal_ = 0.0;
};

}  // namespace attnserve::tools

#endif  // ATTNSERVE_TOOLS_NUMPY_RANDOM_H_
