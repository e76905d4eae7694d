#include "client/cli/load_pattern.h"

#include <cmath>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli/random_values.h"

namespace attnserve::cli {

absl::StatusOr<SeqLenRange> SeqLenRange::Parse(const std::string& text) {
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  SeqLenRange range;
  bool ok = parts.size() == 1 || parts.size() == 2;
  ok = ok && absl::SimpleAtoi(parts.front(), &range.min);
  range.max = range.min;
  if (ok && parts.size() == 2) ok = absl::SimpleAtoi(parts.back(), &range.max);
  if (!ok || range.min < 1 || range.max < range.min) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seq-len '", text,
                     "': expected a length like 16 or a range like 8:256 (1 <= min <= max)"));
  }
  return range;
}

int64_t SeqLenRange::For(uint64_t seed, int64_t index) const {
  if (min == max) return min;
  // One SplitMix64 step from a state mixing seed and index: independent of the send order.
  uint64_t state = seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(index);
  const uint64_t span = static_cast<uint64_t>(max - min) + 1;
  return min + static_cast<int64_t>(SplitMix64(state) % span);
}

std::string SeqLenRange::ToString() const {
  return min == max ? absl::StrCat(min) : absl::StrCat(min, ":", max);
}

ArrivalSchedule::ArrivalSchedule(double rate, Arrival arrival, uint64_t seed,
                                 std::chrono::steady_clock::time_point start)
    : rate_(rate), arrival_(arrival), state_(seed), next_(start), start_(start) {}

std::chrono::steady_clock::time_point ArrivalSchedule::Next() {
  const std::chrono::steady_clock::time_point now = next_;
  double gap_s = 1.0 / rate_;
  if (arrival_ == Arrival::kPoisson) {
    // Inverse transform of a uniform in (0, 1]: never log(0).
    const double uniform = (static_cast<double>(SplitMix64(state_) >> 11) + 1.0) * 0x1.0p-53;
    gap_s = -std::log(uniform) / rate_;
  }
  offset_s_ += gap_s;
  next_ = start_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(offset_s_));
  return now;
}

}  // namespace attnserve::cli
