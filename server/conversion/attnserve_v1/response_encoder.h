// AttendResponseEncoder: an AttendResponse serialised straight from an AttendResult.
//
// FillAttendResponse followed by protobuf's serialiser copies the answer's floats twice, through
// two fresh buffers of the answer's size (the message's Tensor, then the serialisation). The
// encoder writes the same bytes — protobuf's own serialisation of that message, field for field —
// in one pass into memory the caller provides (the wire's slice), encoding each float once from
// the result. attnserve.v1's Attend and AttendStream answer through it.
//
// Holds pointers to `work` and `result`, which must outlive it. Const methods are thread-safe.
#ifndef ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_RESPONSE_ENCODER_H_
#define ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_RESPONSE_ENCODER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/v1/attention.pb.h"
#include "server/runtime/attend_work.h"

namespace attnserve::server {

class AttendResponseEncoder {
 public:
  // Internal (as FillAttendResponse) if `result` does not have the sizes `work` implies.
  static absl::StatusOr<AttendResponseEncoder> Create(const AttendWork& work,
                                                      const AttendResult& result);

  // The exact size of the serialisation in bytes.
  size_t size() const { return size_; }

  // Writes size() bytes at `destination`: the AttendResponse that FillAttendResponse(work,
  // result) fills, serialised.
  void EncodeTo(char* destination) const;

 private:
  // One Tensor field (output or weights) of the response: its shape, dtype and payload size.
  struct TensorPlan {
    int field_number = 0;
    std::vector<int64_t> shape;
    size_t shape_bytes = 0;  // the packed varints of `shape`
    int data_field = 0;      // Tensor.values (2) or Tensor.raw (3)
    size_t data_bytes = 0;
    int dtype = 0;             // Tensor.dtype (0, the default, is not written)
    size_t message_bytes = 0;  // the Tensor's serialisation, without its tag and length
  };

  AttendResponseEncoder(const AttendWork& work, const AttendResult& result);
  TensorPlan Plan(int field_number, std::vector<int64_t> shape) const;
  static size_t FieldBytes(const TensorPlan& plan);
  uint8_t* EncodeTensor(const TensorPlan& plan, bool weights, uint8_t* target) const;

  const AttendWork* work_;
  const AttendResult* result_;
  TensorPlan output_;
  TensorPlan weights_;       // field_number 0 when the answer has no weights
  v1::AttendResponse rest_;  // fields 3.. (model, request_id, timing, model_version)
  size_t rest_bytes_ = 0;
  size_t size_ = 0;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_RESPONSE_ENCODER_H_
