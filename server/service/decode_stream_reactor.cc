#include "server/service/decode_stream_reactor.h"

#include <string>
#include <utility>
#include <vector>

#include "core/util/happens_before.h"
#include "server/service/wire_messages.h"
#include "spdlog/spdlog.h"

namespace attnserve::server {

// One message's answer, filled by its items (on gRPC and loop threads) under mu.
struct DecodeStreamReactor::Pending {
  std::mutex mu;
  v1::DecodeResponse response ABSL_GUARDED_BY(mu);
  // Items not yet done, plus one held by Start until every item is started.
  int outstanding ABSL_GUARDED_BY(mu) = 1;
  // Sessions the message closes, once its steps are answered.
  std::vector<decoding::SessionId> to_close ABSL_GUARDED_BY(mu);
  // The message's size, held in the stream's unsent bytes until its answer replaces it.
  int64_t reserved_bytes = 0;
};

namespace {

// `response` as bytes to write; an in-band Internal error in its place if it cannot be
// serialised (over protobuf's 2 GiB), so the message still gets an answer.
grpc::ByteBuffer Serialized(const v1::DecodeResponse& response) {
  grpc::ByteBuffer bytes;
  absl::Status status = SerializeWireMessage(response, &bytes);
  if (!status.ok()) {
    v1::DecodeResponse error;
    error.set_request_id(response.request_id());
    FillDecodeError(status, error.mutable_error());
    status = SerializeWireMessage(error, &bytes);
  }
  return bytes;
}

}  // namespace

DecodeStreamReactor::DecodeStreamReactor(decoding::DecodeRuntime* runtime,
                                         const ModelRouter* router, StreamRegistry* streams,
                                         decoding::OwnerKey owner, bool draining,
                                         int64_t max_unsent_bytes)
    : runtime_(runtime),
      router_(router),
      streams_(streams),
      owner_(owner),
      max_unsent_bytes_(max_unsent_bytes) {
  streams_->Register(this);
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining) reads_done_ = drained_ = true;
    DecideLocked(&actions);
  }
  Perform(actions);
}

void DecodeStreamReactor::OnReadDone(bool ok) {
  TakeOver(&request_);
  Actions actions;
  if (ok) {
    // Its answer (outputs as wide as its rows) is about its size: reserved until written.
    const int64_t reserved = static_cast<int64_t>(request_.Length());
    {
      // Counted before its items start: their answers may come before Start returns.
      std::lock_guard<std::mutex> lock(mu_);
      ++in_flight_;
      AddUnsentLocked(reserved);
    }
    v1::DecodeRequest message;
    const absl::Status parsed = ParseWireMessage(request_, "message", &message);
    request_.Clear();
    if (parsed.ok()) {
      Start(message, reserved);
    } else {
      v1::DecodeResponse response;
      FillDecodeError(parsed, response.mutable_error());
      Answer(response, reserved);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    reading_ = false;
    if (!ok) reads_done_ = true;  // The client half-closed, or the call is over.
    DecideLocked(&actions);
  }
  Perform(actions);
}

void DecodeStreamReactor::Start(const v1::DecodeRequest& message, int64_t reserved_bytes) {
  auto pending = std::make_shared<Pending>();
  pending->reserved_bytes = reserved_bytes;
  {
    std::lock_guard<std::mutex> lock(pending->mu);
    v1::DecodeResponse& response = pending->response;
    response.set_request_id(message.request_id());
    for (int i = 0; i < message.opens_size(); ++i) {
      response.add_opens()->set_session(message.opens(i).session());
    }
    for (int i = 0; i < message.steps_size(); ++i) {
      response.add_steps()->set_session(message.steps(i).session());
    }
    for (int i = 0; i < message.closes_size(); ++i) {
      response.add_closes()->set_session(message.closes(i).session());
    }
    pending->outstanding += message.opens_size() + message.steps_size();
  }
  for (int i = 0; i < message.opens_size(); ++i) StartOpen(message, i, pending);
  for (int i = 0; i < message.steps_size(); ++i) StartStep(message, i, pending);
  for (int i = 0; i < message.closes_size(); ++i) StartClose(message, i, pending);
  ItemDone(pending);  // Start's own hold.
}

void DecodeStreamReactor::StartOpen(const v1::DecodeRequest& message, int index,
                                    const std::shared_ptr<Pending>& pending) {
  const auto fail = [&](const absl::Status& status) {
    {
      std::lock_guard<std::mutex> lock(pending->mu);
      FillDecodeError(status, pending->response.mutable_opens(index)->mutable_error());
    }
    ItemDone(pending);
  };
  absl::StatusOr<ModelRoute> route = router_->Route(message.opens(index).model());
  if (!route.ok()) return fail(route.status());
  absl::StatusOr<decoding::SessionSpec> spec;
  {
    std::lock_guard<std::mutex> lock(tags_mu_);
    spec = ParseDecodeOpen(message, index, route->model, owner_, tags_);
  }
  if (!spec.ok()) return fail(spec.status());
  const std::string tag = message.opens(index).session();
  std::shared_ptr<const model::Model> model = route->model;
  uint64_t serial = 0;
  {
    // Taken before Open: the ready callback (which frees the tag of a failed open) may run
    // before Open returns the id.
    std::lock_guard<std::mutex> lock(tags_mu_);
    serial = ++last_serial_;
    tags_[tag] = DecodeStreamSession{.id = 0, .model = model, .serial = serial};
  }
  absl::StatusOr<decoding::SessionId> opened = runtime_->Open(
      *std::move(spec), [this, pending, index, tag, model, serial](absl::Status ready) {
        if (!ready.ok()) {
          std::lock_guard<std::mutex> lock(tags_mu_);
          const auto it = tags_.find(tag);
          if (it != tags_.end() && it->second.serial == serial) tags_.erase(it);
        }
        {
          std::lock_guard<std::mutex> lock(pending->mu);
          v1::DecodeOpenResult* result = pending->response.mutable_opens(index);
          result->set_model(model->name);
          result->set_model_version(model->version);
          if (!ready.ok()) FillDecodeError(ready, result->mutable_error());
        }
        ItemDone(pending);
      });
  {
    std::lock_guard<std::mutex> lock(tags_mu_);
    const auto it = tags_.find(tag);
    if (it == tags_.end() || it->second.serial != serial) {
      // The open failed meanwhile (its ready callback freed the tag).
    } else if (!opened.ok()) {
      tags_.erase(it);
    } else {
      it->second.id = *opened;  // Still there: the open has not failed meanwhile.
    }
  }
  if (!opened.ok()) fail(opened.status());
}

void DecodeStreamReactor::StartStep(const v1::DecodeRequest& message, int index,
                                    const std::shared_ptr<Pending>& pending) {
  const auto fail = [&](const absl::Status& status) {
    {
      std::lock_guard<std::mutex> lock(pending->mu);
      FillDecodeError(status, pending->response.mutable_steps(index)->mutable_error());
    }
    ItemDone(pending);
  };
  absl::StatusOr<DecodeStreamSession> session;
  {
    std::lock_guard<std::mutex> lock(tags_mu_);
    session = FindDecodeSession(message, "steps", index, tags_);
  }
  if (!session.ok()) return fail(session.status());
  absl::StatusOr<decoding::StepRequest> step = ParseDecodeStep(message, index, *session);
  if (!step.ok()) return fail(step.status());
  const DecodeOutputFormat format = DecodeStepOutputFormat(message, index);
  const int64_t d_model = session->model->config.attention.d_model;
  step->done = [this, pending, index, format, d_model](absl::StatusOr<std::vector<float>> output) {
    {
      std::lock_guard<std::mutex> lock(pending->mu);
      v1::DecodeStepResult* result = pending->response.mutable_steps(index);
      if (output.ok()) {
        FillDecodeStepOutput(*output, d_model, format, result);
      } else {
        FillDecodeError(output.status(), result->mutable_error());
      }
    }
    ItemDone(pending);
  };
  if (absl::Status appended = runtime_->Append(&*step); !appended.ok()) fail(appended);
}

void DecodeStreamReactor::StartClose(const v1::DecodeRequest& message, int index,
                                     const std::shared_ptr<Pending>& pending) {
  absl::StatusOr<DecodeStreamSession> session;
  {
    // The tag is free at once (a later message may reuse it); the session closes once this
    // message's steps are answered.
    std::lock_guard<std::mutex> lock(tags_mu_);
    session = FindDecodeSession(message, "closes", index, tags_);
    if (session.ok()) tags_.erase(message.closes(index).session());
  }
  std::lock_guard<std::mutex> lock(pending->mu);
  if (session.ok()) {
    pending->to_close.push_back(session->id);
  } else {
    FillDecodeError(session.status(), pending->response.mutable_closes(index)->mutable_error());
  }
}

void DecodeStreamReactor::ItemDone(const std::shared_ptr<Pending>& pending) {
  std::vector<decoding::SessionId> to_close;
  {
    std::lock_guard<std::mutex> lock(pending->mu);
    if (--pending->outstanding > 0) return;
    to_close = std::move(pending->to_close);
  }
  // The last item: nobody else touches `pending` now.
  for (decoding::SessionId id : to_close) {
    // NotFound only when the session already ended (idle, drained): closed either way.
    if (absl::Status closed = runtime_->Close(id); !closed.ok()) {
      spdlog::debug("Decode close of session {}: {}", id, closed.ToString());
    }
  }
  std::lock_guard<std::mutex> lock(pending->mu);  // For the analysis; uncontended.
  Answer(pending->response, pending->reserved_bytes);
}

void DecodeStreamReactor::Answer(const v1::DecodeResponse& response, int64_t reserved_bytes) {
  grpc::ByteBuffer answer = Serialized(response);  // Outside mu_.
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

void DecodeStreamReactor::OnWriteDone(bool ok) {
  TakeOver(&pending_);
  Actions actions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    AddUnsentLocked(-static_cast<int64_t>(pending_.front().Length()));
    pending_.pop_front();
    --in_flight_;
    if (!ok) {
      // The client is gone: answers still to come are dropped.
      write_failed_ = true;
      in_flight_ -= static_cast<int>(pending_.size());
      for (const grpc::ByteBuffer& answer : pending_) {
        AddUnsentLocked(-static_cast<int64_t>(answer.Length()));
      }
      pending_.clear();
    }
    DecideLocked(&actions);
  }
  // Its sessions' queued steps are answered CANCELLED at once instead of computed for nobody.
  if (!ok) runtime_->CloseOwner(owner_);
  Perform(actions);
}

void DecodeStreamReactor::OnCancel() {
  // Cancelled, or the connection dropped: free the cache now, and have queued steps answered
  // (CANCELLED) so the call can finish without waiting for compute nobody will read.
  runtime_->CloseOwner(owner_);
}

void DecodeStreamReactor::OnDone() {
  TakeOver(this);  // Every reaction and Finish came first (each handed off `this`).
  runtime_->CloseOwner(owner_);
  streams_->Unregister(this);
  delete this;
}

bool DecodeStreamReactor::PrepareDrain() {
  Actions actions;
  std::lock_guard<std::mutex> lock(mu_);
  reads_done_ = true;
  drained_ = true;
  DecideLocked(&actions);
  return actions.finish;
}

void DecodeStreamReactor::FinishDrained() {
  HandOff(this);
  Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "server is shutting down: every accepted message was answered; reconnect"));
}

void DecodeStreamReactor::DecideLocked(Actions* actions) {
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
  const bool no_more_reads = reads_done_ || (write_failed_ && !reading_);
  if (no_more_reads && in_flight_ == 0 && pending_.empty() && !writing_) {
    finished_ = true;
    actions->finish = true;
    actions->drained = drained_;
  }
}

void DecodeStreamReactor::AddUnsentLocked(int64_t delta) {
  unsent_bytes_ += delta;
  streams_->AddUnsentBytes(delta);
}

void DecodeStreamReactor::Perform(const Actions& actions) {
  // No member may be touched after Finish: OnDone may delete the reactor at once.
  HandOff(this);
  if (actions.write != nullptr) {
    HandOff(&pending_);
    StartWrite(actions.write);
  }
  if (actions.read) {
    HandOff(&request_);
    StartRead(&request_);
  }
  if (actions.finish) {
    if (actions.drained) {
      FinishDrained();
    } else {
      Finish(grpc::Status::OK);
    }
  }
}

}  // namespace attnserve::server
