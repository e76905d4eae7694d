#include "server/service/attend_stream_reactor.h"

#include <utility>

#include "core/util/happens_before.h"
#include "server/conversion/attnserve_v1/conversion.h"
#include "server/service/wire_messages.h"

namespace attnserve::server {
namespace {

// The in-band status of one stream answer, as metrics count it.
grpc::StatusCode ErrorCodeOf(const v1::AttendResponse& response) {
  return response.has_error() ? static_cast<grpc::StatusCode>(response.error().code())
                              : grpc::StatusCode::OK;
}

// `response` as bytes to write; an in-band Internal error in its place if it cannot be
// serialised (over protobuf's 2 GiB), so the message still gets an answer.
grpc::ByteBuffer Serialized(const v1::AttendResponse& response) {
  grpc::ByteBuffer bytes;
  absl::Status status = SerializeWireMessage(response, &bytes);
  if (!status.ok()) {
    v1::AttendResponse error;
    FillErrorResponse(response.model(), response.request_id(), status, &error);
    status = SerializeWireMessage(error, &bytes);
  }
  return bytes;
}

}  // namespace

AttendStreamReactor::AttendStreamReactor(AttendSubmitter* submitter, StreamRegistry* streams,
                                         grpc::CallbackServerContext* context,
                                         int64_t max_unsent_bytes)
    : submitter_(submitter),
      streams_(streams),
      context_(context),
      max_unsent_bytes_(max_unsent_bytes) {
  streams_->Register(this);
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (submitter_->draining()) reads_done_ = true;
    DecideLocked(&actions);
  }
  Perform(actions);
}

void AttendStreamReactor::OnReadDone(bool ok) {
  TakeOver(&request_);
  Actions actions;
  if (!ok) {  // The client half-closed, or the call is over.
    std::lock_guard<std::mutex> lock(mu_);
    reading_ = false;
    reads_done_ = true;
    DecideLocked(&actions);
  } else {
    {
      // Count the message before scheduling it: its answer may arrive before Submit returns.
      std::lock_guard<std::mutex> lock(mu_);
      ++in_flight_;
    }
    // A local, freed when this reaction ends: the task holds its own copy of the inputs.
    v1::AttendRequest message;
    const absl::Status parsed = ParseWireMessage(request_, "message", &message);
    request_.Clear();  // Parsed: the bytes need not wait for the next read to be freed.
    // An unparseable message names no model: it counts under the unknown model's series.
    RequestMeter meter = submitter_->StartMeter(
        metrics::Method::kAttendStream, parsed.ok() ? message.model() : metrics::kUnknownModel);
    int64_t reserved = 0;
    absl::Status scheduled =
        !parsed.ok()
            ? parsed
            : submitter_->Submit(
                  message, context_,
                  [this, meter](const AttendWork& work,
                                absl::StatusOr<AttendResult> result) mutable {
                    v1::AttendResponse response;
                    absl::Status filled = result.ok() ? FillAttendResponse(work, *result, &response)
                                                      : result.status();
                    if (!filled.ok()) {
                      LogFailure(work.model->name, work.request_id, filled);
                      FillErrorResponse(work.model->name, work.request_id, filled, &response);
                    }
                    meter.Record(ErrorCodeOf(response));
                    OnAnswer(response, work.response_bytes());
                  },
                  &reserved);
    grpc::ByteBuffer refusal;
    if (!scheduled.ok()) {
      // Still counted in in_flight_ until its error answer is written.
      v1::AttendResponse response;
      FillErrorResponse(parsed.ok() ? message.model() : "", parsed.ok() ? message.request_id() : "",
                        scheduled, &response);
      meter.Record(ErrorCodeOf(response));
      refusal = Serialized(response);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (scheduled.ok()) {
      AddUnsentLocked(reserved);
    } else {
      EnqueueLocked(std::move(refusal), /*reserved_bytes=*/0, &actions);
    }
    reading_ = false;
    DecideLocked(&actions);
  }
  Perform(actions);
}

void AttendStreamReactor::OnAnswer(const v1::AttendResponse& response, int64_t reserved_bytes) {
  grpc::ByteBuffer answer = Serialized(response);  // Outside the lock.
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    EnqueueLocked(std::move(answer), reserved_bytes, &actions);
    DecideLocked(&actions);
  }
  Perform(actions);
}

void AttendStreamReactor::OnWriteDone(bool ok) {
  TakeOver(&pending_);
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    AddUnsentLocked(-static_cast<int64_t>(pending_.front().Length()));
    pending_.pop_front();
    --in_flight_;  // That message is done: its answer is written (or the client is gone).
    if (!ok) {
      // The client is gone: answers still to come are dropped, the stream ends when they are in.
      write_failed_ = true;
      in_flight_ -= static_cast<int>(pending_.size());
      for (const grpc::ByteBuffer& answer : pending_) {
        AddUnsentLocked(-static_cast<int64_t>(answer.Length()));
      }
      pending_.clear();
    }
    DecideLocked(&actions);
  }
  Perform(actions);
}

void AttendStreamReactor::OnDone() {
  TakeOver(this);  // Every reaction and Finish came first (each handed off `this`).
  streams_->Unregister(this);
  delete this;
}

bool AttendStreamReactor::PrepareDrain() {
  Actions actions;
  std::lock_guard<std::mutex> lock(mu_);
  reads_done_ = true;
  DecideLocked(&actions);
  // With reads done, the only thing left to decide is finishing: a pending answer is already
  // being written by whoever queued it.
  return actions.finish;
}

void AttendStreamReactor::FinishDrained() {
  HandOff(this);
  Finish(grpc::Status::OK);
}

void AttendStreamReactor::EnqueueLocked(grpc::ByteBuffer answer, int64_t reserved_bytes,
                                        Actions* actions) {
  AddUnsentLocked(-reserved_bytes);
  if (write_failed_ || finished_) {
    --in_flight_;  // Dropped: nobody will read it.
    return;
  }
  AddUnsentLocked(static_cast<int64_t>(answer.Length()));
  pending_.push_back(std::move(answer));
  DecideLocked(actions);
}

void AttendStreamReactor::DecideLocked(Actions* actions) {
  if (finished_) return;
  if (!reading_ && !reads_done_ && !write_failed_ && in_flight_ < kMaxInFlightPerStream &&
      unsent_bytes_ < max_unsent_bytes_ && (in_flight_ == 0 || !streams_->OverBudget())) {
    reading_ = true;
    actions->read = true;
  }
  if (!writing_ && !pending_.empty()) {
    writing_ = true;
    actions->write = &pending_.front();
  }
  // After a failed write no read is started (above), so once the outstanding read is done no
  // message can come: a client that left while reading was paused must not leave the stream open.
  const bool no_more_reads = reads_done_ || (write_failed_ && !reading_);
  if (no_more_reads && in_flight_ == 0 && pending_.empty() && !writing_) {
    finished_ = true;
    actions->finish = true;
  }
}

void AttendStreamReactor::AddUnsentLocked(int64_t delta) {
  unsent_bytes_ += delta;
  streams_->AddUnsentBytes(delta);
}

void AttendStreamReactor::Perform(const Actions& actions) {
  // No member may be touched after Finish: OnDone may delete the reactor at once. Each gRPC
  // call hands off to its reaction, and everything up to here to OnDone
  // (core/util/happens_before.h).
  HandOff(this);
  if (actions.write != nullptr) {
    HandOff(&pending_);
    StartWrite(actions.write);
  }
  if (actions.read) {
    HandOff(&request_);
    StartRead(&request_);
  }
  if (actions.finish) Finish(grpc::Status::OK);
}

}  // namespace attnserve::server
