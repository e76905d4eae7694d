// OpenCalls: how many RPCs the service has started and gRPC has not yet completed (OnDone), and a
// wait for that count to reach zero.
//
// The drain uses it to hold the connections open until every call is over and the client has had
// time to read its last answers: gRPC closes a connection as soon as its last call is done, and a
// close that races with bytes still arriving from the client is a TCP reset, which can reach the
// client before the answers and trailers already sent (seen as UNAVAILABLE "Connection reset by
// peer" on a call the server had finished with OK).
//
// Thread-safe. Add/Done cost one atomic operation each; Done takes the mutex only while a waiter
// may be waiting.
#ifndef ATTNSERVE_SERVER_SERVICE_OPEN_CALLS_H_
#define ATTNSERVE_SERVER_SERVICE_OPEN_CALLS_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace attnserve::server {

class OpenCalls {
 public:
  OpenCalls() = default;
  OpenCalls(const OpenCalls&) = delete;
  OpenCalls& operator=(const OpenCalls&) = delete;

  void Add() { count_.fetch_add(1); }
  // Call once per Add, when the call is completely over.
  void Done() {
    // Sequentially consistent: either this sees the waiter registered, or the waiter sees zero.
    if (count_.fetch_sub(1) == 1 && waiters_.load() > 0) {
      // Under mu_: the waiter cannot miss this between checking the count and sleeping.
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    }
  }
  int64_t count() const { return count_.load(); }

  // Blocks until no call is open or `deadline` passes; true when none is open.
  bool WaitUntilNone(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    waiters_.fetch_add(1);
    const bool none = cv_.wait_until(lock, deadline, [this] { return count() == 0; });
    waiters_.fetch_sub(1);
    return none;
  }

 private:
  std::atomic<int64_t> count_{0};
  std::atomic<int> waiters_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVICE_OPEN_CALLS_H_
