#include "server/runtime/compute_budget.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace attnserve::server {
namespace {

// The cgroup v2 CPU quota in cores, rounded up (e.g. "150000 100000" → 2); 0 when unlimited or
// not under cgroup v2.
int CgroupCores() {
  std::ifstream file("/sys/fs/cgroup/cpu.max");
  std::string quota;
  long long period = 0;
  if (!(file >> quota >> period) || quota == "max" || period <= 0) return 0;
  const long long quota_us = std::atoll(quota.c_str());
  if (quota_us <= 0) return 0;
  return static_cast<int>((quota_us + period - 1) / period);
}

}  // namespace

int AvailableCores() {
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env != nullptr && std::atoi(env) > 0) {
    return std::atoi(env);
  }
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = std::min(cores, CPU_COUNT(&set));
  if (const int quota = CgroupCores(); quota > 0) cores = std::min(cores, quota);
  return std::max(1, cores);
}

ComputeBudget::ComputeBudget(int threads, std::chrono::milliseconds narrow_window)
    : threads_(std::max(1, threads)), narrow_window_(narrow_window), free_(threads_) {}

int ComputeBudget::Acquire(int wanted) {
  wanted = std::clamp(wanted, 1, threads_);
  std::unique_lock<std::mutex> lock(mu_);
  if (free_ < threads_) {
    narrow_until_ = std::chrono::steady_clock::now() + narrow_window_;  // Another batch runs.
  }
  freed_.wait(lock, [this] { return free_ > 0; });
  if (std::chrono::steady_clock::now() < narrow_until_) wanted = 1;
  const int granted = std::min(wanted, free_);
  free_ -= granted;
  return granted;
}

void ComputeBudget::Release(int granted) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_ += granted;
  }
  freed_.notify_all();
}

int ComputeBudget::free_threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_;
}

}  // namespace attnserve::server
