// OpenCalls: how many RPCs the service has started and gRPC has not yet completed (OnDone), of
// them how many are refusals a drain holds (drain_gate.h), and a wait for the rest to end.
//
// The drain uses it to hold the connections open until every call is over and the client has had
// time to read its last answers: gRPC closes a connection as soon as its last call is done, and a
// close that races with bytes still arriving from the client is a TCP reset, which can reach the
// client before the answers and trailers already sent (seen as UNAVAILABLE "Connection reset by
// peer" on a call the server had finished with OK).
//
// Thread-safe. Add/Done cost one atomic operation each; Done takes the mutex only while a waiter
// may be waiting (during a drain).
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
    count_.fetch_sub(1);
    // Sequentially consistent: either this sees the waiter registered, or the waiter sees the
    // new count.
    if (waiters_.load() > 0) Notify();
  }
  int64_t count() const { return count_.load(); }

  // An open call is now a held refusal, not work (drain_gate.h); UnmarkHeld when it is answered.
  void MarkHeld() {
    held_.fetch_add(1);
    if (waiters_.load() > 0) Notify();
  }
  void UnmarkHeld() { held_.fetch_sub(1); }
  int64_t held() const { return held_.load(); }

  // Blocks until every open call is a held refusal (or none is open) or `deadline` passes; true
  // when so.
  bool WaitUntilOnlyHeld(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    waiters_.fetch_add(1);
    const bool only_held = cv_.wait_until(lock, deadline, [this] { return count() - held() <= 0; });
    waiters_.fetch_sub(1);
    return only_held;
  }

 private:
  void Notify() {
    // Under mu_: the waiter cannot miss this between checking the counts and sleeping.
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }

  std::atomic<int64_t> count_{0};
  std::atomic<int64_t> held_{0};
  std::atomic<int> waiters_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVICE_OPEN_CALLS_H_
