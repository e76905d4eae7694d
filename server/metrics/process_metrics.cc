#include "server/metrics/process_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "prometheus/metric_family.h"

namespace attnserve::server::metrics {
namespace {

// Fields of /proc/<pid>/stat counted from the one after the command's closing parenthesis
// (field 3, the state), per proc(5).
constexpr size_t kUtime = 14 - 3, kStime = 15 - 3, kStartTime = 22 - 3, kVsize = 23 - 3,
                 kRss = 24 - 3;

absl::StatusOr<std::string> ReadText(const char* path) {
  std::ifstream in(path);
  if (!in) return absl::UnavailableError(absl::StrCat("cannot read ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// /proc/stat's "btime" line: when the machine booted, in seconds since the epoch.
absl::StatusOr<double> BootTimeSeconds() {
  absl::StatusOr<std::string> text = ReadText("/proc/stat");
  if (!text.ok()) return text.status();
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (!absl::ConsumePrefix(&line, "btime ")) continue;
    double seconds = 0;
    if (absl::SimpleAtod(line, &seconds)) return seconds;
  }
  return absl::UnavailableError("/proc/stat has no btime line");
}

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type,
                                double value) {
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  return {.name = name, .help = help, .type = type, .metric = {metric}};
}

class ProcessCollectable final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    absl::StatusOr<ProcessSample> sample = ReadProcessSample();
    if (!sample.ok()) return {};
    using prometheus::MetricType;
    return {
        Family("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
               MetricType::Counter, sample->cpu_seconds),
        Family("process_resident_memory_bytes", "Resident memory size in bytes.", MetricType::Gauge,
               sample->resident_memory_bytes),
        Family("process_virtual_memory_bytes", "Virtual memory size in bytes.", MetricType::Gauge,
               sample->virtual_memory_bytes),
        Family("process_start_time_seconds",
               "Start time of the process since unix epoch in seconds.", MetricType::Gauge,
               sample->start_time_seconds),
        Family("process_open_fds", "Number of open file descriptors.", MetricType::Gauge,
               sample->open_fds),
        Family("process_max_fds", "Maximum number of open file descriptors.", MetricType::Gauge,
               sample->max_fds),
    };
  }
};

}  // namespace

absl::StatusOr<ProcessSample> ParseProcStat(std::string_view stat, double ticks_per_second,
                                            double page_bytes, double boot_time_seconds) {
  // The command name may hold spaces and parentheses: the fields start after the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string_view::npos) {
    return absl::InvalidArgumentError("stat: no ')' after the command name");
  }
  // absl::string_view: Debian's abseil does not alias it to std::string_view.
  const absl::string_view rest(stat.data() + close + 1, stat.size() - close - 1);
  const std::vector<absl::string_view> fields = absl::StrSplit(rest, ' ', absl::SkipEmpty());
  if (fields.size() <= kRss) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stat: expected at least ", kRss + 1, " fields after the command, got ", fields.size()));
  }
  double utime, stime, start, vsize, rss;
  if (!absl::SimpleAtod(fields[kUtime], &utime) || !absl::SimpleAtod(fields[kStime], &stime) ||
      !absl::SimpleAtod(fields[kStartTime], &start) || !absl::SimpleAtod(fields[kVsize], &vsize) ||
      !absl::SimpleAtod(fields[kRss], &rss)) {
    return absl::InvalidArgumentError("stat: a time or memory field is not a number");
  }
  return ProcessSample{.cpu_seconds = (utime + stime) / ticks_per_second,
                       .resident_memory_bytes = rss * page_bytes,
                       .virtual_memory_bytes = vsize,
                       .start_time_seconds = boot_time_seconds + start / ticks_per_second};
}

absl::StatusOr<ProcessSample> ReadProcessSample() {
  absl::StatusOr<std::string> stat = ReadText("/proc/self/stat");
  if (!stat.ok()) return stat.status();
  absl::StatusOr<double> boot = BootTimeSeconds();
  if (!boot.ok()) return boot.status();
  absl::StatusOr<ProcessSample> sample =
      ParseProcStat(*stat, static_cast<double>(sysconf(_SC_CLK_TCK)),
                    static_cast<double>(sysconf(_SC_PAGESIZE)), *boot);
  if (!sample.ok()) return sample.status();
  std::error_code error;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    ++sample->open_fds;
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) sample->max_fds = static_cast<double>(limit.rlim_cur);
  return sample;
}

std::shared_ptr<prometheus::Collectable> MakeProcessCollectable() {
  return std::make_shared<ProcessCollectable>();
}

}  // namespace attnserve::server::metrics
