// L3CacheBytes: the size of this machine's L3 cache, for code that sizes its working set or picks
// a prefetch strategy by it (the paged decode kernel prefetches into L2 once a forward's K/V
// exceed it).
//
// Thread-safe; reads sysfs on every call, so callers keep the value.
#ifndef ATTNSERVE_CORE_UTIL_L3_CACHE_BYTES_H_
#define ATTNSERVE_CORE_UTIL_L3_CACHE_BYTES_H_

#include <cstdint>
#include <fstream>
#include <string>

namespace attnserve::core {

// The L3's size as the kernel reports it in sysfs (cpu0's caches), or 32 MiB if it cannot be
// read. Not glibc's sysconf(_SC_LEVEL3_CACHE_SIZE): it decodes cpuid, which a VM may fill in
// freely (320 MiB on the 2-core development VM, whose L3 is 32 MiB).
inline int64_t L3CacheBytes() {
  for (int index = 0; index < 16; ++index) {
    const std::string dir =
        "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level");
    int level = 0;
    if (!(level_file >> level)) break;
    if (level != 3) continue;
    std::ifstream size_file(dir + "size");
    int64_t size = 0;
    char unit = ' ';
    if (!(size_file >> size >> unit) || size <= 0) break;
    if (unit == 'K') return size << 10;
    if (unit == 'M') return size << 20;
    break;
  }
  return int64_t{32} << 20;
}

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_UTIL_L3_CACHE_BYTES_H_
