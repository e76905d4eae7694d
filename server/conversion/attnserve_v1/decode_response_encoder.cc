#include "server/conversion/attnserve_v1/decode_response_encoder.h"

#include "absl/strings/str_cat.h"
#include "core/util/float_format.h"
#include "google/protobuf/io/coded_stream.h"
#include "server/conversion/attnserve_v1/wire_format.h"

namespace attnserve::server {
namespace {

using google::protobuf::io::CodedOutputStream;
namespace wf = wire_format;

// The dtype field an output carries: raw bytes other than float32 name their encoding; float32
// (the default, 0) is not written, as protobuf leaves default scalars out.
int DtypeOf(const DecodeOutputFormat& format) {
  return format.raw_output ? static_cast<int>(format.raw_format) : 0;
}

// The encoding of an output's floats: raw_format for raw bytes, float32 for values.
FloatFormat WireFormatOf(const DecodeOutputFormat& format) {
  return format.raw_output ? format.raw_format : FloatFormat::kFloat32;
}

int DataFieldOf(const DecodeOutputFormat& format) {
  return format.raw_output ? wf::kRawField : wf::kValuesField;
}

// A submessage field: its tag and length, then the message protobuf serialises (its sizes
// cached by the ByteSizeLong that Create called).
uint8_t* WriteMessageField(int field_number, const google::protobuf::MessageLite& message,
                           uint8_t* target) {
  target = wf::WriteLengthPrefix(field_number, message.GetCachedSize(), target);
  return message.SerializeWithCachedSizesToArray(target);
}

}  // namespace

absl::StatusOr<DecodeResponseEncoder> DecodeResponseEncoder::Create(
    const v1::DecodeResponse& response, std::span<const std::optional<DecodeStepOutput>> outputs) {
  if (outputs.size() != static_cast<size_t>(response.steps_size())) {
    return absl::InternalError(absl::StrCat("Decode answer: ", outputs.size(), " outputs for ",
                                            response.steps_size(), " steps"));
  }
  for (int i = 0; i < response.steps_size(); ++i) {
    const v1::DecodeStepResult& step = response.steps(i);
    if (outputs[i].has_value() && (step.has_output() || step.has_error())) {
      return absl::InternalError(absl::StrCat("Decode answer: steps[", i, "] has an output and ",
                                              step.has_error() ? "an error" : "an output already",
                                              " in the message"));
    }
  }
  return DecodeResponseEncoder(response, outputs);
}

DecodeResponseEncoder::DecodeResponseEncoder(
    const v1::DecodeResponse& response, std::span<const std::optional<DecodeStepOutput>> outputs)
    : response_(&response), outputs_(outputs) {
  if (!response.request_id().empty()) {
    size_ += wf::LengthDelimitedBytes(v1::DecodeResponse::kRequestIdFieldNumber,
                                      response.request_id().size());
  }
  for (const v1::DecodeOpenResult& open : response.opens()) {
    size_ += wf::LengthDelimitedBytes(v1::DecodeResponse::kOpensFieldNumber, open.ByteSizeLong());
  }
  steps_.reserve(outputs.size());
  for (int i = 0; i < response.steps_size(); ++i) {
    steps_.push_back(Plan(response.steps(i), outputs[i]));
    size_ += wf::LengthDelimitedBytes(v1::DecodeResponse::kStepsFieldNumber,
                                      steps_.back().message_bytes);
  }
  for (const v1::DecodeCloseResult& close : response.closes()) {
    size_ += wf::LengthDelimitedBytes(v1::DecodeResponse::kClosesFieldNumber, close.ByteSizeLong());
  }
  if (response.has_error()) {
    size_ += wf::LengthDelimitedBytes(v1::DecodeResponse::kErrorFieldNumber,
                                      response.error().ByteSizeLong());
  }
}

DecodeResponseEncoder::StepPlan DecodeResponseEncoder::Plan(
    const v1::DecodeStepResult& result, const std::optional<DecodeStepOutput>& output) {
  StepPlan plan;
  plan.message_bytes = result.ByteSizeLong();  // The result without its output (the session).
  if (!output.has_value()) return plan;
  // FillDecodeStepOutput's shape: [rows, d_model].
  const auto elements = static_cast<int64_t>(output->rows.size());
  plan.rows = output->d_model > 0 ? elements / output->d_model : 0;
  plan.shape_bytes = CodedOutputStream::VarintSize64(static_cast<uint64_t>(plan.rows)) +
                     CodedOutputStream::VarintSize64(static_cast<uint64_t>(output->d_model));
  plan.data_bytes = static_cast<size_t>(elements * FloatFormatBytes(WireFormatOf(output->format)));
  plan.tensor_bytes = wf::LengthDelimitedBytes(wf::kShapeField, plan.shape_bytes);
  if (plan.data_bytes > 0) {
    plan.tensor_bytes += wf::LengthDelimitedBytes(DataFieldOf(output->format), plan.data_bytes);
  }
  if (const int dtype = DtypeOf(output->format); dtype != 0) {
    plan.tensor_bytes += CodedOutputStream::VarintSize32(wf::Tag(wf::kDtypeField, wf::kVarint)) +
                         CodedOutputStream::VarintSize32(static_cast<uint32_t>(dtype));
  }
  plan.message_bytes +=
      wf::LengthDelimitedBytes(v1::DecodeStepResult::kOutputFieldNumber, plan.tensor_bytes);
  return plan;
}

uint8_t* DecodeResponseEncoder::EncodeStep(int index, uint8_t* target) const {
  const StepPlan& plan = steps_[static_cast<size_t>(index)];
  const std::optional<DecodeStepOutput>& output = outputs_[static_cast<size_t>(index)];
  target = wf::WriteLengthPrefix(v1::DecodeResponse::kStepsFieldNumber, plan.message_bytes, target);
  // Field-number order: the session (1), then the output (2); a step with an output has no
  // error (3).
  target = response_->steps(index).SerializeWithCachedSizesToArray(target);
  if (!output.has_value()) return target;
  target =
      wf::WriteLengthPrefix(v1::DecodeStepResult::kOutputFieldNumber, plan.tensor_bytes, target);
  target = wf::WriteLengthPrefix(wf::kShapeField, plan.shape_bytes, target);
  target = CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(plan.rows), target);
  target = CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(output->d_model), target);
  if (plan.data_bytes > 0) {
    target = wf::WriteLengthPrefix(DataFieldOf(output->format), plan.data_bytes, target);
    EncodeFloats(output->rows, WireFormatOf(output->format), reinterpret_cast<char*>(target));
    target += plan.data_bytes;
  }
  if (const int dtype = DtypeOf(output->format); dtype != 0) {
    target = CodedOutputStream::WriteVarint32ToArray(wf::Tag(wf::kDtypeField, wf::kVarint), target);
    target = CodedOutputStream::WriteVarint32ToArray(static_cast<uint32_t>(dtype), target);
  }
  return target;
}

void DecodeResponseEncoder::EncodeTo(char* destination) const {
  auto* target = reinterpret_cast<uint8_t*>(destination);
  // Field-number order, as protobuf serialises: request_id (1), opens (2), steps (3), closes (4),
  // error (5).
  const v1::DecodeResponse& response = *response_;
  if (!response.request_id().empty()) {
    const std::string& id = response.request_id();
    target = wf::WriteLengthPrefix(v1::DecodeResponse::kRequestIdFieldNumber, id.size(), target);
    target = CodedOutputStream::WriteRawToArray(id.data(), static_cast<int>(id.size()), target);
  }
  for (const v1::DecodeOpenResult& open : response.opens()) {
    target = WriteMessageField(v1::DecodeResponse::kOpensFieldNumber, open, target);
  }
  for (int i = 0; i < response.steps_size(); ++i) target = EncodeStep(i, target);
  for (const v1::DecodeCloseResult& close : response.closes()) {
    target = WriteMessageField(v1::DecodeResponse::kClosesFieldNumber, close, target);
  }
  if (response.has_error()) {
    WriteMessageField(v1::DecodeResponse::kErrorFieldNumber, response.error(), target);
  }
}

}  // namespace attnserve::server
