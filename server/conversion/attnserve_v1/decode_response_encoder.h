// DecodeResponseEncoder: a Decode message's answer serialised with its steps' outputs encoded
// straight from the rows the decoding runtime returned.
//
// Filling each step's output into the message (FillDecodeStepOutput) and then serialising it
// allocates a buffer per step and copies every float twice. The encoder writes the same bytes —
// protobuf's serialisation of `response` with each output filled, field for field — in one pass
// into memory the caller provides (the wire's slice); the rows are encoded once.
//
// Holds pointers to the response and the outputs, which must outlive it and stay unchanged
// between Create and EncodeTo. Const methods are thread-safe.
#ifndef ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_DECODE_RESPONSE_ENCODER_H_
#define ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_DECODE_RESPONSE_ENCODER_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/v1/attention.pb.h"
#include "server/conversion/attnserve_v1/decode_conversion.h"

namespace attnserve::server {

// A step's output as the runtime answered it, kept until the message's answer is encoded.
struct DecodeStepOutput {
  std::vector<float> rows;  // [rows.size() / d_model, d_model]
  int64_t d_model = 0;
  DecodeOutputFormat format;
};

class DecodeResponseEncoder {
 public:
  // `response`: the answer with no step outputs; `outputs`: one per response.steps, set for the
  // steps that succeeded (their result in `response` carries only the session). Internal when
  // the counts differ or a step with an output already has an output or an error.
  static absl::StatusOr<DecodeResponseEncoder> Create(
      const v1::DecodeResponse& response, std::span<const std::optional<DecodeStepOutput>> outputs);

  // The exact size of the serialisation in bytes.
  size_t size() const { return size_; }

  // Writes size() bytes at `destination`: `response` with FillDecodeStepOutput applied to each
  // step that has an output, serialised.
  void EncodeTo(char* destination) const;

 private:
  // One step result's serialisation: its message without the output, and the output Tensor.
  struct StepPlan {
    size_t tensor_bytes = 0;   // the output Tensor's serialisation (0 when it has none)
    size_t shape_bytes = 0;    // the packed varints of the output's shape
    size_t data_bytes = 0;     // the output's encoded floats
    int64_t rows = 0;          // the output's first dimension
    size_t message_bytes = 0;  // the whole result, without its tag and length
  };

  DecodeResponseEncoder(const v1::DecodeResponse& response,
                        std::span<const std::optional<DecodeStepOutput>> outputs);
  static StepPlan Plan(const v1::DecodeStepResult& result,
                       const std::optional<DecodeStepOutput>& output);
  uint8_t* EncodeStep(int index, uint8_t* target) const;

  const v1::DecodeResponse* response_;
  std::span<const std::optional<DecodeStepOutput>> outputs_;
  std::vector<StepPlan> steps_;
  size_t size_ = 0;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_CONVERSION_ATTNSERVE_V1_DECODE_RESPONSE_ENCODER_H_
