#include "server/service/attend_stream_reactor.h"

#include <utility>

#include "core/util/happens_before.h"
#include "server/conversion/attnserve_v1/conversion.h"

namespace attnserve::server {
namespace {

// The in-band status of one stream answer, as metrics count it.
grpc::StatusCode ErrorCodeOf(const v1::AttendResponse& response) {
  return response.has_error() ? static_cast<grpc::StatusCode>(response.error().code())
                              : grpc::StatusCode::OK;
}

}  // namespace

AttendStreamReactor::AttendStreamReactor(AttendSubmitter* submitter, StreamRegistry* streams,
                                         grpc::CallbackServerContext* context)
    : submitter_(submitter), streams_(streams), context_(context) {
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
    RequestMeter meter = submitter_->StartMeter(metrics::Method::kAttendStream, request_.model());
    absl::Status scheduled = submitter_->Submit(
        request_, context_,
        [this, meter](const AttendWork& work, absl::StatusOr<AttendResult> result) mutable {
          auto response = std::make_unique<v1::AttendResponse>();
          absl::Status filled =
              result.ok() ? FillAttendResponse(work, *result, response.get()) : result.status();
          if (!filled.ok()) {
            LogFailure(work.model->name, work.request_id, filled);
            FillErrorResponse(work.model->name, work.request_id, filled, response.get());
          }
          meter.Record(ErrorCodeOf(*response));
          OnAnswer(std::move(response));
        });
    std::lock_guard<std::mutex> lock(mu_);
    if (!scheduled.ok()) {
      // Still counted in in_flight_ until its error answer is written.
      auto response = std::make_unique<v1::AttendResponse>();
      FillErrorResponse(request_.model(), request_.request_id(), scheduled, response.get());
      meter.Record(ErrorCodeOf(*response));
      EnqueueLocked(std::move(response), &actions);
    }
    reading_ = false;
    DecideLocked(&actions);
  }
  Perform(actions);
}

void AttendStreamReactor::OnAnswer(std::unique_ptr<v1::AttendResponse> response) {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    EnqueueLocked(std::move(response), &actions);
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
    pending_.pop_front();
    --in_flight_;  // That message is done: its answer is written (or the client is gone).
    if (!ok) {
      // The client is gone: answers still to come are dropped, the stream ends when they are in.
      write_failed_ = true;
      in_flight_ -= static_cast<int>(pending_.size());
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

void AttendStreamReactor::EnqueueLocked(std::unique_ptr<v1::AttendResponse> response,
                                        Actions* actions) {
  if (write_failed_ || finished_) {
    --in_flight_;  // Dropped: nobody will read it.
    return;
  }
  pending_.push_back(std::move(response));
  DecideLocked(actions);
}

void AttendStreamReactor::DecideLocked(Actions* actions) {
  if (finished_) return;
  if (!reading_ && !reads_done_ && !write_failed_ && in_flight_ < kMaxInFlightPerStream) {
    reading_ = true;
    actions->read = true;
  }
  if (!writing_ && !pending_.empty()) {
    writing_ = true;
    actions->write = pending_.front().get();
  }
  // After a failed write no read is started (above), so once the outstanding read is done no
  // message can come: a client that left while reading was paused must not leave the stream open.
  const bool no_more_reads = reads_done_ || (write_failed_ && !reading_);
  if (no_more_reads && in_flight_ == 0 && pending_.empty() && !writing_) {
    finished_ = true;
    actions->finish = true;
  }
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
