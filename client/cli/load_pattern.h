// What `attnserve-cli bench` sends and when: the per-request sequence length (fixed, or uniform
// over an integer range) and the open-loop arrival schedule (Poisson or fixed interval). Both are
// deterministic for a seed: request i's length depends only on (seed, i), whatever the order in
// which concurrent senders take the requests.
//
// SeqLenRange is an immutable value (thread-safe); ArrivalSchedule is not thread-safe (one
// sender thread owns it).
#ifndef ATTNSERVE_CLIENT_CLI_LOAD_PATTERN_H_
#define ATTNSERVE_CLIENT_CLI_LOAD_PATTERN_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace attnserve::cli {

struct SeqLenRange {
  int64_t min = 16;
  int64_t max = 16;

  // "16" (fixed) or "8:256" (uniform integers, both ends included); every length >= 1.
  static absl::StatusOr<SeqLenRange> Parse(const std::string& text);
  // The length of request `index` (0-based).
  int64_t For(uint64_t seed, int64_t index) const;
  double Mean() const { return 0.5 * static_cast<double>(min + max); }
  std::string ToString() const;
};

enum class Arrival {
  kPoisson,  // Exponential gaps with mean 1/rate: independent arrivals, as from many users.
  kFixed,    // Exactly 1/rate apart.
};

// The send times of an open-loop run at `rate` requests per second from `start`.
class ArrivalSchedule {
 public:
  ArrivalSchedule(double rate, Arrival arrival, uint64_t seed,
                  std::chrono::steady_clock::time_point start);
  // The next send time (the first is `start`).
  std::chrono::steady_clock::time_point Next();

 private:
  const double rate_;
  const Arrival arrival_;
  uint64_t state_;
  std::chrono::steady_clock::time_point next_;
  double offset_s_ = 0;  // From start, accumulated in double so rounding does not drift.
  const std::chrono::steady_clock::time_point start_;
};

}  // namespace attnserve::cli

#endif  // ATTNSERVE_CLIENT_CLI_LOAD_PATTERN_H_
