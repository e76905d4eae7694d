// DecodeResponseEncoder writes, byte for byte, protobuf's serialisation of the DecodeResponse whose
// steps FillDecodeStepOutput filled, for every output encoding and mix of items; it refuses
// outputs that do not fit the message.
#include "server/conversion/attnserve_v1/decode_response_encoder.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "attnserve/v1/attention.pb.h"
#include "gtest/gtest.h"
#include "server/conversion/attnserve_v1/decode_conversion.h"
#include "tests/server/conversion/conversion_test_support.h"

namespace attnserve::testing {
namespace {

namespace v1 = ::attnserve::v1;
using server::DecodeOutputFormat;
using server::DecodeResponseEncoder;
using server::DecodeStepOutput;

// What the encoder writes; empty (and a test failure) if it refuses.
std::string EncodedDecode(const v1::DecodeResponse& response,
                          const std::vector<std::optional<DecodeStepOutput>>& outputs) {
  return EncodedBytes(DecodeResponseEncoder::Create(response, outputs));
}

// The same answer filled into the message and serialised by protobuf.
std::string ReferenceDecode(v1::DecodeResponse response,
                            const std::vector<std::optional<DecodeStepOutput>>& outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].has_value()) continue;
    server::FillDecodeStepOutput(outputs[i]->rows, outputs[i]->d_model, outputs[i]->format,
                                 response.mutable_steps(static_cast<int>(i)));
  }
  return response.SerializeAsString();
}

// rows x d_model values with fractions that bf16 and fp16 round, negatives and -0.
DecodeStepOutput StepOutput(int64_t rows, int64_t d_model, DecodeOutputFormat format, float seed) {
  DecodeStepOutput output{.rows = {}, .d_model = d_model, .format = format};
  for (int64_t i = 0; i < rows * d_model; ++i) {
    output.rows.push_back(i == 1 ? -0.0f : seed * static_cast<float>(i % 7 - 3) / 3.1f);
  }
  return output;
}

constexpr DecodeOutputFormat kAsValues{};
constexpr DecodeOutputFormat kAsRawFp32{.raw_output = true, .raw_format = FloatFormat::kFloat32};
constexpr DecodeOutputFormat kAsRawBf16{.raw_output = true, .raw_format = FloatFormat::kBFloat16};
constexpr DecodeOutputFormat kAsRawFp16{.raw_output = true, .raw_format = FloatFormat::kFloat16};

// A response with every kind of item: opens (one failed), three steps (the middle one failed),
// a close that failed, and a request id.
v1::DecodeResponse MixedAnswer() {
  v1::DecodeResponse response;
  response.set_request_id("round-7");
  v1::DecodeOpenResult* open = response.add_opens();
  open->set_session("a");
  open->set_model("demo");
  open->set_model_version(3);
  v1::DecodeOpenResult* failed_open = response.add_opens();
  failed_open->set_session("b");
  failed_open->mutable_error()->set_code(3);
  failed_open->mutable_error()->set_message("opens[1].memory: expected ...");
  response.add_steps()->set_session("a");
  v1::DecodeStepResult* failed = response.add_steps();
  failed->set_session("zz");
  failed->mutable_error()->set_code(5);
  failed->mutable_error()->set_message("session zz is not open");
  response.add_steps()->set_session("a-long-tag-of-more-than-a-few-bytes");
  response.add_closes()->set_session("a");
  v1::DecodeCloseResult* close = response.add_closes();
  close->set_session("q");
  close->mutable_error()->set_code(3);
  return response;
}

TEST(DecodeResponseEncoderTest, WritesWhatProtobufWritesForEveryOutputFormat) {
  for (const DecodeOutputFormat& format : {kAsValues, kAsRawFp32, kAsRawBf16, kAsRawFp16}) {
    SCOPED_TRACE(::testing::Message() << "raw " << format.raw_output << " format "
                                      << static_cast<int>(format.raw_format));
    const v1::DecodeResponse response = MixedAnswer();
    const std::vector<std::optional<DecodeStepOutput>> outputs = {
        StepOutput(1, 8, format, 1.5f), std::nullopt, StepOutput(3, 8, format, -0.25f)};
    const std::string encoded = EncodedDecode(response, outputs);
    EXPECT_EQ(encoded, ReferenceDecode(response, outputs));
    // And it parses back to the filled message.
    v1::DecodeResponse parsed;
    ASSERT_TRUE(parsed.ParseFromString(encoded));
    EXPECT_EQ(parsed.steps(2).output().shape_size(), 2);
    EXPECT_EQ(parsed.steps(2).output().shape(0), 3);
    EXPECT_EQ(parsed.steps(1).error().code(), 5);
  }
}

TEST(DecodeResponseEncoderTest, MixesFormatsPerStepAndLargeOutputs) {
  v1::DecodeResponse response;
  for (int i = 0; i < 4; ++i) response.add_steps()->set_session(std::to_string(i));
  // 300 x 512 floats: lengths whose varints take three bytes.
  const std::vector<std::optional<DecodeStepOutput>> outputs = {
      StepOutput(300, 512, kAsRawBf16, 2.0f), StepOutput(1, 512, kAsValues, 1.0f),
      StepOutput(2, 512, kAsRawFp32, 0.5f), StepOutput(1, 1, kAsRawFp16, 3.0f)};
  EXPECT_EQ(EncodedDecode(response, outputs), ReferenceDecode(response, outputs));
}

TEST(DecodeResponseEncoderTest, AnswersWithoutStepsAndErrorsOnly) {
  // An unparseable message's answer: only the error.
  v1::DecodeResponse error_only;
  error_only.mutable_error()->set_code(3);
  error_only.mutable_error()->set_message("message: expected a serialised attnserve.v1...");
  EXPECT_EQ(EncodedDecode(error_only, {}), error_only.SerializeAsString());
  // Nothing at all (a message of closes only whose answer is empty).
  EXPECT_EQ(EncodedDecode(v1::DecodeResponse(), {}), "");
  // Every step failed.
  v1::DecodeResponse failed = MixedAnswer();
  failed.mutable_steps(0)->mutable_error()->set_code(8);
  failed.mutable_steps(2)->mutable_error()->set_code(8);
  EXPECT_EQ(EncodedDecode(failed, {std::nullopt, std::nullopt, std::nullopt}),
            failed.SerializeAsString());
}

TEST(DecodeResponseEncoderTest, RefusesOutputsThatDoNotFitTheMessage) {
  const v1::DecodeResponse response = MixedAnswer();
  // One output per step, or the encoder would read past them.
  std::vector<std::optional<DecodeStepOutput>> two = {StepOutput(1, 8, kAsValues, 1), std::nullopt};
  EXPECT_EQ(DecodeResponseEncoder::Create(response, two).status().code(),
            absl::StatusCode::kInternal);
  // An output for a step that failed.
  std::vector<std::optional<DecodeStepOutput>> on_error = {
      StepOutput(1, 8, kAsValues, 1), StepOutput(1, 8, kAsValues, 1), std::nullopt};
  absl::Status status = DecodeResponseEncoder::Create(response, on_error).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(status.message().find("steps[1]"), std::string::npos) << status;
  // An output for a step whose result already carries one.
  v1::DecodeResponse filled = response;
  filled.mutable_steps(0)->mutable_output()->add_shape(1);
  std::vector<std::optional<DecodeStepOutput>> twice = {StepOutput(1, 8, kAsValues, 1),
                                                        std::nullopt, std::nullopt};
  EXPECT_EQ(DecodeResponseEncoder::Create(filled, twice).status().code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace attnserve::testing
