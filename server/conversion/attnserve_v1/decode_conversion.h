// Decode conversion: attnserve.v1's Decode stream messages (DecodeRequest / DecodeResponse) to and
// from the decoding runtime's types (server/decoding/decode_types.h).
//
// A Decode stream names its sessions with client-chosen tags; the stream keeps them in a
// DecodeSessionTags map (tag -> the runtime's session and the model version it computes with).
// The functions below validate one item of a DecodeRequest at a time, so that one bad item fails
// alone: each error is InvalidArgument (or NotFound / FailedPrecondition, as said) naming the
// field (e.g. `steps[3].rows.shape[1]`), the expected and the received value.
//
// Pure functions of their arguments; thread-safe as long as no other thread mutates the same
// output message or map.
#ifndef ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_DECODE_CONVERSION_H_
#define ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_DECODE_CONVERSION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attnserve/v1/attention.pb.h"
#include "core/model/model.h"
#include "core/util/float_format.h"
#include "server/decoding/decode_types.h"

namespace attnserve::server {

// One open session of a Decode stream, or one the server closed (idle, drained) and the client has
// not yet heard of: `closed` set, `model` null (the version is no longer held) and the tag free
// to open again.
struct DecodeStreamSession {
  decoding::SessionId id = 0;
  std::shared_ptr<const model::Model> model = nullptr;
  // The stream's number for this open (tells apart two sessions that used the same tag).
  uint64_t serial = 0;
  std::optional<decoding::CloseReason> closed;
};
// A stream's sessions by tag.
using DecodeSessionTags = absl::flat_hash_map<std::string, DecodeStreamSession>;

// Checks opens[index] of `request` against `model` (the version its model name routes to; not
// null) and the stream's open `tags`, and returns its SessionSpec (owner `owner`, memory decoded).
// InvalidArgument for an empty tag, a tag already open on this stream, or a memory tensor that is
// not [S, d_model] finite floats; FailedPrecondition when expected_version is set and differs
// from model's version.
absl::StatusOr<decoding::SessionSpec> ParseDecodeOpen(const v1::DecodeRequest& request, int index,
                                                      std::shared_ptr<const model::Model> model,
                                                      decoding::OwnerKey owner,
                                                      const DecodeSessionTags& tags);

// The session steps[index] (or closes[index], `field` "steps" / "closes") names. InvalidArgument
// when its tag is not open on this stream, listing (the first few of) those that are; NotFound,
// giving the reason, when the server closed it.
absl::StatusOr<DecodeStreamSession> FindDecodeSession(const v1::DecodeRequest& request,
                                                      absl::string_view field, int index,
                                                      const DecodeSessionTags& tags);

// The rows of steps[index] as a StepRequest for `session` (done left null: the caller sets it):
// [rows, d_model] finite floats of the session's model, raw_output_dtype valid. InvalidArgument
// otherwise.
absl::StatusOr<decoding::StepRequest> ParseDecodeStep(const v1::DecodeRequest& request, int index,
                                                      const DecodeStreamSession& session);

// The answer's encoding for steps[index] (float32 in values unless raw_output). Call after
// ParseDecodeStep succeeded.
struct DecodeOutputFormat {
  bool raw_output = false;
  FloatFormat raw_format = FloatFormat::kFloat32;
};
DecodeOutputFormat DecodeStepOutputFormat(const v1::DecodeRequest& request, int index);

// Writes a step's output rows ([rows, d_model]) into result->output in `format`.
void FillDecodeStepOutput(std::span<const float> rows, int64_t d_model, DecodeOutputFormat format,
                          v1::DecodeStepResult* result);

// `status` (not OK) as an item's in-band error (ToGrpcStatus's code and message).
void FillDecodeError(const absl::Status& status, v1::ErrorStatus* error);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_DECODE_CONVERSION_H_
