#include "server/service/attend_submitter.h"

#include <grpc/support/time.h>

#include <chrono>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/conversion/attnserve_v1/conversion.h"
#include "spdlog/spdlog.h"

namespace attnserve::server {

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

AttendSubmitter::AttendSubmitter(const ModelRouter* router, batching::Clock* clock,
                                 OpenCalls* open_calls, metrics::ServerMetrics* metrics)
    : router_(router), clock_(clock), metrics_(metrics), drain_gate_(open_calls) {}

RequestMeter AttendSubmitter::StartMeter(metrics::Method method,
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

int64_t AttendSubmitter::DeadlineMicros(const grpc::CallbackServerContext& context) const {
  // From the raw deadline: gRPC's system_clock deadline() wraps past 2262 (int64 nanoseconds
  // since 1970), turning a grpc-timeout of centuries into one already expired.
  const gpr_timespec deadline = context.raw_deadline();
  constexpr int64_t kNoDeadline = std::numeric_limits<int64_t>::max();
  if (gpr_time_cmp(deadline, gpr_inf_future(deadline.clock_type)) == 0) return kNoDeadline;
  const gpr_timespec remaining = gpr_time_sub(deadline, gpr_now(deadline.clock_type));
  // Beyond a century the arithmetic below could overflow; nothing waits that long anyway.
  constexpr int64_t kCenturyS = int64_t{100} * 366 * 86400;
  if (remaining.tv_sec > kCenturyS) return kNoDeadline;
  return clock_->NowMicros() + remaining.tv_sec * 1000000 + remaining.tv_nsec / 1000;
}

absl::Status AttendSubmitter::Submit(const v1::AttendRequest& request,
                                     grpc::CallbackServerContext* context,
                                     AttendTask::DoneCallback done, int64_t* response_bytes) {
  if (draining()) {
    return DrainingError();
  }
  absl::StatusOr<ModelRoute> route = router_->Route(request.model());
  if (!route.ok()) return route.status();
  absl::StatusOr<AttendWork> work = ParseAttendRequest(request, route->model, route->limits);
  if (!work.ok()) return work.status();
  if (response_bytes != nullptr) *response_bytes = work->response_bytes();
  return Schedule(*route, *std::move(work), BoundsOf(context), std::move(done));
}

AttendSubmitter::CallBounds AttendSubmitter::BoundsOf(grpc::CallbackServerContext* context) const {
  return {.deadline_us = DeadlineMicros(*context),
          .cancelled = [context] { return context->IsCancelled(); }};
}

absl::Status AttendSubmitter::SubmitParsed(std::string_view model_name, const ParseFunction& parse,
                                           grpc::CallbackServerContext* context,
                                           AttendTask::DoneCallback done) {
  return SubmitParsed(model_name, parse, BoundsOf(context), std::move(done));
}

absl::Status AttendSubmitter::SubmitParsed(std::string_view model_name, const ParseFunction& parse,
                                           CallBounds bounds, AttendTask::DoneCallback done) {
  if (draining()) {
    return DrainingError();
  }
  absl::StatusOr<ModelRoute> route = router_->Route(model_name);
  if (!route.ok()) return route.status();
  absl::StatusOr<AttendWork> work = parse(*route);
  if (!work.ok()) return work.status();
  return Schedule(*route, *std::move(work), std::move(bounds), std::move(done));
}

absl::Status AttendSubmitter::Schedule(const ModelRoute& route, AttendWork work, CallBounds bounds,
                                       AttendTask::DoneCallback done) {
  // Copied first: once scheduled, the answer may finish the call and free the request.
  const std::string request_id = work.request_id;
  auto task = std::make_unique<AttendTask>(std::move(work), bounds.deadline_us,
                                           std::move(bounds.cancelled), std::move(done));
  absl::Status scheduled = route.queue->Schedule(&task);
  if (!scheduled.ok()) {
    // The queue did not take the task: it must not answer through `done` (the caller answers).
    task->Release();
    return absl::Status(scheduled.code(),
                        absl::StrCat("model \"", route.model->name, "\": ", scheduled.message(),
                                     scheduled.code() == absl::StatusCode::kResourceExhausted
                                         ? "; retry with backoff"
                                         : ""));
  }
  spdlog::debug("queued model={} request_id={}", route.model->name, request_id);
  return absl::OkStatus();
}

}  // namespace attnserve::server
