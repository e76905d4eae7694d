// Conversion: the one place where the protobuf API (attnserve/v1/attention.proto) meets core types.
//
// ParseAttendRequest validates every field of an AttendRequest against a model and the limits in
// force and packs it into an AttendWork (padding removed); FillAttendResponse pads an AttendResult
// back to the request's shape. FillModelInfo and ToGrpcStatus cover the other RPCs. Past this
// file the server works only on core types, and nothing in core sees a protobuf.
//
// Every function is a pure function of its arguments: thread-safe as long as no other thread
// mutates the same output message concurrently.
#ifndef ATTNSERVE_SERVER_CONVERSION_H_
#define ATTNSERVE_SERVER_CONVERSION_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnserve/v1/attention.pb.h"
#include "core/model/model.h"
#include "grpcpp/support/status.h"
#include "server/attend_work.h"

namespace attnserve::server {

// What one request may ask of a model: the model's effective settings (the server's defaults
// with the model's config.json overrides applied). Every value is >= 1.
struct RequestLimits {
  // Longest query or memory sequence: the padded T and S of a request.
  int64_t max_sequence_length = 4096;
  // Most sequences (B) in one request.
  int64_t max_batch_sequences = 64;
  // Most valid query rows (Σ T_i) in one request.
  int64_t max_batch_tokens = 8192;
  // Largest estimated response: the padded output plus, with return_weights, the padded weights
  // (B·h·T·S floats). Capped at kMaxMessageBytes whatever is set here, since protobuf cannot
  // serialise a larger message.
  int64_t max_response_bytes = int64_t{64} << 20;
};

// Protobuf's hard limit on one serialised message.
inline constexpr int64_t kMaxMessageBytes = (int64_t{1} << 31) - 1;

// Every limit in force for one model, as reported by ModelInfo: the request limits plus the
// batching queue's.
struct ModelLimits {
  RequestLimits request;
  int64_t max_queue_delay_us = 0;
  int64_t max_queue_size = 1024;
};

// Validates `request` against `model` (its d_model and num_heads) and `limits`, and returns it as
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
                                              const RequestLimits& limits);

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

// The gRPC status with the same code (absl and gRPC share the numbering) and message. An OK
// status maps to grpc::Status::OK; a code outside gRPC's range to UNKNOWN. Payloads are dropped.
grpc::Status ToGrpcStatus(const absl::Status& status);

// An AttendStream answer for a message that failed: `response` is cleared, then holds the model
// and request_id the request named and `error` with ToGrpcStatus(status)'s code and message.
// `status` must not be OK.
void FillErrorResponse(std::string_view model, std::string_view request_id,
                       const absl::Status& status, v1::AttendResponse* response);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_CONVERSION_H_
