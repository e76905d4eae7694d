// Tensor.dtype end to end: bf16 and fp16 raw tensors through a real server, checked against the
// float32 path and the core. The server computes in float32 whatever the wire carries, so:
//   - a 16-bit input gives the float32 answer to the rounded input (to float32 accuracy);
//   - a 16-bit answer is the float32 answer rounded: |Δ| <= u·|x| per element, u = 2^-8 (bf16)
//     or 2^-11 (fp16), the unit roundoff of round-to-nearest;
//   - both together stay within 4u · max|output| of the float32 answer to the unrounded input
//     (the input's rounding, amplified by the layer, plus the answer's own).
// and the bytes on the wire are halved.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/util/float_format.h"
#include "tests/server/conversion/conversion_test_support.h"
#include "tests/server/service/server_test_support.h"

namespace attnserve::testing {
namespace {

constexpr int64_t kLength = 32;

struct Dtype {
  v1::DataType proto;
  FloatFormat format;
  double unit_roundoff;
};
const Dtype kDtypes[] = {{v1::DATA_TYPE_BF16, FloatFormat::kBFloat16, std::ldexp(1.0, -8)},
                         {v1::DATA_TYPE_FP16, FloatFormat::kFloat16, std::ldexp(1.0, -11)}};

std::vector<float> Rounded(const std::vector<float>& values, FloatFormat format) {
  std::string bytes(values.size() * static_cast<size_t>(FloatFormatBytes(format)), '\0');
  EncodeFloats(values, format, bytes.data());
  std::vector<float> back(values.size());
  DecodeFloats(bytes.data(), static_cast<int64_t>(values.size()), format, back.data());
  return back;
}

double MaxAbs(const std::vector<float>& values) {
  double max = 0;
  for (float v : values) max = std::max(max, std::fabs(static_cast<double>(v)));
  return max;
}

class WireDtypeTest : public ServerTest {
 protected:
  void SetUp() override { StartServer(); }

  // A causal request with weights, float32 raw both ways.
  static v1::AttendRequest Fp32Request() {
    v1::AttendRequest request = MakeRequest(kSmallModel, kLength, kSmallWidth, 11, /*raw=*/true);
    request.set_mask(v1::MASK_CAUSAL);
    request.set_return_weights(true);
    request.set_raw_output(true);
    return request;
  }

  // Fp32Request's input in `dtype` (input_dtype) and, if `answer`, its answer too.
  static v1::AttendRequest HalfRequest(v1::DataType dtype, bool answer) {
    v1::AttendRequest request = Fp32Request();
    SetRawTensor(request.mutable_input(), {kLength, kSmallWidth},
                 TestValues(kLength * kSmallWidth, 11), dtype);
    if (answer) request.set_raw_output_dtype(dtype);
    return request;
  }

  v1::AttendResponse Call(const v1::AttendRequest& request) {
    v1::AttendResponse response;
    const grpc::Status status = Attend(request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }
};

TEST_F(WireDtypeTest, SixteenBitAnswerIsTheFloat32AnswerRounded) {
  const v1::AttendResponse fp32 = Call(Fp32Request());
  const std::vector<float> output = RawFloats(fp32.output());
  const std::vector<float> weights = RawFloats(fp32.weights());
  for (const Dtype& dtype : kDtypes) {
    SCOPED_TRACE(v1::DataType_Name(dtype.proto));
    v1::AttendRequest request = Fp32Request();
    request.set_raw_output_dtype(dtype.proto);
    const v1::AttendResponse half = Call(request);
    EXPECT_EQ(half.output().dtype(), dtype.proto);
    EXPECT_EQ(half.weights().dtype(), dtype.proto);
    EXPECT_EQ(half.output().raw().size() * 2, fp32.output().raw().size());
    EXPECT_EQ(half.weights().raw().size() * 2, fp32.weights().raw().size());
    const std::vector<float> half_output = RawFloats(half.output());
    const std::vector<float> half_weights = RawFloats(half.weights());
    ASSERT_EQ(half_output.size(), output.size());
    ASSERT_EQ(half_weights.size(), weights.size());
    // Rounding plus a float32-level allowance for the two forward passes' own differences.
    for (size_t i = 0; i < output.size(); ++i) {
      const double bound = dtype.unit_roundoff * std::fabs(output[i]) + 1e-6;
      ASSERT_LE(std::fabs(half_output[i] - output[i]), bound) << i;
    }
    for (size_t i = 0; i < weights.size(); ++i) {
      const double bound = dtype.unit_roundoff * std::fabs(weights[i]) + 1e-6;
      ASSERT_LE(std::fabs(half_weights[i] - weights[i]), bound) << i;
    }
  }
}

TEST_F(WireDtypeTest, SixteenBitInputGivesTheFloat32AnswerToTheRoundedInput) {
  const std::vector<float> input = TestValues(kLength * kSmallWidth, 11);
  for (const Dtype& dtype : kDtypes) {
    SCOPED_TRACE(v1::DataType_Name(dtype.proto));
    const v1::AttendResponse response = Call(HalfRequest(dtype.proto, false));
    const CoreAnswer expected =
        CoreCompute(*Layer(kSmallModel),
                    {.query = Rounded(input, dtype.format), .causal = true, .weights = true});
    EXPECT_TRUE(Near(RawFloats(response.output()), expected.output));
    EXPECT_TRUE(Near(RawFloats(response.weights()), expected.weights));
  }
}

TEST_F(WireDtypeTest, SixteenBitBothWaysStaysWithinTheStatedBoundOfFloat32) {
  const v1::AttendResponse fp32 = Call(Fp32Request());
  const std::vector<float> output = RawFloats(fp32.output());
  for (const Dtype& dtype : kDtypes) {
    SCOPED_TRACE(v1::DataType_Name(dtype.proto));
    const std::vector<float> half = RawFloats(Call(HalfRequest(dtype.proto, true)).output());
    ASSERT_EQ(half.size(), output.size());
    double max_error = 0;
    for (size_t i = 0; i < output.size(); ++i) {
      max_error = std::max(max_error, std::fabs(static_cast<double>(half[i]) - output[i]));
    }
    const double bound = 4 * dtype.unit_roundoff * MaxAbs(output);
    EXPECT_LE(max_error, bound) << "max |output| " << MaxAbs(output);
    RecordProperty(v1::DataType_Name(dtype.proto) + "_max_error_over_max_output",
                   std::to_string(max_error / MaxAbs(output)));
  }
}

TEST_F(WireDtypeTest, SixteenBitMessagesAreHalfTheBytes) {
  v1::AttendRequest fp32 = Fp32Request();
  const v1::AttendResponse fp32_answer = Call(fp32);
  for (const Dtype& dtype : kDtypes) {
    SCOPED_TRACE(v1::DataType_Name(dtype.proto));
    const v1::AttendRequest request = HalfRequest(dtype.proto, true);
    const v1::AttendResponse answer = Call(request);
    // Raw payloads exactly halve; the rest of each message (shapes, names, timing) is small.
    EXPECT_EQ(request.input().raw().size() * 2, fp32.input().raw().size());
    const double request_ratio =
        static_cast<double>(request.ByteSizeLong()) / static_cast<double>(fp32.ByteSizeLong());
    const double answer_ratio = static_cast<double>(answer.ByteSizeLong()) /
                                static_cast<double>(fp32_answer.ByteSizeLong());
    EXPECT_GT(request_ratio, 0.5);
    EXPECT_LT(request_ratio, 0.52);
    EXPECT_GT(answer_ratio, 0.5);
    EXPECT_LT(answer_ratio, 0.52);
  }
}

TEST_F(WireDtypeTest, WrongByteCountIsRefusedNamingTheFieldAndTheServerGoesOn) {
  v1::AttendRequest request = Fp32Request();
  request.mutable_input()->set_dtype(v1::DATA_TYPE_FP16);  // float32 bytes, declared fp16
  v1::AttendResponse response;
  const grpc::Status status = Attend(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              ::testing::HasSubstr("input.raw: expected 1024 bytes (512 DATA_TYPE_FP16 elements"));
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("got 2048 bytes"));
  Call(Fp32Request());  // Still serving.
}

}  // namespace
}  // namespace attnserve::testing
