#include "server/service/wire_messages.h"

#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "server/conversion/attnserve_v1/response_encoder.h"

namespace attnserve::server {

absl::Status ParseWireMessage(const grpc::ByteBuffer& bytes, std::string_view what,
                              google::protobuf::Message* message) {
  message->Clear();
  // The reader consumes its buffer; a copy shares the slices (no bytes are copied).
  grpc::ByteBuffer copy(bytes);
  grpc::ProtoBufferReader reader(&copy);
  if (!reader.status().ok() || !message->ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError(absl::StrCat(absl::string_view(what.data(), what.size()),
                                                   ": expected a serialised ",
                                                   message->GetTypeName(), ", got ", bytes.Length(),
                                                   " bytes that protobuf cannot parse as one"));
  }
  return absl::OkStatus();
}

absl::Status SerializeWireMessage(const google::protobuf::Message& message,
                                  grpc::ByteBuffer* bytes) {
  const size_t size = message.ByteSizeLong();
  if (size > static_cast<size_t>(INT32_MAX)) {
    return absl::InternalError(
        absl::StrCat("response of ", size, " bytes is over protobuf's 2 GiB limit"));
  }
  bytes->Clear();
  grpc::ProtoBufferWriter writer(bytes, grpc::kProtoBufferWriterMaxBufferLength,
                                 static_cast<int>(size));
  if (!message.SerializeToZeroCopyStream(&writer)) {
    return absl::InternalError(absl::StrCat("cannot serialise a ", message.GetTypeName()));
  }
  return absl::OkStatus();
}

absl::Status SerializeAttendResponse(const AttendWork& work, const AttendResult& result,
                                     grpc::ByteBuffer* bytes) {
  absl::StatusOr<AttendResponseEncoder> encoder = AttendResponseEncoder::Create(work, result);
  if (!encoder.ok()) return encoder.status();
  grpc::Slice slice(encoder->size());  // Uninitialised; EncodeTo writes every byte.
  encoder->EncodeTo(reinterpret_cast<char*>(const_cast<uint8_t*>(slice.begin())));
  *bytes = grpc::ByteBuffer(&slice, 1);  // Takes a reference: no copy.
  return absl::OkStatus();
}

absl::Status SerializeDecodeResponse(const v1::DecodeResponse& response,
                                     std::span<const std::optional<DecodeStepOutput>> outputs,
                                     grpc::ByteBuffer* bytes) {
  absl::StatusOr<DecodeResponseEncoder> encoder = DecodeResponseEncoder::Create(response, outputs);
  if (!encoder.ok()) return encoder.status();
  if (encoder->size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InternalError(
        absl::StrCat("response of ", encoder->size(), " bytes is over protobuf's 2 GiB limit"));
  }
  grpc::Slice slice(encoder->size());  // Uninitialised; EncodeTo writes every byte.
  encoder->EncodeTo(reinterpret_cast<char*>(const_cast<uint8_t*>(slice.begin())));
  *bytes = grpc::ByteBuffer(&slice, 1);  // Takes a reference: no copy.
  return absl::OkStatus();
}

}  // namespace attnserve::server
