// AttentionService: the gRPC handlers of attnserve.v1.AttentionService (callback API).
//
// Handlers hand a request to the AttendSubmitter (route, validate, schedule in its model's batch
// queue) and return; the batch runner answers later from a batch thread. No handler blocks, and
// every RPC is finished exactly once: by the handler on a validation or scheduling error,
// otherwise by its task (AttendTask guarantees one answer, even when the queue drops it).
// AttendStream messages are submitted one by one the same way (attend_stream_reactor.h).
//
// Thread-safe. The router must outlive the service.
#ifndef ATTNSERVE_SERVER_SERVICE_ATTENTION_SERVICE_H_
#define ATTNSERVE_SERVER_SERVICE_ATTENTION_SERVICE_H_

#include <atomic>

#include "attnserve/v1/attention.grpc.pb.h"
#include "server/batching/clock.h"
#include "server/decoding/decode_runtime.h"
#include "server/metrics/server_metrics.h"
#include "server/runtime/model_router.h"
#include "server/service/attend_submitter.h"
#include "server/service/open_calls.h"
#include "server/service/stream_registry.h"

namespace attnserve::server {

// Attend, AttendStream and Decode take raw bytes (parsed in wire_messages.h, so an unparseable
// message is answered, not dropped by gRPC); ListModels and GetModel stay typed.
using AttentionServiceBase = v1::AttentionService::WithRawCallbackMethod_Attend<
    v1::AttentionService::WithRawCallbackMethod_AttendStream<
        v1::AttentionService::WithRawCallbackMethod_Decode<
            v1::AttentionService::WithCallbackMethod_ListModels<
                v1::AttentionService::WithCallbackMethod_GetModel<
                    v1::AttentionService::Service>>>>>;

class AttentionService final : public AttentionServiceBase {
 public:
  // `clock` must be the batch scheduler's (deadlines are converted onto its time line).
  // `metrics` (not owned; null = none) must outlive the service. Each AttendStream (and Decode
  // stream) holds at most `max_stream_unsent_bytes` (>= 1) of answers its client has not read, plus
  // one, and all of them together `max_streams_unsent_bytes` (>= 1) plus one each
  // (attend_stream_reactor.h).
  explicit AttentionService(const ModelRouter* router,
                            batching::Clock* clock = batching::RealClock::Default(),
                            metrics::ServerMetrics* metrics = nullptr,
                            int64_t max_stream_unsent_bytes = int64_t{64} << 20,
                            int64_t max_streams_unsent_bytes = int64_t{256} << 20);
  ~AttentionService() override;

  grpc::ServerUnaryReactor* Attend(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* AttendStream(
      grpc::CallbackServerContext* context) override;
  // Decoding sessions (decode_stream_reactor.h); UNIMPLEMENTED until EnableDecoding.
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Decode(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* GetModel(grpc::CallbackServerContext* context,
                                     const v1::GetModelRequest* request,
                                     v1::ModelInfo* response) override;

  // Serves Decode on `runtime` (not owned; must outlive the service's calls: the gRPC server is
  // shut down first). Call before the server starts; without it Decode is UNIMPLEMENTED.
  void EnableDecoding(decoding::DecodeRuntime* runtime) { decode_runtime_ = runtime; }

  // Refuses new calls (Unavailable, held until ReleaseRefusals) and lets open streams finish
  // once their accepted messages are answered. Requests already accepted are still computed and
  // answered.
  void BeginDrain();
  // Answers the refusals BeginDrain held (call once gRPC has sent GOAWAY), and every later one at
  // once.
  void ReleaseRefusals() { submitter_.ReleaseRefusals(); }
  bool draining() const { return submitter_.draining(); }

  // AttendStream and Decode calls not yet finished.
  int OpenStreams() { return streams_.Count(); }
  // Bytes of answers (computed, or reserved while computing) all streams hold for their clients.
  int64_t StreamUnsentBytes() const { return streams_.UnsentBytes(); }
  // Every call of this service that gRPC has not completed yet (unary and streams).
  OpenCalls& open_calls() { return open_calls_; }
  // The request path, shared with the Open Inference Protocol's service (inference_service.h) so
  // that both protocols use the same queues, limits, metrics and drain.
  AttendSubmitter& submitter() { return submitter_; }

 private:
  // A stream opened while draining: its refusal held (drain_gate.h).
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* HoldStream();

  OpenCalls open_calls_;  // First: the registry counts into it.
  AttendSubmitter submitter_;
  StreamRegistry streams_;
  const int64_t max_stream_unsent_bytes_;
  decoding::DecodeRuntime* decode_runtime_ = nullptr;
  std::atomic<decoding::OwnerKey> next_decode_owner_{1};  // One owner key per Decode stream.
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVICE_ATTENTION_SERVICE_H_
