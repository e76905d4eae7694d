// The client's one place where the Open Inference Protocol's messages meet its public types
// (infer_client.h), beside conversion.h for attnserve.v1.
#ifndef ATTNSERVE_CLIENT_SRC_INFER_CONVERSION_H_
#define ATTNSERVE_CLIENT_SRC_INFER_CONVERSION_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "attnserve/client/infer_client.h"
#include "inference/grpc_predict_v2.pb.h"

namespace attnserve::client::internal {

// The request for `input` (tensor `input`, FP32, raw_input_contents) and `options` (parameter
// `causal` when masked). InvalidArgument naming `input` when its data does not hold
// product(shape) elements.
absl::StatusOr<inference::ModelInferRequest> MakeModelInferRequest(std::string_view model,
                                                                   TensorView input,
                                                                   const InferOptions& options);

// The result carried by `response`: its `output` (raw or fp32_contents) and the timing
// parameters it has. Internal for an answer without a well-formed FP32 `output` (its shape's
// size checked without overflow against the data that came: never an exception).
absl::StatusOr<InferResult> ReadModelInferResponse(const inference::ModelInferResponse& response);

}  // namespace attnserve::client::internal

#endif  // ATTNSERVE_CLIENT_SRC_INFER_CONVERSION_H_
