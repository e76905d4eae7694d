// Conversion: the one place where the attnserve.v1 protobuf API (attnserve/v1/attention.proto)
// meets the runtime's types. A second wire protocol gets a sibling folder of its own.
//
// ParseAttendRequest validates every field of an AttendRequest against a model and the limits in
// force and packs it into an AttendWork (padding removed); FillAttendResponse pads an AttendResult
// back to the request's shape. FillModelInfo and FillErrorResponse cover the rest. Past this
// folder the server works only on runtime and core types, and nothing in core sees a protobuf.
//
// Every function is a pure function of its arguments: thread-safe as long as no other thread
// mutates the same output message concurrently.
#ifndef ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_CONVERSION_H_
#define ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_CONVERSION_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnserve/v1/attention.pb.h"
#include "core/model/model.h"
#include "server/runtime/attend_work.h"
#include "server/runtime/model_limits.h"

namespace attnserve::server {

// Validates `request` against `model` (its d_model and num_heads) and `limits` (the request
// limits, and the batching limits a request must fit in), and returns it as
// an AttendWork holding `model`, the query (and memory) rows packed without padding, the masks
// and everything needed to shape the answer. Reads `request` only; copies what it keeps.
//
// Fails with InvalidArgument naming the field, the expected and the received value (e.g.
// `input.shape[2]: expected d_model 512 of model "demo", got 256`) for a malformed request, one
// that does not fit the model, or one over a limit (the message then names the limit and the
// model). Internal if `model` is null or has no layer. Never crashes or overflows, whatever the
// values: shapes are compared against the data actually present before anything is multiplied or
// allocated.
absl::StatusOr<AttendWork> ParseAttendRequest(const v1::AttendRequest& request,
                                              std::shared_ptr<const model::Model> model,
                                              const ModelLimits& limits);

// Writes `result`, the answer to `work`, into `response`: output in the request's shape ([T, d] or
// [B, T, d]) and, if work.return_weights, weights [h, T, S] or [B, h, T, S], padding rows and
// entries zero, as Tensor.raw (little-endian float32) if work.raw_output, else Tensor.values.
// Also sets model (the answering model's name), model_version, request_id and timing. Replaces
// whatever those fields held; other fields are left alone.
//
// Internal (and `response` unchanged) if `result` does not have the sizes `work` implies, or if
// work.model is null.
absl::Status FillAttendResponse(const AttendWork& work, const AttendResult& result,
                                v1::AttendResponse* response);

// Describes `model` served under `limits` into `info` (every field set; `info` is overwritten).
// `is_default`: whether it answers requests with model "". Cannot fail.
void FillModelInfo(const model::Model& model, const ModelLimits& limits, bool is_default,
                   v1::ModelInfo* info);

// Decoding sessions open per model version, keyed (model name, version)
// (decoding::DecodeRuntime::SessionsPerVersion).
using SessionsPerVersion = std::map<std::pair<std::string, int64_t>, int64_t>;

// Sets info->decode_sessions to the sessions on info's version, and info->retired_versions to
// every other version of info's model that sessions still hold (versions with none are left
// out), oldest first. Reads name and version from `info` (FillModelInfo first). Cannot fail.
void FillDecodeSessions(const SessionsPerVersion& sessions, v1::ModelInfo* info);

// An AttendStream answer for a message that failed: `response` is cleared, then holds the model
// and request_id the request named and `error` with ToGrpcStatus(status)'s code and message.
// `status` must not be OK.
void FillErrorResponse(std::string_view model, std::string_view request_id,
                       const absl::Status& status, v1::AttendResponse* response);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_CONVERSION_H_
