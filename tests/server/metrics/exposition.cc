#include "tests/server/metrics/exposition.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/support/http_get.h"

namespace attnserve::testing {

absl::StatusOr<Samples> ParseExposition(std::string_view text) {
  Samples samples;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    if (line.empty() || line.front() == '#') continue;
    // Label values in these tests hold no spaces, so the value follows the last space.
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("sample line without a value: ", line));
    }
    const std::string value(line.substr(space + 1));
    samples[std::string(line.substr(0, space))] = std::strtod(value.c_str(), nullptr);
  }
  return samples;
}

absl::StatusOr<Samples> Scrape(int port) {
  absl::StatusOr<std::string> page = HttpGet(port, "/metrics");
  if (!page.ok()) return page.status();
  return ParseExposition(*page);
}

double ValueOf(const Samples& samples, const std::string& series) {
  auto it = samples.find(series);
  return it != samples.end() ? it->second : -1;
}

int CountSeries(const Samples& samples, std::string_view prefix) {
  int count = 0;
  for (const auto& [series, value] : samples) {
    if (std::string_view(series).starts_with(prefix)) ++count;
  }
  return count;
}

}  // namespace attnserve::testing
