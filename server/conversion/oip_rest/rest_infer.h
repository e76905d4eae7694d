// RestInfer: one REST infer on its way through the runtime, for the HTTP edge (server/http/),
// which sees no protocol messages: the body parsed (rest_conversion.h), the work for the model it
// was routed to (oip::ParseModelInferRequest, exactly as gRPC's ModelInfer), and the answer in
// REST form. Also the metadata endpoints' bodies.
//
// Not thread-safe: one call at a time (Answer may run on another thread than Parse and Body,
// between them).
#ifndef ATTNSERVE_SERVER_CONVERSION_OIP_REST_REST_INFER_H_
#define ATTNSERVE_SERVER_CONVERSION_OIP_REST_REST_INFER_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/model/model.h"
#include "server/conversion/oip_rest/rest_conversion.h"
#include "server/runtime/attend_work.h"
#include "server/runtime/model_router.h"

namespace attnserve::server::oip_rest {

class RestInfer {
 public:
  // Parses `body` for the model and version of the URL; `header_length` is the
  // Inference-Header-Content-Length header (null when absent). Errors as ParseInferRequest's
  // and ParseHeaderLength's.
  static absl::StatusOr<std::unique_ptr<RestInfer>> Parse(std::string_view model_name,
                                                          std::string_view version,
                                                          std::string_view body,
                                                          const std::string* header_length);
  ~RestInfer();
  RestInfer(const RestInfer&) = delete;
  RestInfer& operator=(const RestInfer&) = delete;

  // The work for `route`'s model: oip::ParseModelInferRequest's checks and errors. Moves the
  // tensors' data: call once.
  absl::StatusOr<AttendWork> ToWork(const ModelRoute& route);
  // Keeps `result`, the answer to `work`, in the protocol's response form (the tensors' bytes
  // copied, nothing formatted): what a batch thread does. Internal if it does not fit the work.
  // Call once, after ToWork.
  absl::Status Answer(const AttendWork& work, const AttendResult& result);
  // The kept answer's body (JSON numbers are formatted here: ~25 ns each, which the HTTP thread
  // waiting for the answer spends rather than the batch thread). Call after Answer succeeded.
  absl::StatusOr<RestBody> Body() const;
  // The request's id ("" when none).
  const std::string& id() const;

 private:
  struct Impl;
  explicit RestInfer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// GET /v2's body, with the extensions this binding implements.
std::string ServerMetadataBody(std::string_view name, std::string_view version);
// GET /v2/models/{name}'s body.
std::string ModelMetadataBody(const model::Model& model);
// GET /v2/models/{name}/ready's body: {"name", "ready"}.
std::string ModelReadyBody(std::string_view name, bool ready);

}  // namespace attnserve::server::oip_rest

#endif  // ATTNSERVE_SERVER_CONVERSION_OIP_REST_REST_INFER_H_
