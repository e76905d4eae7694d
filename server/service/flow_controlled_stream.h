// FlowControlledStream: the flow control that AttendStream and Decode share. A bidi reactor over
// raw bytes that reads messages ahead while their answers are computed elsewhere, writes each
// answer as it is ready (so possibly out of order), and finishes once every message it accepted is
// answered. A subclass says what a message is (OnMessage) and hands back exactly one answer per
// message (Answer); when to read, to write and to finish is decided here only.
//
// Flow control: one read and one write are outstanding at a time. The stream stops reading while
// max_in_flight_messages are in flight (read, their answer not yet written or dropped), or while
// their bytes reach max_unsent_bytes (a message still computing counts what it reserved with
// Reserve, an answer its serialised size), or, with a message in flight, while all streams
// together are over the registry's budget (stream_registry.h). Reading resumes as answers are
// written, so a client that does not read its answers is slowed instead of growing the server's
// memory: a stream holds at most max_unsent_bytes plus one answer, all streams at most the
// registry's budget plus one answer each.
//
// Life: Begin, the last thing a subclass's constructor does, registers the stream and starts
// reading. The stream finishes exactly once, with OK once the client has half-closed and every
// message read is answered and written; after a failed write (the client is gone: later answers
// are dropped) once the outstanding read and every answer are in; on a drain (DrainAll, or Begin
// while the server drains) once what was accepted is answered, with `drained_status`. OnDone
// calls OnStreamDone, unregisters and deletes the reactor.
//
// Thread-safety: reactions run on gRPC threads, Answer and Reserve on any thread. The flow state is
// under mu_, which is never held while calling gRPC or a subclass hook; no member is touched after
// Finish (OnDone may delete the reactor at once).
#ifndef ATTNSERVE_SERVER_SERVICE_FLOW_CONTROLLED_STREAM_H_
#define ATTNSERVE_SERVER_SERVICE_FLOW_CONTROLLED_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "server/service/stream_registry.h"

namespace attnserve::server {

struct StreamFlowOptions {
  // Messages read whose answer is not yet written (or dropped) at which reading pauses (>= 1).
  int max_in_flight_messages = 64;
  // The stream's budget of unsent answer bytes at which reading pauses (>= 1).
  int64_t max_unsent_bytes = int64_t{64} << 20;
  // How the stream finishes when a drain ends it (OK: as if the client had half-closed).
  grpc::Status drained_status = grpc::Status::OK;
};

class FlowControlledStream : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                             public DrainableStream {
 public:
  void OnReadDone(bool ok) final;
  void OnWriteDone(bool ok) final;
  void OnDone() final;

  // DrainableStream.
  bool PrepareDrain() final;
  void FinishDrained() final;

 protected:
  // `streams` must outlive the reactor (the gRPC server is shut down first).
  FlowControlledStream(StreamRegistry* streams, StreamFlowOptions options);
  ~FlowControlledStream() override = default;

  // The last thing the subclass's constructor does (reactions may run once it is called):
  // registers with the registry, then asks `draining` — after registering, so that a drain that
  // begins meanwhile either finds this stream or is seen here — and starts reading, or, when
  // draining, finishes with drained_status at once.
  void Begin(const std::function<bool()>& draining);

  // One message read, already counted in flight. Must lead to exactly one Answer call, from any
  // thread, possibly before returning. `bytes` may be cleared once parsed (freeing them early);
  // it is only valid during the call.
  virtual void OnMessage(grpc::ByteBuffer* bytes) = 0;
  // A write failed: the client reads no more answers (those still to come will be dropped).
  // Called once, on a gRPC thread, before the stream can finish. Default: nothing.
  virtual void OnClientGone() {}
  // The call is over (gRPC's OnDone), just before the stream unregisters and is deleted.
  // Default: nothing.
  virtual void OnStreamDone() {}
  // A read completed with a message (`ok`) or without, before the stream decides whether to
  // accept it: the point where a test injects a drain racing the read. Default: nothing.
  virtual void OnReadCompleted(bool /*ok*/) {}

  // Holds `bytes` of the stream's unsent-byte budget for a message until its Answer returns
  // them. May be called before or after the message's answer arrives (the count may dip below
  // the true sum meanwhile, never at a decision to read: that waits for OnMessage to return).
  void Reserve(int64_t bytes);
  // Queues the answer to one message for writing, in place of the `reserved_bytes` its message
  // held; drops it when the client is gone. Thread-safe; call without holding any lock the
  // subclass's hooks take.
  void Answer(grpc::ByteBuffer answer, int64_t reserved_bytes);

 private:
  // What to do after releasing mu_.
  struct Actions {
    bool read = false;
    const grpc::ByteBuffer* write = nullptr;
    bool finish = false;
    bool drained = false;  // Finish with drained_status instead of OK.
  };

  void DecideLocked(Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Changes unsent_bytes_, and the server-wide total, by `delta`.
  void AddUnsentLocked(int64_t delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts what `actions` says; touches no member after Finish.
  void Perform(const Actions& actions);

  StreamRegistry* const streams_;
  const StreamFlowOptions options_;
  grpc::ByteBuffer request_;  // The read buffer; only touched between StartRead and OnReadDone.

  std::mutex mu_;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool drained_ ABSL_GUARDED_BY(mu_) = false;  // A drain ends the stream: drained_status.
  // Messages read whose answer is not yet written or dropped (computing, or in pending_).
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<grpc::ByteBuffer> pending_ ABSL_GUARDED_BY(mu_);  // Serialised answers to write.
  // What the messages still computing reserved, plus the sizes of pending_.
  int64_t unsent_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVICE_FLOW_CONTROLLED_STREAM_H_
