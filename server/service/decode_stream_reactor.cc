#include "server/service/decode_stream_reactor.h"

#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "google/protobuf/arena.h"
#include "server/service/wire_messages.h"
#include "spdlog/spdlog.h"

namespace attnserve::server {

// One message's answer, filled by its items (on gRPC and loop threads) under mu.
struct DecodeStreamReactor::Pending {
  std::mutex mu;
  // The answer without its steps' outputs, which stay in `outputs` (one per step, set when the
  // step succeeded) until the answer is encoded.
  v1::DecodeResponse response ABSL_GUARDED_BY(mu);
  std::vector<std::optional<DecodeStepOutput>> outputs ABSL_GUARDED_BY(mu);
  // Items not yet done, plus one held by Start until every item is started.
  int outstanding ABSL_GUARDED_BY(mu) = 1;
  // Sessions the message closes, once its steps are answered.
  std::vector<decoding::SessionId> to_close ABSL_GUARDED_BY(mu);
  // The message's size, held in the stream's unsent bytes until its answer replaces it.
  int64_t reserved_bytes = 0;
  RequestMeter meter ABSL_GUARDED_BY(mu);  // Recorded with the answer.
};

namespace {

// `response` with `outputs` as bytes to write; an in-band Internal error in its place if it
// cannot be serialised (over protobuf's 2 GiB), so the message still gets an answer.
grpc::ByteBuffer Serialized(const v1::DecodeResponse& response,
                            std::span<const std::optional<DecodeStepOutput>> outputs) {
  grpc::ByteBuffer bytes;
  absl::Status status = SerializeDecodeResponse(response, outputs, &bytes);
  if (!status.ok()) {
    v1::DecodeResponse error;
    error.set_request_id(response.request_id());
    FillDecodeError(status, error.mutable_error());
    status = SerializeWireMessage(error, &bytes);
  }
  return bytes;
}

// The code a message counts under: its own error's (unparseable), else its first failed item's
// (opens, steps, closes in order), OK when every item succeeded.
grpc::StatusCode CodeOf(const v1::DecodeResponse& response) {
  const auto code = [](const v1::ErrorStatus& error) {
    return static_cast<grpc::StatusCode>(error.code());
  };
  if (response.has_error()) return code(response.error());
  for (const v1::DecodeOpenResult& open : response.opens()) {
    if (open.has_error()) return code(open.error());
  }
  for (const v1::DecodeStepResult& step : response.steps()) {
    if (step.has_error()) return code(step.error());
  }
  for (const v1::DecodeCloseResult& close : response.closes()) {
    if (close.has_error()) return code(close.error());
  }
  return grpc::StatusCode::OK;
}

}  // namespace

DecodeStreamReactor::DecodeStreamReactor(decoding::DecodeRuntime* runtime,
                                         const AttendSubmitter* submitter, StreamRegistry* streams,
                                         decoding::OwnerKey owner, int64_t max_unsent_bytes)
    : FlowControlledStream(
          streams,
          {.max_in_flight_messages = kMaxInFlightPerStream,
           .max_unsent_bytes = max_unsent_bytes,
           .drained_status = grpc::Status(
               grpc::StatusCode::UNAVAILABLE,
               "server is shutting down: every accepted message was answered; reconnect")}),
      runtime_(runtime),
      submitter_(submitter),
      owner_(owner) {
  Begin([submitter] { return submitter->draining(); });
}

void DecodeStreamReactor::OnMessage(grpc::ByteBuffer* bytes) {
  // Its answer (outputs as wide as its rows) is about its size: reserved until written.
  const int64_t reserved = static_cast<int64_t>(bytes->Length());
  Reserve(reserved);
  // On an arena: a round of many steps parses into hundreds of small messages (steps, tensors,
  // shapes), freed together (attnserve_conversion_bench BM_DecodeRequest measures both ways).
  google::protobuf::Arena arena;
  v1::DecodeRequest& message = *google::protobuf::Arena::CreateMessage<v1::DecodeRequest>(&arena);
  const absl::Status parsed = ParseWireMessage(*bytes, "message", &message);
  bytes->Clear();
  if (parsed.ok()) {
    Start(message, reserved, submitter_->StartMeter(metrics::Method::kDecode, MeterModel(message)));
  } else {
    // An unparseable message names no model: it counts under the unknown model's series.
    RequestMeter meter = submitter_->StartMeter(metrics::Method::kDecode, metrics::kUnknownModel);
    v1::DecodeResponse response;
    FillDecodeError(parsed, response.mutable_error());
    meter.Record(CodeOf(response));
    QueueAnswer(response, {}, reserved);
  }
}

std::string DecodeStreamReactor::MeterModel(const v1::DecodeRequest& message) {
  // "" names the default model, as the open's route does.
  if (message.opens_size() > 0) return message.opens(0).model();
  const std::string* tag = message.steps_size() > 0    ? &message.steps(0).session()
                           : message.closes_size() > 0 ? &message.closes(0).session()
                                                       : nullptr;
  if (tag == nullptr) return metrics::kUnknownModel;
  std::lock_guard<std::mutex> lock(tags_->mu);
  const auto it = tags_->map.find(*tag);
  return it == tags_->map.end() || it->second.model == nullptr ? metrics::kUnknownModel
                                                               : it->second.model->name;
}

void DecodeStreamReactor::Start(const v1::DecodeRequest& message, int64_t reserved_bytes,
                                const RequestMeter& meter) {
  auto pending = std::make_shared<Pending>();
  pending->reserved_bytes = reserved_bytes;
  {
    std::lock_guard<std::mutex> lock(pending->mu);
    pending->meter = meter;
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
    pending->outputs.resize(static_cast<size_t>(message.steps_size()));
    pending->outstanding += message.opens_size() + message.steps_size();
  }
  for (int i = 0; i < message.opens_size(); ++i) StartOpen(message, i, pending);
  StartSteps(message, pending);
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
  absl::StatusOr<ModelRoute> route = submitter_->router().Route(message.opens(index).model());
  if (!route.ok()) return fail(route.status());
  absl::StatusOr<decoding::SessionSpec> spec;
  {
    std::lock_guard<std::mutex> lock(tags_->mu);
    spec = ParseDecodeOpen(message, index, route->model, owner_, tags_->map);
  }
  if (!spec.ok()) return fail(spec.status());
  const std::string tag = message.opens(index).session();
  std::shared_ptr<const model::Model> model = route->model;
  uint64_t serial = 0;
  {
    // Taken before Open: the ready callback (which frees the tag of a failed open) may run
    // before Open returns the id.
    std::lock_guard<std::mutex> lock(tags_->mu);
    serial = ++tags_->last_serial;
    tags_->map[tag] =
        DecodeStreamSession{.id = 0, .model = model, .serial = serial, .closed = std::nullopt};
  }
  // A session the runtime closes itself (idle, drained) frees its tag, and with it the hold on
  // its model version. The table outlives the stream for callbacks that come after it ended.
  spec->on_closed = [tags = tags_, tag, serial](decoding::CloseReason reason) {
    tags->MarkClosed(tag, serial, reason);
  };
  absl::StatusOr<decoding::SessionId> opened = runtime_->Open(
      *std::move(spec), [this, pending, index, tag, model, serial](absl::Status ready) {
        if (!ready.ok()) {
          std::lock_guard<std::mutex> lock(tags_->mu);
          const auto it = tags_->map.find(tag);
          if (it != tags_->map.end() && it->second.serial == serial) tags_->map.erase(it);
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
    std::lock_guard<std::mutex> lock(tags_->mu);
    const auto it = tags_->map.find(tag);
    if (it == tags_->map.end() || it->second.serial != serial) {
      // The open failed meanwhile (its ready callback freed the tag).
    } else if (!opened.ok()) {
      tags_->map.erase(it);
    } else {
      it->second.id = *opened;  // Still there: the open has not failed meanwhile.
    }
  }
  if (!opened.ok()) fail(opened.status());
}

void DecodeStreamReactor::StartSteps(const v1::DecodeRequest& message,
                                     const std::shared_ptr<Pending>& pending) {
  std::vector<decoding::StepRequest> steps;
  std::vector<int> indices;  // The message's index of each of `steps`.
  steps.reserve(message.steps_size());
  for (int i = 0; i < message.steps_size(); ++i) {
    absl::StatusOr<decoding::StepRequest> step = PrepareStep(message, i, pending);
    if (!step.ok()) {
      FailStep(i, step.status(), pending);
      continue;
    }
    steps.push_back(*std::move(step));
    indices.push_back(i);
  }
  std::vector<decoding::StepRequest*> requests;
  for (decoding::StepRequest& step : steps) requests.push_back(&step);
  // All at once: the message's steps then share an iteration.
  const std::vector<absl::Status> appended = runtime_->AppendAll(requests);
  for (size_t j = 0; j < appended.size(); ++j) {
    if (!appended[j].ok()) FailStep(indices[j], appended[j], pending);
  }
}

absl::StatusOr<decoding::StepRequest> DecodeStreamReactor::PrepareStep(
    const v1::DecodeRequest& message, int index, const std::shared_ptr<Pending>& pending) {
  absl::StatusOr<DecodeStreamSession> session;
  {
    std::lock_guard<std::mutex> lock(tags_->mu);
    session = FindDecodeSession(message, "steps", index, tags_->map);
  }
  if (!session.ok()) return session.status();
  absl::StatusOr<decoding::StepRequest> step = ParseDecodeStep(message, index, *session);
  if (!step.ok()) return step.status();
  const DecodeOutputFormat format = DecodeStepOutputFormat(message, index);
  const int64_t d_model = session->model->config.attention.d_model;
  step->done = [this, pending, index, format, d_model](absl::StatusOr<std::vector<float>> output) {
    {
      std::lock_guard<std::mutex> lock(pending->mu);
      if (output.ok()) {
        // Kept as computed: the answer's encoder writes the rows once, in their wire format.
        pending->outputs[static_cast<size_t>(index)] =
            DecodeStepOutput{.rows = *std::move(output), .d_model = d_model, .format = format};
      } else {
        FillDecodeError(output.status(), pending->response.mutable_steps(index)->mutable_error());
      }
    }
    ItemDone(pending);
  };
  return step;
}

void DecodeStreamReactor::FailStep(int index, const absl::Status& status,
                                   const std::shared_ptr<Pending>& pending) {
  {
    std::lock_guard<std::mutex> lock(pending->mu);
    FillDecodeError(status, pending->response.mutable_steps(index)->mutable_error());
  }
  ItemDone(pending);
}

void DecodeStreamReactor::StartClose(const v1::DecodeRequest& message, int index,
                                     const std::shared_ptr<Pending>& pending) {
  absl::StatusOr<DecodeStreamSession> session;
  {
    // The tag is free at once (a later message may reuse it); the session closes once this
    // message's steps are answered.
    std::lock_guard<std::mutex> lock(tags_->mu);
    const std::string& tag = message.closes(index).session();
    if (const auto it = tags_->map.find(tag); it != tags_->map.end() && it->second.closed) {
      tags_->map.erase(it);  // The server closed it already: nothing left to do but free the tag.
      return;
    }
    session = FindDecodeSession(message, "closes", index, tags_->map);
    if (session.ok()) tags_->map.erase(tag);
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
  pending->meter.Record(CodeOf(pending->response));
  QueueAnswer(pending->response, pending->outputs, pending->reserved_bytes);
}

void DecodeStreamReactor::Tags::MarkClosed(const std::string& tag, uint64_t serial,
                                           decoding::CloseReason reason) {
  std::lock_guard<std::mutex> lock(mu);
  const auto it = map.find(tag);
  if (it == map.end() || it->second.serial != serial) return;  // Closed by the client, or reused.
  it->second = DecodeStreamSession{.id = 0, .model = nullptr, .serial = serial, .closed = reason};
  closed_order.emplace_back(tag, serial);
  closed_bytes += static_cast<int64_t>(tag.size());
  // Kept for a step that comes late, to tell it why; the oldest go first past the bound.
  while (closed_order.size() > kMaxClosedTags || closed_bytes > kMaxClosedTagBytes) {
    const auto& [old_tag, old_serial] = closed_order.front();
    const auto old = map.find(old_tag);
    if (old != map.end() && old->second.serial == old_serial && old->second.closed) map.erase(old);
    closed_bytes -= static_cast<int64_t>(old_tag.size());
    closed_order.pop_front();
  }
}

void DecodeStreamReactor::QueueAnswer(const v1::DecodeResponse& response,
                                      std::span<const std::optional<DecodeStepOutput>> outputs,
                                      int64_t reserved_bytes) {
  Answer(Serialized(response, outputs), reserved_bytes);
}

void DecodeStreamReactor::OnClientGone() {
  // Its sessions' queued steps are answered CANCELLED at once instead of computed for nobody.
  runtime_->CloseOwner(owner_);
}

void DecodeStreamReactor::OnCancel() {
  // Cancelled, or the connection dropped: free the cache now, and have queued steps answered
  // (CANCELLED) so the call can finish without waiting for compute nobody will read.
  runtime_->CloseOwner(owner_);
}

void DecodeStreamReactor::OnStreamDone() { runtime_->CloseOwner(owner_); }

}  // namespace attnserve::server
