#include "server/attention_service.h"

#include <chrono>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/happens_before.h"
#include "server/attend_stream_reactor.h"
#include "server/conversion.h"
#include "spdlog/spdlog.h"

namespace attnserve::server {
namespace {

// A unary reactor that deletes itself when the call is done. gRPC's DefaultReactor would serve,
// but its OnDone is gRPC's own, and ThreadSanitizer needs one of ours to see that Finish (often
// on a batch thread) happens before gRPC destroys the call's messages (core/happens_before.h). The
// cost is one small allocation per call.
class UnaryReactor final : public grpc::ServerUnaryReactor {
 public:
  UnaryReactor(OpenCalls* open_calls, RequestMeter meter) : open_calls_(open_calls), meter_(meter) {
    open_calls_->Add();
  }

  // Call exactly once, from any thread. Before the handler has returned the reactor to gRPC,
  // gRPC only records the status (OnDone cannot run yet); after, the reactor may be gone when
  // this returns.
  void FinishCall(const grpc::Status& status) {
    meter_.Record(status.error_code());
    HandOff(this);
    Finish(status);
  }
  void OnDone() override {
    TakeOver(this);
    OpenCalls* open_calls = open_calls_;
    delete this;
    open_calls->Done();
  }

 private:
  OpenCalls* const open_calls_;
  RequestMeter meter_;
};

grpc::ServerUnaryReactor* FinishNow(OpenCalls* open_calls, RequestMeter meter,
                                    const grpc::Status& status) {
  auto* reactor = new UnaryReactor(open_calls, meter);
  reactor->FinishCall(status);
  return reactor;
}

}  // namespace

void LogFailure(std::string_view model, std::string_view request_id, const absl::Status& status) {
  switch (status.code()) {
    // The server's own failures, which an operator must see: compute errors, scratch memory.
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kUnknown:
      spdlog::warn("Attend model={} request_id={} failed: {}", model, request_id,
                   status.ToString());
      break;
    // The caller's doing (deadline, cancellation) or the server draining: routine, and a busy
    // client could flood the log with them.
    default:
      spdlog::debug("Attend model={} request_id={} failed: {}", model, request_id,
                    status.ToString());
  }
}

AttentionService::AttentionService(ModelRouter* router, batching::Clock* clock,
                                   metrics::ServerMetrics* metrics)
    : router_(router), clock_(clock), metrics_(metrics) {}

RequestMeter AttentionService::StartMeter(metrics::Method method,
                                          std::string_view model_name) const {
  if (metrics_ == nullptr) return RequestMeter();
  if (method == metrics::Method::kListModels) {
    return RequestMeter(metrics_, &metrics_->no_model(), method);
  }
  // Requests naming no model are counted under the model that serves them.
  metrics::ModelMetrics& model = model_name.empty()
                                     ? metrics_->ForModel(router_->DefaultModelName())
                                     : metrics_->ForModel(model_name);
  return RequestMeter(metrics_, &model, method);
}

AttentionService::~AttentionService() = default;

int64_t AttentionService::DeadlineMicros(const grpc::CallbackServerContext& context) const {
  const auto deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return std::numeric_limits<int64_t>::max();
  }
  const auto remaining = std::chrono::duration_cast<std::chrono::microseconds>(
      deadline - std::chrono::system_clock::now());
  return clock_->NowMicros() + remaining.count();
}

absl::Status AttentionService::Submit(const v1::AttendRequest& request,
                                      grpc::CallbackServerContext* context,
                                      AttendTask::DoneCallback done) {
  if (draining()) {
    return absl::UnavailableError("the server is shutting down and accepts no new requests");
  }
  absl::StatusOr<ModelRoute> route = router_->Route(request.model());
  if (!route.ok()) return route.status();
  absl::StatusOr<AttendWork> work = ParseAttendRequest(request, route->model, route->limits);
  if (!work.ok()) return work.status();
  auto task = std::make_unique<AttendTask>(
      *std::move(work), DeadlineMicros(*context), [context] { return context->IsCancelled(); },
      std::move(done));
  const std::string request_id = request.request_id();
  absl::Status scheduled = route->batcher->Schedule(&task);
  if (!scheduled.ok()) {
    // The batcher did not take the task: it must not answer through `done` (the caller answers).
    task->Release();
    return absl::Status(scheduled.code(),
                        absl::StrCat("model \"", route->model->name, "\": ", scheduled.message(),
                                     scheduled.code() == absl::StatusCode::kResourceExhausted
                                         ? "; retry with backoff"
                                         : ""));
  }
  spdlog::debug("queued model={} request_id={}", route->model->name, request_id);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* AttentionService::Attend(grpc::CallbackServerContext* context,
                                                   const v1::AttendRequest* request,
                                                   v1::AttendResponse* response) {
  auto* reactor =
      new UnaryReactor(&open_calls_, StartMeter(metrics::Method::kAttend, request->model()));
  absl::Status scheduled = Submit(
      *request, context,
      [reactor, response](const AttendWork& work, absl::StatusOr<AttendResult> result) {
        if (!result.ok()) {
          LogFailure(work.model->name, work.request_id, result.status());
          reactor->FinishCall(ToGrpcStatus(result.status()));
          return;
        }
        spdlog::debug(
            "Attend model={} request_id={} sequences={} tokens={} queue_us={} "
            "compute_us={} batch_sequences={}",
            work.model->name, work.request_id, work.sequences(), work.tokens(),
            result->timing.queue_us, result->timing.compute_us, result->timing.batch_sequences);
        reactor->FinishCall(ToGrpcStatus(FillAttendResponse(work, *result, response)));
      });
  if (!scheduled.ok()) {
    spdlog::debug("Attend model={} request_id={} rejected: {}", request->model(),
                  request->request_id(), scheduled.ToString());
    reactor->FinishCall(ToGrpcStatus(scheduled));
  }
  return reactor;
}

grpc::ServerBidiReactor<v1::AttendRequest, v1::AttendResponse>* AttentionService::AttendStream(
    grpc::CallbackServerContext* context) {
  return new AttendStreamReactor(this, context);
}

grpc::ServerUnaryReactor* AttentionService::ListModels(grpc::CallbackServerContext* /*context*/,
                                                       const v1::ListModelsRequest* /*request*/,
                                                       v1::ListModelsResponse* response) {
  const RequestMeter meter = StartMeter(metrics::Method::kListModels, "");
  for (const ModelRouter::ModelDescription& description : router_->Describe()) {
    FillModelInfo(*description.model, description.limits, description.is_default,
                  response->add_models());
  }
  return FinishNow(&open_calls_, meter, grpc::Status::OK);
}

grpc::ServerUnaryReactor* AttentionService::GetModel(grpc::CallbackServerContext* /*context*/,
                                                     const v1::GetModelRequest* request,
                                                     v1::ModelInfo* response) {
  const RequestMeter meter = StartMeter(metrics::Method::kGetModel, request->name());
  absl::StatusOr<ModelRouter::ModelDescription> description = router_->Describe(request->name());
  if (!description.ok()) {
    return FinishNow(&open_calls_, meter, ToGrpcStatus(description.status()));
  }
  FillModelInfo(*description->model, description->limits, description->is_default, response);
  return FinishNow(&open_calls_, meter, grpc::Status::OK);
}

void AttentionService::BeginDrain() {
  draining_.store(true, std::memory_order_release);
  std::vector<AttendStreamReactor*> to_finish;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    for (AttendStreamReactor* stream : streams_) {
      if (stream->PrepareDrain()) to_finish.push_back(stream);
    }
  }
  // Outside streams_mu_: finishing may run OnDone, which unregisters.
  for (AttendStreamReactor* stream : to_finish) stream->FinishDrained();
}

void AttentionService::RegisterStream(AttendStreamReactor* stream) {
  open_calls_.Add();
  std::lock_guard<std::mutex> lock(streams_mu_);
  streams_.insert(stream);
}

int AttentionService::OpenStreams() {
  std::lock_guard<std::mutex> lock(streams_mu_);
  return static_cast<int>(streams_.size());
}

void AttentionService::UnregisterStream(AttendStreamReactor* stream) {
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    streams_.erase(stream);
  }
  open_calls_.Done();
}

}  // namespace attnserve::server
