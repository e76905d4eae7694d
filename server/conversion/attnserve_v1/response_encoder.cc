#include "server/conversion/attnserve_v1/response_encoder.h"

#include <cstring>
#include <span>
#include <utility>

#include "google/protobuf/io/coded_stream.h"
#include "server/conversion/attnserve_v1/conversion_internal.h"
#include "server/conversion/attnserve_v1/wire_format.h"

namespace attnserve::server {
namespace {

using google::protobuf::io::CodedOutputStream;
using wire_format::kDtypeField;
using wire_format::kRawField;
using wire_format::kShapeField;
using wire_format::kValuesField;
using wire_format::kVarint;
using wire_format::LengthDelimitedBytes;
using wire_format::Tag;
using wire_format::WriteLengthPrefix;

}  // namespace

absl::StatusOr<AttendResponseEncoder> AttendResponseEncoder::Create(const AttendWork& work,
                                                                    const AttendResult& result) {
  if (auto s = conversion_internal::CheckResultShape(work, result); !s.ok()) return s;
  return AttendResponseEncoder(work, result);
}

AttendResponseEncoder::AttendResponseEncoder(const AttendWork& work, const AttendResult& result)
    : work_(&work), result_(&result) {
  output_ = Plan(v1::AttendResponse::kOutputFieldNumber, conversion_internal::OutputShape(work));
  size_ = FieldBytes(output_);
  if (work.return_weights) {
    weights_ =
        Plan(v1::AttendResponse::kWeightsFieldNumber, conversion_internal::WeightsShape(work));
    size_ += FieldBytes(weights_);
  }
  conversion_internal::FillAnswerFields(work, result, &rest_);
  rest_bytes_ = rest_.ByteSizeLong();
  size_ += rest_bytes_;
}

AttendResponseEncoder::TensorPlan AttendResponseEncoder::Plan(int field_number,
                                                              std::vector<int64_t> shape) const {
  TensorPlan plan;
  plan.field_number = field_number;
  for (int64_t dim : shape) plan.shape_bytes += CodedOutputStream::VarintSize64(dim);
  plan.data_field = work_->raw_output ? kRawField : kValuesField;
  plan.data_bytes =
      static_cast<size_t>(conversion_internal::ElementCount(shape) *
                          FloatFormatBytes(conversion_internal::AnswerFormat(*work_)));
  plan.shape = std::move(shape);
  plan.dtype = work_->raw_output ? static_cast<int>(work_->raw_output_format) : 0;
  // Empty fields are not written, as protobuf's serialiser leaves them out.
  if (plan.shape_bytes > 0) {
    plan.message_bytes += LengthDelimitedBytes(kShapeField, plan.shape_bytes);
  }
  if (plan.data_bytes > 0) {
    plan.message_bytes += LengthDelimitedBytes(plan.data_field, plan.data_bytes);
  }
  if (plan.dtype != 0) {
    plan.message_bytes += CodedOutputStream::VarintSize32(Tag(kDtypeField, kVarint)) +
                          CodedOutputStream::VarintSize32(static_cast<uint32_t>(plan.dtype));
  }
  return plan;
}

size_t AttendResponseEncoder::FieldBytes(const TensorPlan& plan) {
  return LengthDelimitedBytes(plan.field_number, plan.message_bytes);
}

uint8_t* AttendResponseEncoder::EncodeTensor(const TensorPlan& plan, bool weights,
                                             uint8_t* target) const {
  target = WriteLengthPrefix(plan.field_number, plan.message_bytes, target);
  if (plan.shape_bytes > 0) {
    target = WriteLengthPrefix(kShapeField, plan.shape_bytes, target);
    for (int64_t dim : plan.shape) {
      target = CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(dim), target);
    }
  }
  if (plan.data_bytes > 0) {
    target = WriteLengthPrefix(plan.data_field, plan.data_bytes, target);
    char* data = reinterpret_cast<char*>(target);
    const std::span<const float> packed = weights ? result_->weights : result_->output;
    if (conversion_internal::Unpadded(*work_)) {
      EncodeFloats(packed, conversion_internal::AnswerFormat(*work_), data);
    } else {
      std::memset(data, 0, plan.data_bytes);  // The padding; the rows are written over it.
      if (weights) {
        conversion_internal::WritePaddedWeights(*work_, *result_, data);
      } else {
        conversion_internal::WritePaddedOutput(*work_, *result_, data);
      }
    }
    target += plan.data_bytes;
  }
  if (plan.dtype != 0) {
    target = CodedOutputStream::WriteVarint32ToArray(Tag(kDtypeField, kVarint), target);
    target = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(plan.dtype), target);
  }
  return target;
}

void AttendResponseEncoder::EncodeTo(char* destination) const {
  auto* target = reinterpret_cast<uint8_t*>(destination);
  // Field-number order, as protobuf serialises: output (1), weights (2), then the rest (3..).
  target = EncodeTensor(output_, /*weights=*/false, target);
  if (weights_.field_number != 0) target = EncodeTensor(weights_, /*weights=*/true, target);
  // Not SerializeWithCachedSizesToArray: the sizes protobuf caches do not survive a move of
  // the encoder (StatusOr moves it), so they are computed again (a few small fields).
  rest_.SerializeToArray(target, static_cast<int>(rest_bytes_));
}

}  // namespace attnserve::server
