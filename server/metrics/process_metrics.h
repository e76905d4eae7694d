// Process metrics under Prometheus' standard names (process_cpu_seconds_total,
// process_resident_memory_bytes, ...), read from /proc at scrape time, as the official client
// libraries export them. prometheus-cpp has none.
//
// Thread-safe (each scrape reads /proc afresh).
#ifndef ATTNSERVE_SERVER_METRICS_PROCESS_METRICS_H_
#define ATTNSERVE_SERVER_METRICS_PROCESS_METRICS_H_

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"

namespace attnserve::server::metrics {

struct ProcessSample {
  double cpu_seconds = 0;  // User plus system time.
  double resident_memory_bytes = 0;
  double virtual_memory_bytes = 0;
  double start_time_seconds = 0;  // Since the Unix epoch.
  double open_fds = 0;
  double max_fds = 0;  // The soft limit on open files.
};

// Parses the text of /proc/<pid>/stat. `ticks_per_second` and `page_bytes` come from sysconf;
// `boot_time_seconds` is /proc/stat's btime. InvalidArgument for text that is not a stat line.
absl::StatusOr<ProcessSample> ParseProcStat(std::string_view stat, double ticks_per_second,
                                            double page_bytes, double boot_time_seconds);

// This process's sample now. Unavailable when /proc cannot be read.
absl::StatusOr<ProcessSample> ReadProcessSample();

// A collectable that exports ReadProcessSample() (nothing when /proc is unreadable).
std::shared_ptr<prometheus::Collectable> MakeProcessCollectable();

}  // namespace attnserve::server::metrics

#endif  // ATTNSERVE_SERVER_METRICS_PROCESS_METRICS_H_
