#include "client/src/decode_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "client/src/channel.h"
#include "client/src/conversion.h"
#include "core/util/happens_before.h"

namespace attnserve::client::internal {

GrpcDecodeStream::GrpcDecodeStream(v1::AttentionService::Stub* stub,
                                   const DecodeStreamOptions& options)
    : options_(options) {
  stub->async()->Decode(&context_, this);
  HandOff(&response_);
  StartRead(&response_);
  HandOff(this);
  StartCall();
}

GrpcDecodeStream::~GrpcDecodeStream() { (void)Close(); }

absl::Status GrpcDecodeStream::SendAsync(const DecodeMessage& message, Callback done) {
  // Built before taking mu_ (copying the tensors); the id is set once it is known.
  absl::StatusOr<v1::DecodeRequest> request = MakeDecodeRequest(message, options_, "");
  if (!request.ok()) return request.status();
  Next next;
  {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] {
      return ended_ || closing_ || static_cast<int>(pending_.size()) < options_.max_in_flight;
    });
    if (ended_ || closing_) {
      return absl::FailedPreconditionError(
          ended_ ? absl::StrCat("the Decode stream has ended: ", final_status_.ToString())
                 : std::string("the Decode stream is closed"));
    }
    const std::string id = absl::StrCat("d", ++next_id_);
    request->set_request_id(id);
    auto shared = std::make_shared<const v1::DecodeRequest>(*std::move(request));
    pending_.emplace(id, Pending{.done = std::move(done),
                                 .start = std::chrono::steady_clock::now(),
                                 .request = shared,
                                 .request_bytes = static_cast<int64_t>(shared->ByteSizeLong())});
    to_write_.push_back(std::move(shared));
    next = NextWriteLocked();
  }
  Perform(next);
  return absl::OkStatus();
}

absl::Status GrpcDecodeStream::Close() {
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

GrpcDecodeStream::Next GrpcDecodeStream::NextWriteLocked() {
  if (writing_ || ended_) return {};
  if (!to_write_.empty()) {
    writing_ = true;
    // The element stays put until OnWriteDone pops it, however the deque grows meanwhile.
    return {.kind = Next::kWrite, .request = to_write_.front().get()};
  }
  if (closing_ && !writes_done_started_) {
    writes_done_started_ = true;
    writing_ = true;
    return {.kind = Next::kWritesDone};
  }
  return {};
}

void GrpcDecodeStream::Perform(Next next) {
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

void GrpcDecodeStream::OnWriteDone(bool ok) {
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

void GrpcDecodeStream::OnWritesDoneDone(bool /*ok*/) {
  TakeOver(&to_write_);
  std::lock_guard<std::mutex> lock(mu_);
  writing_ = false;
  HandOff(this);
}

void GrpcDecodeStream::OnReadDone(bool ok) {
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
    absl::StatusOr<DecodeAnswer> answer = ReadDecodeResponse(*pending.request, response_);
    if (answer.ok()) {
      answer->latency = std::chrono::duration_cast<std::chrono::microseconds>(
          std::chrono::steady_clock::now() - pending.start);
      answer->request_bytes = pending.request_bytes;
    }
    pending.done(std::move(answer));
  }
  HandOff(this);
  HandOff(&response_);
  StartRead(&response_);
}

void GrpcDecodeStream::OnDone(const grpc::Status& status) {
  TakeOver(this);  // Every reaction and operation came first.
  std::map<std::string, Pending> unanswered;
  {
    std::lock_guard<std::mutex> lock(mu_);
    final_status_ = FromGrpc(status);
    unanswered.swap(pending_);
    ended_ = true;  // From here SendAsync refuses: nothing can join `unanswered` any more.
  }
  changed_.notify_all();
  // The stream is over: whatever was not answered never will be.
  const absl::Status lost =
      status.ok() ? absl::InternalError("the Decode stream ended without answering this message")
                  : final_status_;
  for (auto& [id, pending] : unanswered) pending.done(lost);
  // Notified under mu_: Close (and then the destructor) cannot return before this is done.
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  changed_.notify_all();
}

}  // namespace attnserve::client::internal
