#include "server/runtime/memory_limit.h"

#include <unistd.h>

#include <fstream>

#include "absl/strings/numbers.h"

namespace attnserve::server {
namespace {

// The first word of `path` as a positive byte count; 0 when the file is missing, says "max",
// or holds anything else.
int64_t ReadLimitBytes(const std::string& path) {
  std::ifstream file(path);
  std::string word;
  int64_t bytes = 0;
  if (!(file >> word) || !absl::SimpleAtoi(word, &bytes) || bytes <= 0) return 0;
  return bytes;
}

}  // namespace

int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<int64_t>(pages) * page_size;
}

MemoryLimit AvailableMemory(const std::string& cgroup_root, int64_t physical_bytes) {
  const struct {
    const char* file;
    const char* source;
  } kLimits[] = {{"/memory.max", "cgroup v2 memory.max"},
                 {"/memory/memory.limit_in_bytes", "cgroup v1 memory.limit_in_bytes"}};
  for (const auto& limit : kLimits) {
    const int64_t bytes = ReadLimitBytes(cgroup_root + limit.file);
    if (bytes == 0) continue;
    // v1 writes "unlimited" as a number near 2^63; any limit at or above RAM binds nothing.
    if (physical_bytes > 0 && bytes >= physical_bytes) break;
    return {.bytes = bytes, .source = limit.source};
  }
  return {.bytes = physical_bytes, .source = "physical RAM"};
}

MemoryLimit AvailableMemory() { return AvailableMemory("/sys/fs/cgroup", PhysicalMemoryBytes()); }

}  // namespace attnserve::server
