// Seeded mutations of text for robustness tests: a portable random stream and JSON-aware and
// byte-level edits. Deterministic: the same seed gives the same edits on every platform.
#ifndef ATTNSERVE_TESTS_MODEL_MUTATIONS_H_
#define ATTNSERVE_TESTS_MODEL_MUTATIONS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace attnserve::testing {

// splitmix64: portable and fully specified (the std distributions are not), so every platform
// runs the same cases.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n); 0 when n is 0.
  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(Next() % n); }
  bool OneIn(size_t n) { return Below(n) == 0; }
  template <typename T, size_t N>
  const T& Pick(const std::array<T, N>& items) {
    return items[Below(N)];
  }

 private:
  uint64_t state_;
};

// One JSON-level edit of `json`: a number or value replaced, a member duplicated (same key, the
// same or another value), deleted or renamed, or two values swapped. Returns a description.
std::string MutateJson(std::string& json, Rng& rng);

// One byte-level edit somewhere in `text` [from, to): bit flips, overwrites, insertions or a
// deletion. Returns a description.
std::string MutateBytes(std::string& text, size_t from, size_t to, Rng& rng);

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_MODEL_MUTATIONS_H_
