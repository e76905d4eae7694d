#include "server/http/rest_service.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/util/echo.h"
#include "server/conversion/grpc_status.h"
#include "server/conversion/oip_rest/rest_infer.h"
#include "spdlog/spdlog.h"

namespace attnserve::server::http {
namespace {

HttpReply JsonReply(int status, std::string body) {
  return HttpReply{.status = status, .body = std::move(body)};
}

// An infer's answer, handed from the batch thread that computes it to the waiting HTTP worker.
class Completion {
 public:
  void Set(HttpReply reply, const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    reply_ = std::move(reply);
    status_ = status;
    done_ = true;
    cv_.notify_one();
  }
  // The reply, and the status it is counted under in the metrics.
  std::pair<HttpReply, absl::Status> Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
    return {std::move(reply_), status_};
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  HttpReply reply_;
  absl::Status status_;
};

// Counts one call in open_calls for as long as it lives.
class OpenCall {
 public:
  explicit OpenCall(OpenCalls* calls) : calls_(calls) { calls_->Add(); }
  ~OpenCall() { calls_->Done(); }
  OpenCall(const OpenCall&) = delete;
  OpenCall& operator=(const OpenCall&) = delete;

 private:
  OpenCalls* const calls_;
};

// The gRPC code an HTTP reply is counted under in the metrics (their `code` label).
grpc::StatusCode MeteredCode(const absl::Status& status) {
  return ToGrpcStatus(status).error_code();
}

// The route of model `name` when `version` is "" or its serving version; NotFound otherwise.
absl::StatusOr<ModelRoute> ServingRoute(const ModelRouter& router, std::string_view name,
                                        std::string_view version) {
  absl::StatusOr<ModelRoute> route = router.Route(name);
  if (!route.ok() || version.empty() || version == absl::StrCat(route->model->version)) {
    return route;
  }
  return absl::NotFoundError(absl::StrCat("version: expected \"", route->model->version,
                                          "\" (the serving version of model \"", route->model->name,
                                          "\"), got \"", EchoForMessage(version), "\""));
}

}  // namespace

HttpReply ErrorReply(const absl::Status& status) {
  return JsonReply(oip_rest::HttpStatusOf(status.code()),
                   oip_rest::ErrorJson(std::string(status.message())));
}

RestService::RestService(AttendSubmitter* submitter, OpenCalls* open_calls,
                         InferenceServerIdentity identity)
    : submitter_(submitter), open_calls_(open_calls), identity_(std::move(identity)) {}

HttpReply RestService::Live() const { return JsonReply(200, "{\"live\":true}"); }

HttpReply RestService::Ready() const {
  const bool ready = !submitter_->draining() && !submitter_->router().Routes().empty();
  return JsonReply(ready ? 200 : 503, absl::StrCat("{\"ready\":", ready ? "true" : "false", "}"));
}

HttpReply RestService::ServerMetadata() const {
  return JsonReply(200, oip_rest::ServerMetadataBody(identity_.name, identity_.version));
}

HttpReply RestService::ModelMetadata(std::string_view name, std::string_view version) const {
  absl::StatusOr<ModelRoute> route = ServingRoute(submitter_->router(), name, version);
  if (!route.ok()) return ErrorReply(route.status());
  return JsonReply(200, oip_rest::ModelMetadataBody(*route->model));
}

HttpReply RestService::ModelReady(std::string_view name, std::string_view version) const {
  absl::StatusOr<ModelRoute> route = ServingRoute(submitter_->router(), name, version);
  if (!route.ok()) return ErrorReply(route.status());
  const bool ready = !submitter_->draining();
  return JsonReply(ready ? 200 : 503, oip_rest::ModelReadyBody(route->model->name, ready));
}

HttpReply RestService::Infer(std::string_view name, std::string_view version, std::string_view body,
                             const std::string* header_length) {
  OpenCall open_call(open_calls_);
  RequestMeter meter = submitter_->StartMeter(metrics::Method::kRestInfer, name);
  const auto fail = [&meter](const absl::Status& status) {
    meter.Record(MeteredCode(status));
    return ErrorReply(status);
  };
  absl::StatusOr<std::unique_ptr<oip_rest::RestInfer>> parsed =
      oip_rest::RestInfer::Parse(name, version, body, header_length);
  if (!parsed.ok()) return fail(parsed.status());
  // Shared with the answer, which runs on a batch thread.
  std::shared_ptr<oip_rest::RestInfer> infer = *std::move(parsed);
  const auto to_work = [&infer](const ModelRoute& route) { return infer->ToWork(route); };
  auto completion = std::make_shared<Completion>();
  absl::Status scheduled = submitter_->SubmitParsed(
      name, to_work, AttendSubmitter::CallBounds{},
      [completion, infer](const AttendWork& work, absl::StatusOr<AttendResult> result) {
        if (!result.ok()) {
          LogFailure(work.model->name, work.request_id, result.status());
          completion->Set(ErrorReply(result.status()), result.status());
          return;
        }
        // The body is written by this call's thread, after Wait: not on the batch thread.
        const absl::Status answered = infer->Answer(work, *result);
        completion->Set(answered.ok() ? HttpReply{} : ErrorReply(answered), answered);
      });
  if (!scheduled.ok()) {
    spdlog::debug("REST infer model={} id={} rejected: {}", EchoForMessage(name),
                  EchoForMessage(infer->id()), scheduled.ToString());
    return fail(scheduled);
  }
  auto [reply, status] = completion->Wait();
  if (status.ok()) {
    absl::StatusOr<oip_rest::RestBody> answer = infer->Body();
    if (!answer.ok()) return fail(answer.status());
    reply = {.body = std::move(answer->bytes), .json_length = answer->json_length};
    if (reply.json_length) reply.content_type = "application/octet-stream";
  }
  meter.Record(MeteredCode(status));
  return std::move(reply);
}

}  // namespace attnserve::server::http
