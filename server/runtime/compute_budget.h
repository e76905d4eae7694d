// ComputeBudget: the compute threads of the whole server, shared by every batch of every model.
//
// A forward pass asks for a team of threads and gets what is free, at least one (waiting if none
// is). How wide a team is depends on load:
//   - idle (no other batch computed lately): a large batch gets every thread it asks for, which
//     is what a lone request's latency needs;
//   - busy (another batch was computing when one asked, within the last `narrow_window`): every
//     batch runs on one thread, batches in parallel. One-thread teams need no barriers, so a core
//     briefly taken by gRPC work slows only its own batch instead of stalling a whole team
//     (docs/PERFORMANCE.md, "Team width", has what that is worth under saturation).
//
// Thread-safe.
#ifndef ATTNSERVE_SERVER_RUNTIME_COMPUTE_BUDGET_H_
#define ATTNSERVE_SERVER_RUNTIME_COMPUTE_BUDGET_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace attnserve::server {

// The cores this process may use: the smallest of the CPU affinity mask, a cgroup v2 CPU quota
// (containers: `docker run --cpus`, Kubernetes limits) and std::thread::hardware_concurrency;
// OMP_NUM_THREADS, when set, instead. At least 1.
int AvailableCores();

class ComputeBudget {
 public:
  // `threads` >= 1 compute threads to share. After contention (a batch asking while another
  // computes), teams are one thread wide for `narrow_window`.
  explicit ComputeBudget(int threads,
                         std::chrono::milliseconds narrow_window = std::chrono::milliseconds(50));
  ComputeBudget(const ComputeBudget&) = delete;
  ComputeBudget& operator=(const ComputeBudget&) = delete;

  // Blocks until a thread is free, then takes min(wanted, free) threads (wanted is clamped to
  // 1..threads(); 1 while busy, see above) and returns how many; give them back with Release.
  int Acquire(int wanted);
  void Release(int granted);

  int threads() const { return threads_; }
  int free_threads() const;

 private:
  const int threads_;
  const std::chrono::milliseconds narrow_window_;
  mutable std::mutex mu_;
  std::condition_variable freed_;
  int free_;
  std::chrono::steady_clock::time_point narrow_until_;
};

// Holds threads of a ComputeBudget for a scope.
class ComputeGrant {
 public:
  ComputeGrant(ComputeBudget& budget, int wanted)
      : budget_(budget), granted_(budget.Acquire(wanted)) {}
  ~ComputeGrant() { budget_.Release(granted_); }
  ComputeGrant(const ComputeGrant&) = delete;
  ComputeGrant& operator=(const ComputeGrant&) = delete;

  int threads() const { return granted_; }

 private:
  ComputeBudget& budget_;
  const int granted_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RUNTIME_COMPUTE_BUDGET_H_
