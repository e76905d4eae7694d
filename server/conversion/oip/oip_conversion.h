// Conversion for the Open Inference Protocol (KServe v2, inference/grpc_predict_v2.proto): the
// one place where its messages meet the runtime's types, beside attnserve_v1/ for attnserve.v1.
//
// A ModelInferRequest maps onto an Attend call: input tensors by name (`input` FP32 [B, T, d] or
// [T, d], optional `memory` FP32, `lengths` / `memory_lengths` INT32 [B], `attn_mask` BOOL or
// UINT8 [B, T, S] or [T, S]) and request parameters (`causal` bool, `head_mask` string of 0/1
// per head, `return_weights` bool). The protocol's own checks (names, datatypes, shapes against
// the data, parameters) are made here; the attention checks (d_model, lengths, limits, finite
// values) are attnserve.v1's, shared through ParseAttendRequest so both protocols accept and
// refuse exactly the same requests, with messages naming the same tensors.
//
// Pure functions: thread-safe as long as no other thread touches the same messages.
#ifndef ATTNSERVE_SERVER_CONVERSION_OIP_OIP_CONVERSION_H_
#define ATTNSERVE_SERVER_CONVERSION_OIP_OIP_CONVERSION_H_

#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model/model.h"
#include "inference/grpc_predict_v2.pb.h"
#include "server/runtime/attend_work.h"
#include "server/runtime/model_limits.h"

namespace attnserve::server::oip {

// The model platform ModelMetadata reports.
inline constexpr std::string_view kPlatform = "attnserve_onednn";

// Which outputs an answer holds and how, decided from the request.
struct InferAnswer {
  bool output = true;    // `output` is in the answer
  bool weights = false;  // `weights` is in the answer
  bool raw = false;      // in raw_output_contents (the request used raw_input_contents)
};

// Validates `request` against `model` and `limits` and returns its AttendWork; *answer says what
// the response must hold. The tensors' data is moved out of `request` (call once per request).
//
// InvalidArgument naming the tensor (`inputs["attn_mask"]`), parameter (`parameters["causal"]`)
// or field, the expected and the received value, for anything malformed: unknown or repeated
// tensor names, a datatype other than the tensor's, data that does not match the shape, a model
// version other than the serving one, unknown outputs or parameters, and everything
// ParseAttendRequest refuses. Internal if `model` is null.
absl::StatusOr<AttendWork> ParseModelInferRequest(inference::ModelInferRequest* request,
                                                  std::shared_ptr<const model::Model> model,
                                                  const ModelLimits& limits, InferAnswer* answer);

// Writes `result`, the answer to `work`, into `response` as `answer` asks: the outputs in order
// `output`, `weights`, FP32, in the request's shape (padding zero); model_name, model_version, id
// and the queue_us / compute_us / batch_sequences parameters. Internal (response unspecified) if
// `result` does not fit `work`.
absl::Status FillModelInferResponse(const AttendWork& work, const AttendResult& result,
                                    const InferAnswer& answer,
                                    inference::ModelInferResponse* response);

// Describes `model`'s inputs and outputs (-1 for variable dims; the batched form), its version
// and platform into `response` (overwritten). Cannot fail.
void FillModelMetadata(const model::Model& model, inference::ModelMetadataResponse* response);

}  // namespace attnserve::server::oip

#endif  // ATTNSERVE_SERVER_CONVERSION_OIP_OIP_CONVERSION_H_
