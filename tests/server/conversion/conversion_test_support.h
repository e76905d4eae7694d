// Shared by the conversion tests: a tiny model (d_model 8, 2 heads), tensors with distinct values,
// and two valid requests that use every field.
#ifndef ATTNSERVE_TESTS_SERVER_CONVERSION_CONVERSION_TEST_SUPPORT_H_
#define ATTNSERVE_TESTS_SERVER_CONVERSION_CONVERSION_TEST_SUPPORT_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/v1/attention.pb.h"
#include "core/model/model.h"
#include "gtest/gtest.h"
#include "server/conversion/attnserve_v1/conversion.h"
#include "server/runtime/attend_work.h"

namespace attnserve::testing {

inline constexpr int64_t kD = 8;
inline constexpr int64_t kHeads = 2;
inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();

// The model "tiny" (version 3, bias, MakeRandomWeights seed 7), built once.
std::shared_ptr<const model::Model> TinyModel();
// start, start + 1, ...: every element of a tensor is distinct, so packed rows can be traced back.
std::vector<float> Sequential(int64_t count, float start = 0.0f);
void SetTensor(v1::Tensor* tensor, const std::vector<int64_t>& shape,
               const std::vector<float>& values, bool raw = false);
// A shape filled with Sequential(product, start).
void SetSequential(v1::Tensor* tensor, const std::vector<int64_t>& shape, float start = 0.0f,
                   bool raw = false);
// `values` as raw bytes in `dtype` (16-bit types rounded to nearest, ties to even).
void SetRawTensor(v1::Tensor* tensor, const std::vector<int64_t>& shape,
                  const std::vector<float>& values, v1::DataType dtype);
// A raw tensor's elements as floats, decoded as its dtype says.
std::vector<float> RawFloats(const v1::Tensor& tensor);
std::vector<uint32_t> Bits(const std::vector<float>& values);
// Valid rank-3 cross-attention request using every field: input [2, 3, 8] with lengths {3, 2},
// memory [2, 4, 8] with memory_lengths {4, 1}, attn_mask [2, 3, 4], head_mask, weights.
v1::AttendRequest Rank3Request();
// Valid rank-2 self-attention request: input [3, 8], attn_mask [3, 3].
v1::AttendRequest Rank2Request();
// A result for `work` whose values are distinct: output = 0.5 + i, weights = -1 - i, timing
// {11, 22, 5, 77}. The spans view buffers that result.storage owns, as the batch runner's do.
server::AttendResult ResultFor(const server::AttendWork& work);
// ParseAttendRequest against TinyModel().
absl::StatusOr<server::AttendWork> Parse(const v1::AttendRequest& request,
                                         const server::ModelLimits& limits = {});

// What a hand-written encoder (AttendResponseEncoder, DecodeResponseEncoder) writes; empty, and
// a test failure, when `encoder` is an error. Checks that EncodeTo writes exactly size() bytes.
template <typename Encoder>
std::string EncodedBytes(const absl::StatusOr<Encoder>& encoder) {
  EXPECT_TRUE(encoder.ok()) << encoder.status();
  if (!encoder.ok()) return "";
  // One byte past the end, to see that the encoder writes no more.
  std::string bytes(encoder->size() + 1, '\x5a');
  encoder->EncodeTo(bytes.data());
  EXPECT_EQ(bytes.back(), '\x5a');
  bytes.pop_back();
  return bytes;
}

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_SERVER_CONVERSION_CONVERSION_TEST_SUPPORT_H_
