// StreamRegistry: the streaming calls that are open, so that a drain can close each of them.
//
// Every open stream registers for its whole life and is counted in OpenCalls meanwhile; DrainAll
// asks each to stop reading and finishes those that have nothing left to answer (the others
// finish themselves once their last answer is written). The registry also keeps the server-wide
// total of the streams' unsent answer bytes (flow_controlled_stream.h), which streams check before
// reading.
//
// Thread-safe. `open_calls` must outlive the registry.
#ifndef ATTNSERVE_SERVER_SERVICE_STREAM_REGISTRY_H_
#define ATTNSERVE_SERVER_SERVICE_STREAM_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "server/service/open_calls.h"

namespace attnserve::server {

// A stream a drain can close.
class DrainableStream {
 public:
  virtual ~DrainableStream() = default;
  // Stops reading: the stream finishes once what it accepted is answered. Returns true when that
  // is already the case: the caller must then call FinishDrained() (after releasing any lock that
  // unregistering takes); nobody else will finish the stream.
  virtual bool PrepareDrain() = 0;
  virtual void FinishDrained() = 0;
};

class StreamRegistry {
 public:
  // `max_unsent_bytes` (>= 1): the server-wide budget of unsent answer bytes (see OverBudget).
  StreamRegistry(OpenCalls* open_calls, int64_t max_unsent_bytes)
      : open_calls_(open_calls), max_unsent_bytes_(max_unsent_bytes) {}
  StreamRegistry(const StreamRegistry&) = delete;
  StreamRegistry& operator=(const StreamRegistry&) = delete;

  // From a stream's start to its end (gRPC's OnDone), once each.
  void Register(DrainableStream* stream) {
    open_calls_->Add();
    std::lock_guard<std::mutex> lock(mu_);
    streams_.insert(stream);
  }
  void Unregister(DrainableStream* stream) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      streams_.erase(stream);
    }
    open_calls_->Done();
  }

  // Streams registered and not yet unregistered.
  int Count() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(streams_.size());
  }

  // Streams report every change of their unsent answer bytes (reserved or serialised).
  void AddUnsentBytes(int64_t delta) { unsent_bytes_.fetch_add(delta, std::memory_order_relaxed); }
  int64_t UnsentBytes() const { return unsent_bytes_.load(std::memory_order_relaxed); }
  // Whether the streams together hold the budget or more. A stream with a message in flight
  // then does not read (its own answer being written will make it decide again); one with none
  // still reads one, so no stream waits on another's client.
  bool OverBudget() const { return UnsentBytes() >= max_unsent_bytes_; }

  // Has every registered stream stop reading, and finishes those already done.
  void DrainAll() {
    std::vector<DrainableStream*> to_finish;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (DrainableStream* stream : streams_) {
        if (stream->PrepareDrain()) to_finish.push_back(stream);
      }
    }
    // Outside mu_: finishing may run OnDone, which unregisters.
    for (DrainableStream* stream : to_finish) stream->FinishDrained();
  }

 private:
  OpenCalls* const open_calls_;
  const int64_t max_unsent_bytes_;
  std::atomic<int64_t> unsent_bytes_{0};
  std::mutex mu_;
  absl::flat_hash_set<DrainableStream*> streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVICE_STREAM_REGISTRY_H_
