// Helpers shared by the two halves of conversion.h's implementation (conversion_request.cc,
// conversion_response.cc). Internal to server/.
#ifndef ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_CONVERSION_INTERNAL_H_
#define ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_CONVERSION_INTERNAL_H_

#include <bit>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "attnserve/v1/attention.pb.h"
#include "core/util/float_format.h"
#include "server/runtime/attend_work.h"

namespace attnserve::server::conversion_internal {

// Tensor.raw is little-endian float32, copied with memcpy; a big-endian host would need swaps.
static_assert(std::endian::native == std::endian::little);

inline constexpr int64_t kFloatBytes = sizeof(float);

// FloatFormat's numbers are the DataType numbers (core/util/float_format.h).
static_assert(static_cast<int>(FloatFormat::kFloat32) == v1::DATA_TYPE_FP32 &&
              static_cast<int>(FloatFormat::kBFloat16) == v1::DATA_TYPE_BF16 &&
              static_cast<int>(FloatFormat::kFloat16) == v1::DATA_TYPE_FP16 &&
              v1::DataType_MAX == v1::DATA_TYPE_FP16);

// The format of a Tensor.raw with this dtype, or nullopt for a number the proto does not define
// (an open enum lets any int32 through).
inline std::optional<FloatFormat> FormatOf(int dtype) { return FloatFormatNumbered(dtype); }

inline v1::DataType DataTypeOf(FloatFormat format) { return static_cast<v1::DataType>(format); }

template <typename... Pieces>
absl::Status Invalid(const Pieces&... pieces) {
  return absl::InvalidArgumentError(absl::StrCat(pieces...));
}

template <typename... Pieces>
absl::Status Internal(const Pieces&... pieces) {
  return absl::InternalError(absl::StrCat(pieces...));
}

// OK when `dtype` (the field `name`) is a known DataType, and DATA_TYPE_FP32 unless raw_output;
// otherwise InvalidArgument naming the field and the expected values.
absl::Status CheckOutputDtype(const std::string& name, bool raw_output, int dtype);

// `tensor` (the field `name`) as [rows, width] finite floats, row-major: rank 2, every dim > 0,
// shape[1] == width (`width_name` names it, e.g. "d_model"),
// exactly one of values / raw in a known dtype, as many elements as the shape says. Otherwise
// InvalidArgument naming the field (or element), the expected and the received value.
absl::StatusOr<std::vector<float>> DecodeRows(const std::string& name, const v1::Tensor& tensor,
                                              int64_t width, const std::string& width_name);

// The answer to `work`, shared by FillAttendResponse and AttendResponseEncoder (both in
// conversion_response.cc and response_encoder.cc):

// The encoding of the answer's tensors: raw_output_format in raw, float32 in values.
FloatFormat AnswerFormat(const AttendWork& work);

// OK when `work`'s shape is self-consistent and `result` has the sizes it implies (Internal
// otherwise), so that the writers below stay in bounds and no size they compute overflows.
absl::Status CheckResultShape(const AttendWork& work, const AttendResult& result);

// Whether no sequence of `work` is padded: the packed result is then the answer as it is.
bool Unpadded(const AttendWork& work);

// The answer's shapes: output [T, d] or [B, T, d]; weights [h, T, S] or [B, h, T, S].
std::vector<int64_t> OutputShape(const AttendWork& work);
std::vector<int64_t> WeightsShape(const AttendWork& work);
int64_t ElementCount(std::span<const int64_t> shape);

// Write the packed result rows into `destination`, the whole padded tensor in AnswerFormat
// (ElementCount(shape) elements), whose padding the caller has zeroed. CheckResultShape first.
void WritePaddedOutput(const AttendWork& work, const AttendResult& result, char* destination);
void WritePaddedWeights(const AttendWork& work, const AttendResult& result, char* destination);

// Sets model, model_version, request_id and timing.
void FillAnswerFields(const AttendWork& work, const AttendResult& result,
                      v1::AttendResponse* response);

// Sets `tensor`'s values (raw_output false) or raw bytes encoded as raw_format to `source`.
void AssignFloats(std::span<const float> source, bool raw_output, FloatFormat raw_format,
                  v1::Tensor* tensor);

// `status` (not OK) as an in-band ErrorStatus: ToGrpcStatus's code and message.
void FillErrorStatus(const absl::Status& status, v1::ErrorStatus* error);

}  // namespace attnserve::server::conversion_internal

#endif  // ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_CONVERSION_INTERNAL_H_
