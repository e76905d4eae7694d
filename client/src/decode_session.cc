// DecodeStream's conveniences over SendAsync, and DecodeSession (attnserve/client/decode.h).
#include <future>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "attnserve/client/decode.h"

namespace attnserve::client {

std::future<absl::StatusOr<DecodeAnswer>> DecodeStream::SendAsync(const DecodeMessage& message) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<DecodeAnswer>>>();
  std::future<absl::StatusOr<DecodeAnswer>> future = promise->get_future();
  const absl::Status sent = SendAsync(message, [promise](absl::StatusOr<DecodeAnswer> answer) {
    promise->set_value(std::move(answer));
  });
  if (!sent.ok()) promise->set_value(sent);  // `done` is not called when the send fails.
  return future;
}

absl::StatusOr<DecodeAnswer> DecodeStream::Send(const DecodeMessage& message) {
  return SendAsync(message).get();
}

absl::StatusOr<DecodeOpened> DecodeStream::Open(const DecodeOpen& open) {
  DecodeMessage message;
  message.opens.push_back(open);
  absl::StatusOr<DecodeAnswer> answer = Send(message);
  if (!answer.ok()) return answer.status();
  return std::move(answer->opens.front());
}

absl::StatusOr<Tensor> DecodeStream::Step(const std::string& session, TensorView rows) {
  DecodeMessage message;
  message.steps.push_back({.session = session, .rows = std::move(rows)});
  absl::StatusOr<DecodeAnswer> answer = Send(message);
  if (!answer.ok()) return answer.status();
  return std::move(answer->steps.front());
}

absl::Status DecodeStream::CloseSession(const std::string& session) {
  DecodeMessage message;
  message.closes.push_back(session);
  absl::StatusOr<DecodeAnswer> answer = Send(message);
  if (!answer.ok()) return answer.status();
  return answer->closes.front();
}

absl::StatusOr<std::unique_ptr<DecodeSession>> DecodeSession::Open(
    std::unique_ptr<DecodeStream> stream, const DecodeOpen& open) {
  if (stream == nullptr) return absl::InvalidArgumentError("stream: expected a DecodeStream");
  absl::StatusOr<DecodeOpened> opened = stream->Open(open);
  if (!opened.ok()) {
    (void)stream->Close();
    return opened.status();
  }
  return std::unique_ptr<DecodeSession>(new DecodeSession(std::move(stream), *std::move(opened)));
}

DecodeSession::~DecodeSession() { (void)Close(); }

absl::StatusOr<Tensor> DecodeSession::Step(TensorView rows) {
  return stream_->Step(opened_.session, std::move(rows));
}

absl::Status DecodeSession::StepAsync(TensorView rows, Callback done) {
  DecodeMessage message;
  message.steps.push_back({.session = opened_.session, .rows = std::move(rows)});
  return stream_->SendAsync(message, [done = std::move(done)](absl::StatusOr<DecodeAnswer> answer) {
    if (!answer.ok()) {
      done(answer.status());
      return;
    }
    done(std::move(answer->steps.front()));
  });
}

std::future<absl::StatusOr<Tensor>> DecodeSession::StepAsync(TensorView rows) {
  auto promise = std::make_shared<std::promise<absl::StatusOr<Tensor>>>();
  std::future<absl::StatusOr<Tensor>> future = promise->get_future();
  const absl::Status sent = StepAsync(std::move(rows), [promise](absl::StatusOr<Tensor> output) {
    promise->set_value(std::move(output));
  });
  if (!sent.ok()) promise->set_value(sent);
  return future;
}

absl::Status DecodeSession::Close() {
  // The stream's end closes the session on the server (no DecodeClose needed).
  return stream_->Close();
}

}  // namespace attnserve::client
