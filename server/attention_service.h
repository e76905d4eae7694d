// AttentionService: the gRPC handlers of attnserve.v1.AttentionService (callback API).
//
// Handlers validate a request (conversion.h), schedule it in its model's batcher and return; the
// batch runner answers later from a batcher thread. No handler blocks, and every RPC is finished
// exactly once: by the handler on a validation or scheduling error, otherwise by its task
// (AttendTask guarantees one answer, even when the batcher drops it). AttendStream messages are
// scheduled one by one the same way (attend_stream_reactor.h).
//
// Thread-safe. The router must outlive the service.
#ifndef ATTNSERVE_SERVER_ATTENTION_SERVICE_H_
#define ATTNSERVE_SERVER_ATTENTION_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "attnserve/v1/attention.grpc.pb.h"
#include "server/attend_task.h"
#include "server/metrics/server_metrics.h"
#include "server/model_router.h"
#include "server/open_calls.h"
#include "server/request_meter.h"

namespace attnserve::server {

class AttendStreamReactor;

// Logs a request that was accepted but failed: at warn level when the server is at fault
// (Internal, OutOfRange from compute, ResourceExhausted from scratch memory), at debug level
// otherwise (deadline, cancellation, shutdown).
void LogFailure(std::string_view model, std::string_view request_id, const absl::Status& status);

class AttentionService final : public v1::AttentionService::CallbackService {
 public:
  // `clock` must be the batchers' clock (deadlines are converted onto its time line).
  // `metrics` (not owned; null = none) must outlive the service.
  explicit AttentionService(ModelRouter* router,
                            batching::Clock* clock = batching::RealClock::Default(),
                            metrics::ServerMetrics* metrics = nullptr);
  ~AttentionService() override;

  grpc::ServerUnaryReactor* Attend(grpc::CallbackServerContext* context,
                                   const v1::AttendRequest* request,
                                   v1::AttendResponse* response) override;
  grpc::ServerBidiReactor<v1::AttendRequest, v1::AttendResponse>* AttendStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* GetModel(grpc::CallbackServerContext* context,
                                     const v1::GetModelRequest* request,
                                     v1::ModelInfo* response) override;

  // Validates `request` and schedules it. On OK, `done` is called exactly once later (on a
  // batcher thread) with the answer; on error `done` is never called and the error names the
  // field. Unavailable once draining.
  absl::Status Submit(const v1::AttendRequest& request, grpc::CallbackServerContext* context,
                      AttendTask::DoneCallback done);

  // Refuses new requests (Unavailable) and lets open streams finish once their accepted
  // messages are answered. Requests already accepted are still computed and answered.
  void BeginDrain();
  bool draining() const { return draining_.load(std::memory_order_acquire); }

  // Open streams register so BeginDrain can close them (attend_stream_reactor.h).
  void RegisterStream(AttendStreamReactor* stream);
  void UnregisterStream(AttendStreamReactor* stream);
  // AttendStream calls not yet finished.
  int OpenStreams();
  // Every call of this service that gRPC has not completed yet (unary and streams).
  OpenCalls& open_calls() { return open_calls_; }

  // Starts timing a request for `model_name` as sent ("" = the default model).
  RequestMeter StartMeter(metrics::Method method, std::string_view model_name) const;

 private:
  // The deadline of `context` on the batcher clock (INT64_MAX when none).
  int64_t DeadlineMicros(const grpc::CallbackServerContext& context) const;

  ModelRouter* const router_;
  batching::Clock* const clock_;
  metrics::ServerMetrics* const metrics_;
  std::atomic<bool> draining_{false};
  OpenCalls open_calls_;
  std::mutex streams_mu_;
  absl::flat_hash_set<AttendStreamReactor*> streams_ ABSL_GUARDED_BY(streams_mu_);
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_ATTENTION_SERVICE_H_
