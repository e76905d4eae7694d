// Protobuf's wire format, the little of it the hand-written encoders need (response_encoder.h,
// decode_response_encoder.h): tags and length-delimited fields, written as protobuf writes them.
// Pure functions; thread-safe.
#ifndef ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_WIRE_FORMAT_H_
#define ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_WIRE_FORMAT_H_

#include <cstddef>
#include <cstdint>

#include "google/protobuf/io/coded_stream.h"

namespace attnserve::server::wire_format {

// Wire types: varint and length-delimited.
constexpr uint32_t kVarint = 0;
constexpr uint32_t kLengthDelimited = 2;

// Tensor's field numbers (attnserve/v1/attention.proto).
constexpr int kShapeField = 1;
constexpr int kValuesField = 2;
constexpr int kRawField = 3;
constexpr int kDtypeField = 4;

constexpr uint32_t Tag(int field_number, uint32_t wire_type) {
  return (static_cast<uint32_t>(field_number) << 3) | wire_type;
}

// A length-delimited field of `payload` bytes: tag, length, payload.
inline size_t LengthDelimitedBytes(int field_number, size_t payload) {
  using google::protobuf::io::CodedOutputStream;
  return CodedOutputStream::VarintSize32(Tag(field_number, kLengthDelimited)) +
         CodedOutputStream::VarintSize64(payload) + payload;
}

// Writes a length-delimited field's tag and length at `target`; returns the end.
inline uint8_t* WriteLengthPrefix(int field_number, size_t payload, uint8_t* target) {
  using google::protobuf::io::CodedOutputStream;
  target = CodedOutputStream::WriteVarint32ToArray(Tag(field_number, kLengthDelimited), target);
  return CodedOutputStream::WriteVarint64ToArray(payload, target);
}

}  // namespace attnserve::server::wire_format

#endif  // ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_WIRE_FORMAT_H_
