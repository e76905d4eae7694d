// Reading Prometheus' text exposition format in tests: every sample line as "name{labels}" (as
// printed) → value.
#ifndef ATTNSERVE_TESTS_SERVER_METRICS_EXPOSITION_H_
#define ATTNSERVE_TESTS_SERVER_METRICS_EXPOSITION_H_

#include <map>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace attnserve::testing {

using Samples = std::map<std::string, double>;

// Parses `text`; comment lines (# HELP, # TYPE) are skipped. InvalidArgument naming the line for
// a sample line without a value.
absl::StatusOr<Samples> ParseExposition(std::string_view text);

// Scrapes http://127.0.0.1:<port>/metrics and parses it.
absl::StatusOr<Samples> Scrape(int port);

// The value of `series` ("name" or "name{labels}"), or -1 when absent.
double ValueOf(const Samples& samples, const std::string& series);

// How many samples start with `prefix` (a metric name plus "{" or " " picks one metric).
int CountSeries(const Samples& samples, std::string_view prefix);

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_SERVER_METRICS_EXPOSITION_H_
