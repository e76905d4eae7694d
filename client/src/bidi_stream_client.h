// BidiStreamClient: the client side that AttendStream (StreamSession) and Decode
// (GrpcDecodeStream) share. A bidi reactor that writes requests in the order callers hand them in,
// matches each answer to its request by request_id (answers may come in any order), and completes
// every request it accepted exactly once: with its answer, or, once the stream ends, with why. A
// subclass binds the call and says how an answer reads (ReadAnswer); when to write, to read and to
// half-close is decided here only.
//
// Flow control: one write and one read are outstanding at a time; SendRequest blocks while
// max_in_flight requests are unanswered.
//
// Life: the subclass's constructor binds the call (stub->async()->Method(context(), this)) and, as
// its last step, calls Begin, which starts reading and the call. A failed write ends the stream
// (OnDone says why). CloseAndWait half-closes once everything queued is written, then waits until
// OnDone has completed every unanswered request with the stream's error; the subclass's destructor
// must call it (reactions may call ReadAnswer until then).
//
// Thread-safety: SendRequest and CloseAndWait on any thread; reactions on gRPC threads. All state
// is under mu_, which is never held while calling gRPC, ReadAnswer or a callback.
#ifndef ATTNSERVE_CLIENT_SRC_BIDI_STREAM_CLIENT_H_
#define ATTNSERVE_CLIENT_SRC_BIDI_STREAM_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/src/channel.h"
#include "core/util/happens_before.h"

namespace attnserve::client::internal {

// What differs between the streams built on BidiStreamClient: flow control and the words of its
// errors, which name the RPC.
struct BidiStreamClientOptions {
  // Unanswered requests at which SendRequest blocks (>= 1).
  int max_in_flight = 1;
  // Keep each request from SendRequest until its answer, for ReadAnswer; otherwise it is freed once
  // written and ReadAnswer gets nullptr.
  bool keep_requests = false;
  // Requests with no request_id get id_prefix followed by a counter (1, 2, ...).
  const char* id_prefix = "s";
  // SendRequest's FailedPrecondition message after CloseAndWait.
  const char* closed_error = "the stream is closed";
  // SendRequest's FailedPrecondition message once the stream has ended, before ": <its status>".
  const char* ended_error = "the stream has ended";
  // What an unanswered request gets when the stream ends with OK.
  const char* unanswered_error = "the stream ended without answering this request";
};

// `Result` has `latency` (std::chrono::microseconds) and `request_bytes` (int64_t), which the
// stream fills in on every successful answer.
template <typename Request, typename Response, typename Result>
class BidiStreamClient : public grpc::ClientBidiReactor<Request, Response> {
 public:
  using Done = std::function<void(absl::StatusOr<Result>)>;

  void OnWriteDone(bool ok) final;
  void OnWritesDoneDone(bool ok) final;
  void OnReadDone(bool ok) final;
  void OnDone(const grpc::Status& status) final;

 protected:
  explicit BidiStreamClient(const BidiStreamClientOptions& options) : options_(options) {}
  ~BidiStreamClient() override = default;

  // For binding the call; valid for the object's life.
  grpc::ClientContext* context() { return &context_; }
  // The last step of the subclass's constructor: starts the first read and the call.
  void Begin();

  // Queues `request` for writing; `done` is called exactly once with ReadAnswer's result for its
  // answer (latency counted from here, after the flow-control wait) or with the stream's error.
  // Gives `request` an id when it has none. Blocks while max_in_flight requests are unanswered.
  // FailedPrecondition after CloseAndWait or once the stream has ended, InvalidArgument when its
  // request_id is already waiting for an answer (then `done` is not called).
  absl::Status SendRequest(Request request, Done done);
  // Half-closes once everything queued is written, waits until every request is completed and
  // returns the stream's status. Idempotent.
  absl::Status CloseAndWait();

  // The result of `response`, the answer to `request` (nullptr unless options.keep_requests).
  // Called on a gRPC thread without locks; an error completes that request only.
  virtual absl::StatusOr<Result> ReadAnswer(const Request* request, const Response& response) = 0;

 private:
  // A request sent, not yet answered.
  struct Pending {
    Done done;
    std::chrono::steady_clock::time_point start;
    int64_t request_bytes = 0;               // Its serialised size, for the result.
    std::shared_ptr<const Request> request;  // Only with options.keep_requests.
  };
  // What to start after releasing mu_: the next write, or WritesDone once closing and everything
  // is written.
  struct Next {
    enum Kind { kNothing, kWrite, kWritesDone };
    Kind kind = kNothing;
    const Request* request = nullptr;
  };
  Next NextWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Perform(Next next);

  const BidiStreamClientOptions options_;
  grpc::ClientContext context_;
  Response response_;  // The read buffer; only touched between StartRead and OnReadDone.

  std::mutex mu_;
  std::condition_variable changed_;
  // Front: being written. It stays put until OnWriteDone pops it, however the deque grows.
  std::deque<std::shared_ptr<const Request>> to_write_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool writes_done_started_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;  // OnDone has begun: no more requests, writes, answers.
  bool done_ ABSL_GUARDED_BY(mu_) =
      false;  // OnDone has completed everything: CloseAndWait returns.
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, Pending> pending_ ABSL_GUARDED_BY(mu_);  // By request_id.
};

template <typename Request, typename Response, typename Result>
void BidiStreamClient<Request, Response, Result>::Begin() {
  HandOff(&response_);
  this->StartRead(&response_);
  HandOff(this);
  this->StartCall();
}

template <typename Request, typename Response, typename Result>
absl::Status BidiStreamClient<Request, Response, Result>::SendRequest(Request request, Done done) {
  Next next;
  {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] {
      return ended_ || closing_ || static_cast<int>(pending_.size()) < options_.max_in_flight;
    });
    if (ended_) {
      return absl::FailedPreconditionError(
          absl::StrCat(options_.ended_error, ": ", final_status_.ToString()));
    }
    if (closing_) return absl::FailedPreconditionError(options_.closed_error);
    if (request.request_id().empty()) {
      request.set_request_id(absl::StrCat(options_.id_prefix, ++next_id_));
    }
    auto shared = std::make_shared<const Request>(std::move(request));
    const auto [it, added] = pending_.try_emplace(
        shared->request_id(), Pending{.done = std::move(done),
                                      .start = std::chrono::steady_clock::now(),
                                      .request_bytes = static_cast<int64_t>(shared->ByteSizeLong()),
                                      .request = options_.keep_requests ? shared : nullptr});
    if (!added) {
      return absl::InvalidArgumentError(absl::StrCat("request_id: \"", shared->request_id(),
                                                     "\" is already waiting for its answer"));
    }
    to_write_.push_back(std::move(shared));
    next = NextWriteLocked();
  }
  Perform(next);
  return absl::OkStatus();
}

template <typename Request, typename Response, typename Result>
absl::Status BidiStreamClient<Request, Response, Result>::CloseAndWait() {
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

template <typename Request, typename Response, typename Result>
typename BidiStreamClient<Request, Response, Result>::Next
BidiStreamClient<Request, Response, Result>::NextWriteLocked() {
  if (writing_ || ended_) return {};
  if (!to_write_.empty()) {
    writing_ = true;
    return {.kind = Next::kWrite, .request = to_write_.front().get()};
  }
  if (closing_ && !writes_done_started_) {
    writes_done_started_ = true;
    writing_ = true;
    return {.kind = Next::kWritesDone};
  }
  return {};
}

template <typename Request, typename Response, typename Result>
void BidiStreamClient<Request, Response, Result>::Perform(Next next) {
  // Each operation hands off to its reaction, and everything so far to OnDone
  // (core/util/happens_before.h).
  HandOff(this);
  if (next.kind == Next::kWrite) {
    HandOff(&to_write_);
    this->StartWrite(next.request);
  }
  if (next.kind == Next::kWritesDone) {
    HandOff(&to_write_);
    this->StartWritesDone();
  }
}

template <typename Request, typename Response, typename Result>
void BidiStreamClient<Request, Response, Result>::OnWriteDone(bool ok) {
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

template <typename Request, typename Response, typename Result>
void BidiStreamClient<Request, Response, Result>::OnWritesDoneDone(bool /*ok*/) {
  TakeOver(&to_write_);
  std::lock_guard<std::mutex> lock(mu_);
  writing_ = false;
  HandOff(this);
}

template <typename Request, typename Response, typename Result>
void BidiStreamClient<Request, Response, Result>::OnReadDone(bool ok) {
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
    absl::StatusOr<Result> result = ReadAnswer(pending.request.get(), response_);
    if (result.ok()) {
      result->latency = std::chrono::duration_cast<std::chrono::microseconds>(
          std::chrono::steady_clock::now() - pending.start);
      result->request_bytes = pending.request_bytes;
    }
    pending.done(std::move(result));
  }
  HandOff(this);
  HandOff(&response_);
  this->StartRead(&response_);
}

template <typename Request, typename Response, typename Result>
void BidiStreamClient<Request, Response, Result>::OnDone(const grpc::Status& status) {
  TakeOver(this);  // Every reaction and operation came first.
  std::map<std::string, Pending> unanswered;
  {
    std::lock_guard<std::mutex> lock(mu_);
    final_status_ = FromGrpc(status);
    unanswered.swap(pending_);
    ended_ = true;  // From here SendRequest refuses: nothing can join `unanswered` any more.
  }
  changed_.notify_all();  // Senders blocked on flow control give up.
  // The stream is over: whatever was not answered never will be.
  const absl::Status lost =
      status.ok() ? absl::InternalError(options_.unanswered_error) : FromGrpc(status);
  for (auto& [id, pending] : unanswered) pending.done(lost);
  // Notified under mu_: CloseAndWait (and then the destructor) cannot return before this is done.
  std::lock_guard<std::mutex> lock(mu_);
  done_ = true;
  changed_.notify_all();
}

}  // namespace attnserve::client::internal

#endif  // ATTNSERVE_CLIENT_SRC_BIDI_STREAM_CLIENT_H_
