// The Open Inference Protocol's REST conversion (server/conversion/oip_rest/): JSON and binary
// bodies become the protocol's ModelInferRequest with the same values bit for bit; malformed
// bodies are refused naming the field; answers read back as the same FP32 values.
#include "server/conversion/oip_rest/rest_conversion.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace attnserve::testing::rest_conversion_test {
namespace {

using server::oip_rest::BinaryOutputs;
using server::oip_rest::ParseHeaderLength;
using server::oip_rest::ParseInferRequest;
using server::oip_rest::RestBody;
using server::oip_rest::WriteInferResponse;
using ::testing::HasSubstr;
using InferRequest = inference::ModelInferRequest;

absl::Status Parse(const std::string& body, InferRequest* request, BinaryOutputs* binary,
                   std::optional<size_t> json_length = std::nullopt) {
  return ParseInferRequest("demo", "", body, json_length, request, binary);
}

// The error for `body`, which must be refused InvalidArgument.
std::string ErrorOf(const std::string& body, std::optional<size_t> json_length = std::nullopt) {
  InferRequest request;
  BinaryOutputs binary;
  absl::Status status = Parse(body, &request, &binary, json_length);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << body;
  return std::string(status.message());
}

std::string Bytes(const void* data, size_t size) {
  return std::string(static_cast<const char*>(data), size);
}

TEST(RestConversionTest, JsonInputsBecomeTypedContentsNestedOrFlat) {
  for (const char* data : {"[1.5, -2, 3e-3, 4]", "[[1.5, -2], [3e-3, 4]]"}) {
    InferRequest request;
    BinaryOutputs binary;
    const std::string body = absl::StrCat(
        R"({"id": "r7", "parameters": {"causal": true, "head_mask": "1,0"}, "inputs": [)",
        R"({"name": "input", "shape": [2, 2], "datatype": "FP32", "data": )", data, "},",
        R"({"name": "lengths", "shape": [1], "datatype": "INT32", "data": [2]},)",
        R"({"name": "attn_mask", "shape": [1, 2], "datatype": "BOOL", "data": [true, false]}]})");
    ASSERT_TRUE(Parse(body, &request, &binary).ok()) << data;
    EXPECT_EQ(request.model_name(), "demo");
    EXPECT_EQ(request.id(), "r7");
    EXPECT_TRUE(request.parameters().at("causal").bool_param());
    EXPECT_EQ(request.parameters().at("head_mask").string_param(), "1,0");
    EXPECT_EQ(request.raw_input_contents_size(), 0);
    ASSERT_EQ(request.inputs_size(), 3);
    EXPECT_THAT(request.inputs(0).contents().fp32_contents(),
                ::testing::ElementsAre(1.5f, -2.0f, 3e-3f, 4.0f));
    EXPECT_THAT(request.inputs(0).shape(), ::testing::ElementsAre(2, 2));
    EXPECT_THAT(request.inputs(1).contents().int_contents(), ::testing::ElementsAre(2));
    EXPECT_THAT(request.inputs(2).contents().bool_contents(), ::testing::ElementsAre(true, false));
    EXPECT_FALSE(binary.output);
  }
}

TEST(RestConversionTest, BinaryInputsAreTakenByteForByteAndJsonNeighboursTravelRaw) {
  const std::vector<float> x = {0.1f, -7.25f, std::numeric_limits<float>::denorm_min(), 1e30f};
  const std::string json =
      R"({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32",)"
      R"( "parameters": {"binary_data_size": 16}},)"
      R"( {"name": "lengths", "shape": [1], "datatype": "INT32", "data": [1]}],)"
      R"( "parameters": {"binary_data_output": true},)"
      R"( "outputs": [{"name": "output"}, {"name": "weights", "parameters": {"binary_data": false}}]})";
  const std::string body = json + Bytes(x.data(), 16);
  InferRequest request;
  BinaryOutputs binary;
  ASSERT_TRUE(Parse(body, &request, &binary, json.size()).ok());
  ASSERT_EQ(request.raw_input_contents_size(), 2);
  EXPECT_EQ(request.raw_input_contents(0), Bytes(x.data(), 16));
  const int32_t one = 1;
  EXPECT_EQ(request.raw_input_contents(1), Bytes(&one, 4));
  EXPECT_FALSE(request.inputs(1).has_contents());
  // binary_data_output is the binding's own: the model never sees it.
  EXPECT_FALSE(request.parameters().contains("binary_data_output"));
  EXPECT_TRUE(binary.output);
  EXPECT_FALSE(binary.weights);
  ASSERT_EQ(request.outputs_size(), 2);
  EXPECT_EQ(request.outputs(1).name(), "weights");
}

TEST(RestConversionTest, JsonNumbersReachFp32RoundedOnce) {
  // 0.1 is no FP32 value: it must arrive as the nearest one, float(0.1), as numpy's
  // np.float32(0.1) does.
  InferRequest request;
  BinaryOutputs binary;
  ASSERT_TRUE(Parse(R"({"inputs": [{"name": "input", "shape": [3], "datatype": "FP32",)"
                    R"( "data": [0.1, 16777217, 3.4028234663852886e38]}]})",
                    &request, &binary)
                  .ok());
  EXPECT_THAT(request.inputs(0).contents().fp32_contents(),
              ::testing::ElementsAre(0.1f, 16777216.0f, std::numeric_limits<float>::max()));
}

TEST(RestConversionTest, MalformedBodiesNameTheFieldAndWhatWasExpected) {
  EXPECT_THAT(ErrorOf(R"({"inputs": [)"), HasSubstr("malformed JSON (at byte 13)"));
  EXPECT_THAT(ErrorOf("[1, 2]"), HasSubstr("expected a JSON object, got an array"));
  EXPECT_THAT(ErrorOf(std::string(100, '[') + std::string(100, ']')),
              HasSubstr("nested at most 16 levels"));
  // A '[' inside a string is no nesting.
  EXPECT_THAT(ErrorOf(absl::StrCat(R"({"id": ")", std::string(100, '['), R"("})")),
              HasSubstr("inputs: expected an array of tensors, got none"));
  EXPECT_THAT(ErrorOf(R"({"inputs": [], "input": 1})"),
              HasSubstr("request body: expected only the keys id, parameters, inputs, outputs, "
                        "got \"input\""));
  EXPECT_THAT(ErrorOf(R"({"id": 5, "inputs": []})"), HasSubstr("id: expected a string, got an "
                                                               "integer"));
  EXPECT_THAT(ErrorOf(R"({"inputs": [{"name": "input", "datatype": "FP32", "data": [1]}]})"),
              HasSubstr("inputs[0].shape: expected an array of integers, got none"));
  EXPECT_THAT(
      ErrorOf(
          R"({"inputs": [{"name": "input", "shape": [1.5], "datatype": "FP32", "data": [1]}]})"),
      HasSubstr("inputs[0].shape[0]: expected an integer, got 1.5"));
  EXPECT_THAT(ErrorOf(R"({"inputs": [{"name": "input", "shape": [2], "datatype": "FP32",)"
                      R"( "data": [1, "two"]}]})"),
              HasSubstr("inputs[\"input\"].data[1]: expected a number, got a string"));
  EXPECT_THAT(ErrorOf(R"({"inputs": [{"name": "input", "shape": [1], "datatype": "FP32",)"
                      R"( "data": [1e39]}]})"),
              HasSubstr("data[0]: expected a number within FP32's range"));
  EXPECT_THAT(ErrorOf(R"({"inputs": [{"name": "lengths", "shape": [1], "datatype": "INT32",)"
                      R"( "data": [2147483648]}]})"),
              HasSubstr("inputs[\"lengths\"].data[0]: expected an INT32 integer, got 2147483648"));
  EXPECT_THAT(ErrorOf(R"({"inputs": [{"name": "attn_mask", "shape": [1], "datatype": "BOOL",)"
                      R"( "data": [1]}]})"),
              HasSubstr("data[0]: expected true or false, got 1"));
  EXPECT_THAT(ErrorOf(R"({"inputs": [{"name": "input", "shape": [1], "datatype": "BF16",)"
                      R"( "data": [1]}]})"),
              HasSubstr("expected BF16 values as binary data"));
  EXPECT_THAT(ErrorOf(R"({"inputs": [{"name": "input", "shape": [1], "datatype": "FP32"}]})"),
              HasSubstr("inputs[0].data: expected the tensor's values"));
  EXPECT_THAT(ErrorOf(R"({"inputs": [{"name": "input", "shape": [1], "datatype": "FP32",)"
                      R"( "data": [1], "parameters": {"binary_data_size": 4}}]})"),
              HasSubstr("got both"));
  EXPECT_THAT(ErrorOf(R"({"inputs": [{"name": "input", "shape": [1], "datatype": "FP32",)"
                      R"( "data": [1], "parameters": {"shm_region": "x"}}]})"),
              HasSubstr("inputs[0].parameters: expected only the keys binary_data_size"));
  EXPECT_THAT(ErrorOf(R"({"inputs": [], "outputs": [{"name": "output", "parameters":)"
                      R"( {"binary_data": 1}}]})"),
              HasSubstr("outputs[0].parameters.binary_data: expected true or false"));
  EXPECT_THAT(ErrorOf(R"({"inputs": [], "parameters": {"binary_data_output": "yes"}})"),
              HasSubstr("parameters[\"binary_data_output\"]: expected true or false"));
  EXPECT_THAT(ErrorOf(R"({"inputs": [], "parameters": {"causal": [true]}})"),
              HasSubstr("parameters[\"causal\"]: expected a boolean, number or string, got an "
                        "array"));
}

TEST(RestConversionTest, BinarySizesMustAddUpToTheBody) {
  const std::string json = R"({"inputs": [{"name": "input", "shape": [2], "datatype": "FP32",)"
                           R"( "parameters": {"binary_data_size": 8}}]})";
  EXPECT_THAT(ErrorOf(json + std::string(4, '\0'), json.size()),
              HasSubstr("binary_data_size: expected at most the 4 bytes of binary data left"));
  EXPECT_THAT(ErrorOf(json + std::string(12, '\0'), json.size()),
              HasSubstr("expected 8 bytes of binary data after the JSON header"));
  // Binary data without the header that says where the JSON ends.
  EXPECT_THAT(ErrorOf(json + std::string(8, '\0')),
              HasSubstr("Inference-Header-Content-Length: expected the JSON header's length in "
                        "bytes (inputs[\"input\"] has binary data after it), got none"));

  EXPECT_TRUE(ParseHeaderLength("12", 12).ok());
  for (const char* bad : {"", "13", "-1", "1x", " 5", "99999999999999999999999"}) {
    absl::StatusOr<size_t> length = ParseHeaderLength(bad, 12);
    ASSERT_FALSE(length.ok()) << bad;
    EXPECT_THAT(length.status().message(),
                HasSubstr("Inference-Header-Content-Length: expected the JSON header's length"));
  }
}

inference::ModelInferResponse Response(const std::vector<float>& values, bool raw) {
  inference::ModelInferResponse response;
  response.set_model_name("demo");
  response.set_model_version("1");
  response.set_id("r\"1");
  (*response.mutable_parameters())["queue_us"].set_int64_param(12);
  auto* output = response.add_outputs();
  output->set_name("output");
  output->set_datatype("FP32");
  output->add_shape(static_cast<int64_t>(values.size()));
  if (raw) {
    response.add_raw_output_contents(Bytes(values.data(), values.size() * sizeof(float)));
  } else {
    output->mutable_contents()->mutable_fp32_contents()->Add(values.begin(), values.end());
  }
  return response;
}

TEST(RestConversionTest, JsonAnswersReadBackAsTheSameFp32Values) {
  std::mt19937 random(5);
  std::vector<float> values = {0.0f,
                               -0.0f,
                               std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::max(),
                               -std::numeric_limits<float>::max(),
                               0.1f,
                               1.0f / 3.0f};
  std::uniform_int_distribution<uint32_t> bits;
  while (values.size() < 2000) {
    const uint32_t word = bits(random);
    float value;
    std::memcpy(&value, &word, sizeof(value));
    if (std::isfinite(value)) values.push_back(value);
  }
  for (bool raw : {false, true}) {
    RestBody body = WriteInferResponse(Response(values, raw), BinaryOutputs{});
    EXPECT_FALSE(body.json_length.has_value());
    nlohmann::json parsed = nlohmann::json::parse(body.bytes);
    EXPECT_EQ(parsed["model_name"], "demo");
    EXPECT_EQ(parsed["id"], "r\"1");
    EXPECT_EQ(parsed["parameters"]["queue_us"], 12);
    EXPECT_EQ(parsed["outputs"][0]["shape"], nlohmann::json::array({values.size()}));
    const nlohmann::json& data = parsed["outputs"][0]["data"];
    ASSERT_EQ(data.size(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      const float back = static_cast<float>(data[i].get<double>());
      EXPECT_EQ(std::memcmp(&back, &values[i], sizeof(float)), 0)
          << i << ": " << values[i] << " came back as " << back;
    }
  }
}

TEST(RestConversionTest, BinaryAnswersFollowTheJsonHeader) {
  const std::vector<float> values = {1.0f, -2.5f, 3.25f};
  for (bool raw : {false, true}) {
    RestBody body = WriteInferResponse(Response(values, raw), BinaryOutputs{.output = true});
    ASSERT_TRUE(body.json_length.has_value());
    ASSERT_EQ(body.bytes.size(), *body.json_length + 12);
    nlohmann::json header = nlohmann::json::parse(body.bytes.substr(0, *body.json_length));
    EXPECT_EQ(header["outputs"][0]["parameters"]["binary_data_size"], 12);
    EXPECT_FALSE(header["outputs"][0].contains("data"));
    EXPECT_EQ(body.bytes.substr(*body.json_length), Bytes(values.data(), 12));
  }
}

TEST(RestConversionTest, StatusesMapToTheProtocolsHttpCodes) {
  using server::oip_rest::HttpStatusOf;
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kUnavailable), 503);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(HttpStatusOf(absl::StatusCode::kInternal), 500);
  EXPECT_EQ(server::oip_rest::ErrorJson("bad \"x\""), R"({"error":"bad \"x\""})");
}

}  // namespace
}  // namespace attnserve::testing::rest_conversion_test
