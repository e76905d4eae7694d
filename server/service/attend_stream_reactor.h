// AttendStreamReactor: one AttendStream call. Each message read is scheduled like a unary Attend;
// answers are written as they come back, so they may be out of order (request_id tells them
// apart). A message that fails validation or scheduling, or that protobuf cannot parse (messages
// travel as raw bytes, parsed here), is answered with AttendResponse.error and the stream goes on.
//
// Flow control: one read and one write are outstanding at a time, and the reactor stops reading
// while kMaxInFlightPerStream messages are in flight (read but their answer not yet written:
// being computed or waiting to be written), or while their answers' bytes reach
// max_unsent_bytes (an answer still computing counts its payload size, known from the request;
// a computed one its serialised size), or, with a message in flight, while all streams together
// are over the registry's budget. Reading resumes as answers are written, so a client that does
// not read its answers is slowed instead of growing the server's memory: a stream holds at most
// max_unsent_bytes plus one answer, and all streams at most the server-wide budget plus one
// answer each.
//
// The stream finishes (OK) once the client has half-closed (or the server drains) and every
// accepted message has been answered and written. Thread-safety: reactions and task callbacks run
// on different threads; all state is under mu_, and gRPC calls are made after releasing it, with
// no member touched after Finish (OnDone deletes the reactor).
#ifndef ATTNSERVE_SERVER_SERVICE_ATTEND_STREAM_REACTOR_H_
#define ATTNSERVE_SERVER_SERVICE_ATTEND_STREAM_REACTOR_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "server/service/attend_submitter.h"
#include "server/service/stream_registry.h"

namespace attnserve::server {

class AttendStreamReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public DrainableStream {
 public:
  static constexpr int kMaxInFlightPerStream = 256;

  // Registers with `streams` and starts reading. `submitter` and `streams` must outlive the
  // reactor (the gRPC server is shut down first). max_unsent_bytes >= 1.
  AttendStreamReactor(AttendSubmitter* submitter, StreamRegistry* streams,
                      grpc::CallbackServerContext* context, int64_t max_unsent_bytes);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;

  // DrainableStream.
  bool PrepareDrain() override;
  void FinishDrained() override;

 private:
  // What to do after releasing mu_.
  struct Actions {
    bool read = false;
    const grpc::ByteBuffer* write = nullptr;
    bool finish = false;
  };

  // Called on a batcher thread with the answer to one message, which reserved `reserved_bytes`.
  void OnAnswer(const v1::AttendResponse& response, int64_t reserved_bytes);
  // Queues `answer` for writing in place of the `reserved_bytes` its message held; decides the
  // next actions.
  void EnqueueLocked(grpc::ByteBuffer answer, int64_t reserved_bytes, Actions* actions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DecideLocked(Actions* actions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Changes unsent_bytes_, and the server-wide total, by `delta`.
  void AddUnsentLocked(int64_t delta) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Perform(const Actions& actions);

  AttendSubmitter* const submitter_;
  StreamRegistry* const streams_;
  grpc::CallbackServerContext* const context_;
  const int64_t max_unsent_bytes_;
  grpc::ByteBuffer request_;  // The read buffer; only touched between StartRead and OnReadDone.

  std::mutex mu_;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // Messages read whose answer is not yet written or dropped (computing, or in pending_).
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<grpc::ByteBuffer> pending_ ABSL_GUARDED_BY(mu_);  // Serialised answers to write.
  // Payload sizes of the in-flight messages still computing, plus the sizes of pending_. May dip
  // below the true sum while an answer overtakes its own reservation (made after Submit returns),
  // never at a decision to read: reading_ is still set then.
  int64_t unsent_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVICE_ATTEND_STREAM_REACTOR_H_
