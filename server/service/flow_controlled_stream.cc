#include "server/service/flow_controlled_stream.h"

#include <utility>

#include "core/util/happens_before.h"

namespace attnserve::server {

FlowControlledStream::FlowControlledStream(StreamRegistry* streams, StreamFlowOptions options)
    : streams_(streams), options_(std::move(options)) {}

void FlowControlledStream::Begin(const std::function<bool()>& draining) {
  streams_->Register(this);
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining()) reads_done_ = drained_ = true;
    DecideLocked(&actions);
  }
  Perform(actions);
}

void FlowControlledStream::OnReadDone(bool ok) {
  TakeOver(&request_);
  OnReadCompleted(ok);
  bool accepted = false;
  {
    // Counted before the message starts: its answer may come before OnMessage returns.
    std::lock_guard<std::mutex> lock(mu_);
    // A drain may have finished the stream while this read was outstanding (an idle stream must
    // not wait for a message that may never come). A message that still arrived is not accepted:
    // gRPC runs OnDone as soon as this reaction returns, so work started now would answer into a
    // deleted stream.
    accepted = ok && !finished_;
    if (accepted) ++in_flight_;
  }
  if (accepted) OnMessage(&request_);
  request_.Clear();
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reading_ = false;
    if (!ok) reads_done_ = true;  // The client half-closed, or the call is over.
    DecideLocked(&actions);
  }
  Perform(actions);
}

void FlowControlledStream::Reserve(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  AddUnsentLocked(bytes);
}

void FlowControlledStream::Answer(grpc::ByteBuffer answer, int64_t reserved_bytes) {
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    AddUnsentLocked(-reserved_bytes);
    if (write_failed_ || finished_) {
      --in_flight_;  // Dropped: nobody will read it.
    } else {
      AddUnsentLocked(static_cast<int64_t>(answer.Length()));
      pending_.push_back(std::move(answer));
    }
    DecideLocked(&actions);
  }
  Perform(actions);
}

void FlowControlledStream::OnWriteDone(bool ok) {
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
  // Before Perform, which may finish the stream: nothing may run on it after that.
  if (!ok) OnClientGone();
  Perform(actions);
}

void FlowControlledStream::OnDone() {
  TakeOver(this);  // Every reaction and Finish came first (each handed off `this`).
  OnStreamDone();
  streams_->Unregister(this);
  delete this;
}

bool FlowControlledStream::PrepareDrain() {
  Actions actions;
  std::lock_guard<std::mutex> lock(mu_);
  reads_done_ = true;
  drained_ = true;
  DecideLocked(&actions);
  // With reads done, the only thing left to decide is finishing: a pending answer is already
  // being written by whoever queued it.
  return actions.finish;
}

void FlowControlledStream::FinishDrained() {
  HandOff(this);
  Finish(options_.drained_status);
}

void FlowControlledStream::DecideLocked(Actions* actions) {
  if (finished_) return;
  if (!reading_ && !reads_done_ && !write_failed_ && in_flight_ < options_.max_in_flight_messages &&
      unsent_bytes_ < options_.max_unsent_bytes && (in_flight_ == 0 || !streams_->OverBudget())) {
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
    actions->drained = drained_;
  }
}

void FlowControlledStream::AddUnsentLocked(int64_t delta) {
  unsent_bytes_ += delta;
  streams_->AddUnsentBytes(delta);
}

void FlowControlledStream::Perform(const Actions& actions) {
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
  if (actions.finish) Finish(actions.drained ? options_.drained_status : grpc::Status::OK);
}

}  // namespace attnserve::server
