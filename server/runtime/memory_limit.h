// The memory this process may use, for defaults sized from the machine (the KV-cache budget of
// decoding sessions): the container's cgroup memory limit when one is set, else physical RAM.
// The memory counterpart of AvailableCores() (compute_budget.h).
//
// Thread-safe (reads files and sysconf; no state).
#ifndef ATTNSERVE_SERVER_RUNTIME_MEMORY_LIMIT_H_
#define ATTNSERVE_SERVER_RUNTIME_MEMORY_LIMIT_H_

#include <cstdint>
#include <string>

namespace attnserve::server {

struct MemoryLimit {
  int64_t bytes = 0;
  // Where `bytes` came from: "cgroup v2 memory.max", "cgroup v1 memory.limit_in_bytes" or
  // "physical RAM".
  std::string source;
};

// Physical RAM in bytes (sysconf: pages × page size); 0 if the system does not say.
int64_t PhysicalMemoryBytes();

// The smaller of the cgroup memory limit under `cgroup_root` and `physical_bytes`: cgroup v2's
// <root>/memory.max, else cgroup v1's <root>/memory/memory.limit_in_bytes. A limit that is unset
// ("max" in v2; v1's near-2^63 "unlimited"), unreadable, or not below physical RAM does not count,
// and the answer is physical RAM. The root is the cgroup filesystem as this process sees it: in
// a container with its own cgroup namespace (Docker, Podman, Kubernetes) that is its own cgroup.
// Never fails; `bytes` is 0 only when physical_bytes is 0 and no limit is set.
MemoryLimit AvailableMemory(const std::string& cgroup_root, int64_t physical_bytes);
// The same for this process: /sys/fs/cgroup and PhysicalMemoryBytes().
MemoryLimit AvailableMemory();

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RUNTIME_MEMORY_LIMIT_H_
