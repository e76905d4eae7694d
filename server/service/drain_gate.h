// DrainGate: the switch that turns new calls away once the server drains, holding those refusals
// until the server has told its clients to go elsewhere (gRPC's GOAWAY), and only then answering
// them UNAVAILABLE.
//
// Why hold them: a client answered at once sends its next call at once. Under load the server
// then never goes quiet, and the calls that reach it after gRPC's Shutdown has begun (sent before
// the client read the GOAWAY) are cancelled by gRPC itself: the client sees CANCELLED, which no
// retry policy retries, for a call another replica would have served. Held, each closed-loop
// client waits with its call outstanding while the server answers what it accepted and sends
// GOAWAY; its retry after the UNAVAILABLE then opens a new connection (to another replica).
//
// Thread-safe. Every held refusal is counted in `open_calls` (OpenCalls::MarkHeld), so a drain
// can wait for the accepted calls alone (OpenCalls::WaitUntilOnlyHeld).
#ifndef ATTNSERVE_SERVER_SERVICE_DRAIN_GATE_H_
#define ATTNSERVE_SERVER_SERVICE_DRAIN_GATE_H_

#include <atomic>
#include <functional>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "server/service/open_calls.h"

namespace attnserve::server {

// The answer to a call refused because the server drains.
absl::Status DrainingError();

class DrainGate {
 public:
  // Answers a refused call with the status it is given (DrainingError()). Runs exactly once, on
  // the thread that calls Release (or HoldIfDraining, once released). A std::function, not an
  // absl::AnyInvocable: instantiating AnyInvocable's inline manager in our binaries would
  // interpose it on libgrpc's own (its thread pool queues AnyInvocables), and ThreadSanitizer,
  // seeing that copy instrumented but not libgrpc's locking, would report races inside gRPC.
  using Refusal = std::function<void(const absl::Status& status)>;

  // `open_calls` must outlive the gate.
  explicit DrainGate(OpenCalls* open_calls) : open_calls_(open_calls) {}
  DrainGate(const DrainGate&) = delete;
  DrainGate& operator=(const DrainGate&) = delete;
  // Runs the refusals still held: every refused call is answered.
  ~DrainGate() { Release(); }

  // From now on draining() is true and HoldIfDraining takes refusals.
  void Close() { draining_.store(true, std::memory_order_release); }
  bool draining() const { return draining_.load(std::memory_order_acquire); }

  // Serving: false, and `refusal` is left alone (the caller goes on with the call). Draining:
  // true; `refusal` is held until Release, or run now when Release has been called.
  bool HoldIfDraining(Refusal& refusal);

  // Runs every held refusal and, from now on, each new one at once.
  void Release();

 private:
  OpenCalls* const open_calls_;
  std::atomic<bool> draining_{false};
  std::mutex mu_;
  bool released_ = false;      // Guarded by mu_.
  std::vector<Refusal> held_;  // Guarded by mu_.
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVICE_DRAIN_GATE_H_
