// AttendSubmitter: the request path that unary Attend and every AttendStream message share:
// route the request to its model, validate it (conversion), and schedule it in the model's batch
// queue; plus the metering and failure logging around it, and the drain switch that turns new
// calls of both protocols away (drain_gate.h).
//
// Thread-safe. The router, open calls and metrics (null = none) must outlive the submitter.
#ifndef ATTNSERVE_SERVER_SERVICE_ATTEND_SUBMITTER_H_
#define ATTNSERVE_SERVER_SERVICE_ATTEND_SUBMITTER_H_

#include <grpcpp/server_context.h>

#include <cstdint>
#include <functional>
#include <string_view>

#include "absl/status/status.h"
#include "attnserve/v1/attention.pb.h"
#include "server/batching/clock.h"
#include "server/metrics/server_metrics.h"
#include "server/runtime/attend_task.h"
#include "server/runtime/model_router.h"
#include "server/service/drain_gate.h"
#include "server/service/open_calls.h"
#include "server/service/request_meter.h"

namespace attnserve::server {

// Logs a request that was accepted but failed: at warn level when the server is at fault
// (Internal, OutOfRange from compute, ResourceExhausted from scratch memory), at debug level
// otherwise (deadline, cancellation, shutdown).
void LogFailure(std::string_view model, std::string_view request_id, const absl::Status& status);

class AttendSubmitter {
 public:
  // `clock` must be the batch scheduler's (deadlines are converted onto its time line).
  // `open_calls` counts the refusals the drain holds.
  AttendSubmitter(const ModelRouter* router, batching::Clock* clock, OpenCalls* open_calls,
                  metrics::ServerMetrics* metrics);
  AttendSubmitter(const AttendSubmitter&) = delete;
  AttendSubmitter& operator=(const AttendSubmitter&) = delete;

  // Validates `request` and schedules it. On OK, `done` is called exactly once later (on a batch
  // thread) with the answer, and *response_bytes (when not null) holds the size of the answer's
  // payload (AttendWork::response_bytes); on error `done` is never called and the error names
  // the field. Unavailable once draining.
  absl::Status Submit(const v1::AttendRequest& request, grpc::CallbackServerContext* context,
                      AttendTask::DoneCallback done, int64_t* response_bytes = nullptr);

  // Turns a request of another wire protocol into an AttendWork for the model it was routed to.
  using ParseFunction = std::function<absl::StatusOr<AttendWork>(const ModelRoute& route)>;
  // As Submit, for any wire protocol: routes `model_name` ("" = the default model), validates
  // with `parse`, and schedules the work in the same queue as Submit's.
  absl::Status SubmitParsed(std::string_view model_name, const ParseFunction& parse,
                            grpc::CallbackServerContext* context, AttendTask::DoneCallback done);

  // A call's bounds, for protocols without a gRPC context (REST): its deadline on the scheduler
  // clock (INT64_MAX = none) and whether the caller has gone.
  struct CallBounds {
    int64_t deadline_us = INT64_MAX;
    AttendTask::CancelledCheck cancelled = [] { return false; };
  };
  // As SubmitParsed with a context, for a call bounded by `bounds`.
  absl::Status SubmitParsed(std::string_view model_name, const ParseFunction& parse,
                            CallBounds bounds, AttendTask::DoneCallback done);

  // Starts timing a request for `model_name` as sent ("" = the default model).
  RequestMeter StartMeter(metrics::Method method, std::string_view model_name) const;

  // From now on Submit refuses every request with Unavailable (DrainingError), and handlers hold
  // their refusals with HoldIfDraining. Requests already accepted are still computed and
  // answered.
  void BeginDrain() { drain_gate_.Close(); }
  bool draining() const { return drain_gate_.draining(); }
  // A handler's first step for a new call: while draining, holds `refusal` (which answers the
  // call with the status it is given) until ReleaseRefusals, and returns true; the handler then
  // only returns its reactor. Serving: false, `refusal` unused.
  bool HoldIfDraining(DrainGate::Refusal& refusal) { return drain_gate_.HoldIfDraining(refusal); }
  // Answers every held refusal UNAVAILABLE, and from now on each at once. The drain calls it
  // once gRPC has sent GOAWAY.
  void ReleaseRefusals() { drain_gate_.Release(); }

  const ModelRouter& router() const { return *router_; }

 private:
  // Schedules validated `work` in `route`'s queue (shared tail of Submit and SubmitParsed).
  absl::Status Schedule(const ModelRoute& route, AttendWork work, CallBounds bounds,
                        AttendTask::DoneCallback done);
  // The bounds of a gRPC call.
  CallBounds BoundsOf(grpc::CallbackServerContext* context) const;
  // The deadline of `context` on the scheduler clock (INT64_MAX when none).
  int64_t DeadlineMicros(const grpc::CallbackServerContext& context) const;

  const ModelRouter* const router_;
  batching::Clock* const clock_;
  metrics::ServerMetrics* const metrics_;
  DrainGate drain_gate_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVICE_ATTEND_SUBMITTER_H_
