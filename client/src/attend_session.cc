#include "client/src/attend_session.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/src/channel.h"
#include "client/src/conversion.h"
#include "core/util/happens_before.h"

namespace attnserve::client::internal {

StreamSession::StreamSession(v1::AttentionService::Stub* stub, int max_in_flight)
    : max_in_flight_(max_in_flight) {
  stub->async()->AttendStream(&context_, this);
  HandOff(&response_);
  StartRead(&response_);
  HandOff(this);
  StartCall();
}

StreamSession::~StreamSession() { (void)Close(); }

absl::Status StreamSession::Attend(std::string_view model, TensorView input,
                                   const AttendOptions& options, Callback done) {
  absl::StatusOr<v1::AttendRequest> request = MakeAttendRequest(model, input, options);
  if (!request.ok()) return request.status();
  Next next;
  {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] {
      return ended_ || closing_ || static_cast<int>(pending_.size()) < max_in_flight_;
    });
    if (ended_ || closing_) {
      return absl::FailedPreconditionError(
          ended_ ? absl::StrCat("the stream has ended: ", final_status_.ToString())
                 : std::string("the session is closed"));
    }
    if (request->request_id().empty()) request->set_request_id(absl::StrCat("s", ++next_id_));
    const auto [it, added] = pending_.try_emplace(
        request->request_id(), Pending{std::move(done), std::chrono::steady_clock::now(),
                                       static_cast<int64_t>(request->ByteSizeLong())});
    if (!added) {
      return absl::InvalidArgumentError(absl::StrCat("request_id: \"", request->request_id(),
                                                     "\" is already waiting for its answer"));
    }
    to_write_.push_back(std::make_unique<v1::AttendRequest>(*std::move(request)));
    next = NextWriteLocked();
  }
  Perform(next);
  return absl::OkStatus();
}

absl::Status StreamSession::Close() {
  Next next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    next = NextWriteLocked();
  }
  changed_.notify_all();  // Senders blocked on flow control give up.
  Perform(next);
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [this] { return done_; });
  return final_status_;
}

StreamSession::Next StreamSession::NextWriteLocked() {
  if (writing_ || ended_) return {};
  if (!to_write_.empty()) {
    writing_ = true;
    // Taken under mu_: Attend may grow the deque meanwhile, but the element stays put until
    // OnWriteDone pops it.
    return {.kind = Next::kWrite, .request = to_write_.front().get()};
  }
  if (closing_ && !writes_done_started_) {
    writes_done_started_ = true;
    writing_ = true;
    return {.kind = Next::kWritesDone};
  }
  return {};
}

void StreamSession::Perform(Next next) {
  // Each operation hands off to its reaction, and everything so far to OnDone
  // (core/util/happens_before.h).
  HandOff(this);
  if (next.kind == Next::kWrite) {
    HandOff(&to_write_);
    StartWrite(next.request);
  }
  if (next.kind == Next::kWritesDone) {
    HandOff(&to_write_);
    StartWritesDone();
  }
}

void StreamSession::OnWriteDone(bool ok) {
  TakeOver(&to_write_);
  Next next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    to_write_.pop_front();
    writing_ = false;
    // A failed write means the stream is over: OnDone will report why, and answer the rest.
    if (ok) next = NextWriteLocked();
  }
  Perform(next);
}

void StreamSession::OnWritesDoneDone(bool /*ok*/) {
  TakeOver(&to_write_);
  std::lock_guard<std::mutex> lock(mu_);
  writing_ = false;
  HandOff(this);
}

void StreamSession::OnReadDone(bool ok) {
  TakeOver(&response_);
  if (!ok) {  // The server finished the stream; OnDone follows.
    HandOff(this);
    return;
  }
  Pending pending;
  bool found = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(response_.request_id());
    if (it != pending_.end()) {
      pending = std::move(it->second);
      pending_.erase(it);
      found = true;
    }
  }
  changed_.notify_all();  // A flow-control slot is free.
  if (found) {
    absl::StatusOr<AttendResult> result =
        response_.has_error()
            ? absl::Status(static_cast<absl::StatusCode>(response_.error().code()),
                           response_.error().message())
            : ReadAttendResponse(response_);
    if (result.ok()) {
      result->latency = std::chrono::duration_cast<std::chrono::microseconds>(
          std::chrono::steady_clock::now() - pending.start);
      result->request_bytes = pending.request_bytes;
    }
    pending.done(std::move(result));
  }
  HandOff(this);
  HandOff(&response_);
  StartRead(&response_);
}

void StreamSession::OnDone(const grpc::Status& status) {
  TakeOver(this);  // Every reaction and operation came first.
  std::map<std::string, Pending> unanswered;
  {
    std::lock_guard<std::mutex> lock(mu_);
    final_status_ = FromGrpc(status);
    unanswered.swap(pending_);
    ended_ = true;  // From here Attend refuses: nothing can join `unanswered` any more.
  }
  // The stream is over: whatever was not answered never will be.
  const absl::Status lost =
      status.ok() ? absl::InternalError("the stream ended without answering this request")
                  : final_status_;
  for (auto& [id, pending] : unanswered) pending.done(lost);
  // Notified under mu_: Close (and then the destructor) cannot return before this is done.
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  changed_.notify_all();
}

}  // namespace attnserve::client::internal
