// The Open Inference Protocol's conversion (server/conversion/oip/): a ModelInferRequest becomes
// exactly the AttendWork of the equivalent attnserve.v1 request; every malformed one is refused
// naming the tensor or parameter; answers hold the requested outputs, raw or typed.
#include "server/conversion/oip/oip_conversion.h"

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.pb.h"
#include "tests/server/conversion/conversion_test_support.h"

namespace attnserve::testing::oip_conversion_test {
namespace {

using server::AttendResult;
using server::AttendWork;
using server::oip::InferAnswer;
using ::testing::HasSubstr;
using InferRequest = inference::ModelInferRequest;

std::string Bytes(const void* data, size_t size) {
  return std::string(static_cast<const char*>(data), size);
}

// Adds tensor `name` with `values` (as float, int32 or bool bytes / contents by datatype).
void AddInput(InferRequest* request, const std::string& name, const std::string& datatype,
              const std::vector<int64_t>& shape, const std::vector<float>& values, bool raw) {
  auto* tensor = request->add_inputs();
  tensor->set_name(name);
  tensor->set_datatype(datatype);
  for (int64_t dim : shape) tensor->add_shape(dim);
  if (datatype == "FP32") {
    if (raw) {
      request->add_raw_input_contents(Bytes(values.data(), values.size() * sizeof(float)));
    } else {
      for (float v : values) tensor->mutable_contents()->add_fp32_contents(v);
    }
  } else if (datatype == "INT32") {
    std::vector<int32_t> ints(values.begin(), values.end());
    if (raw) {
      request->add_raw_input_contents(Bytes(ints.data(), ints.size() * sizeof(int32_t)));
    } else {
      for (int32_t v : ints) tensor->mutable_contents()->add_int_contents(v);
    }
  } else {
    std::string flags;
    for (float v : values) flags.push_back(v != 0 ? 1 : 0);
    if (raw) {
      request->add_raw_input_contents(flags);
    } else {
      for (char f : flags) tensor->mutable_contents()->add_bool_contents(f != 0);
    }
  }
}

std::vector<float> Floats(const v1::Tensor& tensor) {
  return tensor.raw().empty() ? std::vector<float>(tensor.values().begin(), tensor.values().end())
                              : RawFloats(tensor);
}

// Rank3Request() (cross-attention, every field) in the Open Inference Protocol.
InferRequest Rank3InferRequest(bool raw) {
  const v1::AttendRequest v1 = Rank3Request();
  InferRequest request;
  request.set_id("r7");
  AddInput(&request, "input", "FP32", {2, 3, kD}, Floats(v1.input()), raw);
  AddInput(&request, "memory", "FP32", {2, 4, kD}, Floats(v1.memory()), raw);
  AddInput(&request, "lengths", "INT32", {2}, {3, 2}, raw);
  AddInput(&request, "memory_lengths", "INT32", {2}, {4, 1}, raw);
  AddInput(&request, "attn_mask", "BOOL", {2, 3, 4}, Floats(v1.attn_mask()), raw);
  std::string heads;
  for (bool h : v1.head_mask()) heads += h ? "1," : "0,";
  (*request.mutable_parameters())["head_mask"].set_string_param(heads);
  (*request.mutable_parameters())["return_weights"].set_bool_param(v1.return_weights());
  (*request.mutable_parameters())["causal"].set_bool_param(v1.mask() == v1::MASK_CAUSAL);
  return request;
}

absl::StatusOr<AttendWork> ParseInfer(InferRequest request, InferAnswer* answer = nullptr) {
  InferAnswer unused;
  return server::oip::ParseModelInferRequest(&request, TinyModel(), {},
                                             answer == nullptr ? &unused : answer);
}

void ExpectInvalid(const InferRequest& request, const std::vector<std::string>& fragments) {
  const absl::StatusOr<AttendWork> work = ParseInfer(request);
  ASSERT_FALSE(work.ok());
  EXPECT_EQ(work.status().code(), absl::StatusCode::kInvalidArgument) << work.status();
  for (const std::string& fragment : fragments) {
    EXPECT_THAT(std::string(work.status().message()), HasSubstr(fragment));
  }
}

TEST(OipConversionTest, RawAndTypedRequestsGiveTheAttendWork) {
  const absl::StatusOr<AttendWork> expected = Parse(Rank3Request());
  ASSERT_TRUE(expected.ok()) << expected.status();
  for (bool raw : {true, false}) {
    InferAnswer answer;
    const absl::StatusOr<AttendWork> work = ParseInfer(Rank3InferRequest(raw), &answer);
    ASSERT_TRUE(work.ok()) << work.status();
    EXPECT_EQ(Bits(work->query), Bits(expected->query));
    EXPECT_EQ(Bits(work->memory), Bits(expected->memory));
    EXPECT_EQ(work->query_lengths, expected->query_lengths);
    EXPECT_EQ(work->memory_lengths, expected->memory_lengths);
    EXPECT_EQ(work->explicit_mask, expected->explicit_mask);
    EXPECT_EQ(work->head_mask, expected->head_mask);
    EXPECT_EQ(work->causal, expected->causal);
    EXPECT_EQ(work->return_weights, expected->return_weights);
    EXPECT_EQ(work->request_id, "r7");
    EXPECT_EQ(answer.raw, raw);
    EXPECT_TRUE(answer.output);
    EXPECT_EQ(answer.weights, expected->return_weights);
  }
}

// BF16 / FP16 raw inputs are widened as attnserve.v1's Tensor.dtype is: the values here are
// exact in both formats (memory's 1000.. only in FP16), so the work equals the float32 one.
TEST(OipConversionTest, SixteenBitRawInputsGiveTheSameWork) {
  const absl::StatusOr<AttendWork> expected = Parse(Rank3Request());
  ASSERT_TRUE(expected.ok()) << expected.status();
  const v1::AttendRequest v1 = Rank3Request();
  for (v1::DataType dtype : {v1::DATA_TYPE_BF16, v1::DATA_TYPE_FP16}) {
    const std::string datatype = dtype == v1::DATA_TYPE_BF16 ? "BF16" : "FP16";
    SCOPED_TRACE(datatype);
    InferRequest request = Rank3InferRequest(true);
    v1::Tensor encoded;
    SetRawTensor(&encoded, {2, 3, kD}, Floats(v1.input()), dtype);
    request.mutable_inputs(0)->set_datatype(datatype);
    *request.mutable_raw_input_contents(0) = encoded.raw();
    if (dtype == v1::DATA_TYPE_FP16) {
      SetRawTensor(&encoded, {2, 4, kD}, Floats(v1.memory()), dtype);
      request.mutable_inputs(1)->set_datatype(datatype);
      *request.mutable_raw_input_contents(1) = encoded.raw();
    }
    const absl::StatusOr<AttendWork> work = ParseInfer(request);
    ASSERT_TRUE(work.ok()) << work.status();
    EXPECT_EQ(Bits(work->query), Bits(expected->query));
    EXPECT_EQ(Bits(work->memory), Bits(expected->memory));
  }
}

TEST(OipConversionTest, RequestedOutputsDecideTheAnswer) {
  InferRequest request = Rank3InferRequest(true);
  request.mutable_parameters()->erase("return_weights");
  request.add_outputs()->set_name("weights");
  InferAnswer answer;
  const absl::StatusOr<AttendWork> work = ParseInfer(request, &answer);
  ASSERT_TRUE(work.ok()) << work.status();
  EXPECT_FALSE(answer.output);
  EXPECT_TRUE(answer.weights);
  EXPECT_TRUE(work->return_weights);
}

TEST(OipConversionTest, MalformedRequestsNameTheTensorOrParameter) {
  InferRequest request = Rank3InferRequest(true);
  request.mutable_inputs(0)->set_datatype("FP64");
  ExpectInvalid(request, {"inputs[\"input\"].datatype", "FP32, BF16 or FP16", "FP64"});

  // FP16 declared over float32 bytes: twice the bytes the shape needs.
  request = Rank3InferRequest(true);
  request.mutable_inputs(0)->set_datatype("FP16");
  ExpectInvalid(request, {"inputs[\"input\"]", "expected 96 bytes (48 FP16 elements", "got 192"});

  // BF16 has no typed contents in the protocol.
  request = Rank3InferRequest(false);
  request.mutable_inputs(1)->set_datatype("BF16");
  ExpectInvalid(request, {"inputs[\"memory\"].datatype", "BF16 only in raw_input_contents"});

  request = Rank3InferRequest(true);
  request.mutable_raw_input_contents(1)->resize(12);
  ExpectInvalid(request, {"inputs[\"memory\"]", "256 bytes", "got 12"});

  request = Rank3InferRequest(false);
  request.mutable_inputs(2)->mutable_contents()->add_int_contents(1);
  ExpectInvalid(request, {"inputs[\"lengths\"].contents.int_contents", "expected 2", "got 3"});

  request = Rank3InferRequest(true);
  request.mutable_inputs(4)->set_datatype("FP32");
  ExpectInvalid(request, {"inputs[\"attn_mask\"].datatype", "BOOL or UINT8"});

  request = Rank3InferRequest(true);
  request.mutable_inputs(3)->set_name("lengths");
  ExpectInvalid(request, {"inputs[3].name", "once", "lengths"});

  request = Rank3InferRequest(true);
  request.mutable_inputs(3)->set_name("keys");
  ExpectInvalid(request, {"inputs[3].name", "keys"});

  request = Rank3InferRequest(true);
  request.mutable_raw_input_contents()->RemoveLast();
  ExpectInvalid(request, {"raw_input_contents", "expected 5", "got 4"});

  request = Rank3InferRequest(true);
  request.mutable_inputs(0)->set_shape(1, -1);
  ExpectInvalid(request, {"inputs[\"input\"].shape[1]", "> 0", "-1"});

  request = Rank3InferRequest(true);
  (*request.mutable_parameters())["causal"].set_int64_param(1);
  ExpectInvalid(request, {"parameters[\"causal\"]", "bool_param", "int64_param"});

  request = Rank3InferRequest(true);
  (*request.mutable_parameters())["head_mask"].set_string_param("1,x");
  ExpectInvalid(request, {"parameters[\"head_mask\"]", "1,x"});

  request = Rank3InferRequest(true);
  (*request.mutable_parameters())["priority"].set_int64_param(1);
  ExpectInvalid(request, {"parameters[\"priority\"]", "causal, head_mask, return_weights"});

  request = Rank3InferRequest(true);
  request.add_outputs()->set_name("attention");
  ExpectInvalid(request, {"outputs[0].name", "output or weights", "attention"});

  request = Rank3InferRequest(true);
  request.mutable_inputs(0)->set_shape(2, 4);
  request.set_raw_input_contents(0, std::string(2 * 3 * 4 * 4, '\0'));
  ExpectInvalid(request, {"input.shape[2]", "d_model 8", "got 4"});

  ExpectInvalid(InferRequest(), {"inputs", "\"input\""});
}

// Every client string an error quotes is cut (EchoForMessage): a 1 MB name must not make a 1 MB
// status message, which the client's 8 KiB metadata limit would turn into RESOURCE_EXHAUSTED.
TEST(OipConversionTest, ErrorsQuoteClientStringsBounded) {
  const std::string huge(1 << 20, 'z');
  const std::vector<std::function<void(InferRequest*)>> mutations = {
      [&](InferRequest* r) { r->mutable_inputs(0)->set_datatype(huge); },
      [&](InferRequest* r) { r->mutable_inputs(4)->set_datatype(huge); },
      [&](InferRequest* r) { r->mutable_inputs(2)->set_datatype(huge); },
      [&](InferRequest* r) { r->mutable_inputs(3)->set_name(huge); },
      [&](InferRequest* r) { r->add_outputs()->set_name(huge); },
      [&](InferRequest* r) { (*r->mutable_parameters())[huge].set_bool_param(true); },
      [&](InferRequest* r) { (*r->mutable_parameters())["head_mask"].set_string_param(huge); },
      [&](InferRequest* r) { r->set_model_version(huge); },
  };
  for (size_t i = 0; i < mutations.size(); ++i) {
    InferRequest request = Rank3InferRequest(true);
    mutations[i](&request);
    const absl::Status status = ParseInfer(request).status();
    EXPECT_FALSE(status.ok()) << i;
    EXPECT_LT(status.message().size(), 1024u) << i << ": " << status.message().substr(0, 300);
    EXPECT_THAT(std::string(status.message()), HasSubstr("(1048576 bytes)")) << i;
  }
}

// A shape whose element count fits in int64 but whose byte size does not is refused, never
// compared with a wrapped product.
TEST(OipConversionTest, RawSizeOfAHugeShapeDoesNotOverflow) {
  InferRequest request = Rank3InferRequest(true);
  // lengths: INT32, 4 bytes each; 2^62 + 2^61 elements are more than 2^63 bytes.
  request.mutable_inputs(2)->set_shape(0, (int64_t{1} << 62) + (int64_t{1} << 61));
  ExpectInvalid(request, {"inputs[\"lengths\"] (raw_input_contents)", "more than 2^63 bytes"});
  // 2^62 elements of 4 bytes wrap to exactly 0 in int64: an empty raw entry must not match.
  request = Rank3InferRequest(true);
  request.mutable_inputs(2)->set_shape(0, int64_t{1} << 62);
  request.mutable_raw_input_contents(2)->clear();
  ExpectInvalid(request, {"inputs[\"lengths\"] (raw_input_contents)", "more than 2^63 bytes"});
}

TEST(OipConversionTest, OtherModelVersionIsNotFound) {
  InferRequest request = Rank3InferRequest(true);
  request.set_model_version("2");
  EXPECT_EQ(ParseInfer(request).status().code(), absl::StatusCode::kNotFound);
  request.set_model_version("3");
  EXPECT_TRUE(ParseInfer(request).ok());
}

// An answer whose every value is distinct, for `work`.
struct FakeResult {
  std::vector<float> output;
  std::vector<float> weights;
  AttendResult result;
};

FakeResult Answer(const AttendWork& work) {
  FakeResult fake;
  int64_t rows = 0;
  int64_t weight_count = 0;
  for (int64_t b = 0; b < work.sequences(); ++b) {
    rows += work.query_lengths[b];
    weight_count += kHeads * work.query_lengths[b] * work.memory_lengths[b];
  }
  fake.output = Sequential(rows * kD, 1.0f);
  fake.weights = Sequential(weight_count, 0.5f);
  fake.result.output = fake.output;
  if (work.return_weights) fake.result.weights = fake.weights;
  return fake;
}

TEST(OipConversionTest, AnswersRawOrTypedAsTheRequest) {
  for (bool raw : {true, false}) {
    InferAnswer answer;
    const absl::StatusOr<AttendWork> work = ParseInfer(Rank3InferRequest(raw), &answer);
    ASSERT_TRUE(work.ok()) << work.status();
    const FakeResult fake = Answer(*work);
    inference::ModelInferResponse response;
    ASSERT_TRUE(server::oip::FillModelInferResponse(*work, fake.result, answer, &response).ok());
    EXPECT_EQ(response.model_name(), "tiny");
    EXPECT_EQ(response.model_version(), "3");
    EXPECT_EQ(response.id(), "r7");
    ASSERT_EQ(response.outputs_size(), 2);
    EXPECT_EQ(response.outputs(0).name(), "output");
    EXPECT_EQ(response.outputs(0).datatype(), "FP32");
    EXPECT_THAT(response.outputs(0).shape(), ::testing::ElementsAre(2, 3, kD));
    EXPECT_EQ(response.outputs(1).name(), "weights");
    EXPECT_THAT(response.outputs(1).shape(), ::testing::ElementsAre(2, kHeads, 3, 4));
    // The same padded values attnserve.v1 answers.
    v1::AttendResponse v1;
    ASSERT_TRUE(server::FillAttendResponse(*work, fake.result, &v1).ok());
    std::vector<float> output;
    if (raw) {
      ASSERT_EQ(response.raw_output_contents_size(), 2);
      EXPECT_EQ(response.raw_output_contents(0), v1.output().raw());
      EXPECT_EQ(response.raw_output_contents(1), v1.weights().raw());
    } else {
      EXPECT_EQ(response.raw_output_contents_size(), 0);
      const auto& values = response.outputs(0).contents().fp32_contents();
      EXPECT_EQ(Bits({values.begin(), values.end()}), Bits(RawFloats(v1.output())));
    }
  }
}

TEST(OipConversionTest, AnswerHoldsOnlyTheRequestedOutputs) {
  InferRequest request = Rank3InferRequest(true);
  request.add_outputs()->set_name("weights");
  InferAnswer answer;
  const absl::StatusOr<AttendWork> work = ParseInfer(request, &answer);
  ASSERT_TRUE(work.ok()) << work.status();
  const FakeResult fake = Answer(*work);
  inference::ModelInferResponse response;
  ASSERT_TRUE(server::oip::FillModelInferResponse(*work, fake.result, answer, &response).ok());
  ASSERT_EQ(response.outputs_size(), 1);
  EXPECT_EQ(response.outputs(0).name(), "weights");
  EXPECT_EQ(response.raw_output_contents_size(), 1);
}

TEST(OipConversionTest, MetadataDescribesTheModel) {
  inference::ModelMetadataResponse metadata;
  server::oip::FillModelMetadata(*TinyModel(), &metadata);
  EXPECT_EQ(metadata.name(), "tiny");
  EXPECT_THAT(metadata.versions(), ::testing::ElementsAre("3"));
  EXPECT_EQ(metadata.platform(), "attnserve_onednn");
  ASSERT_EQ(metadata.inputs_size(), 5);
  EXPECT_EQ(metadata.inputs(0).name(), "input");
  EXPECT_THAT(metadata.inputs(0).shape(), ::testing::ElementsAre(-1, -1, kD));
  ASSERT_EQ(metadata.outputs_size(), 2);
  EXPECT_THAT(metadata.outputs(1).shape(), ::testing::ElementsAre(-1, kHeads, -1, -1));
}

}  // namespace
}  // namespace attnserve::testing::oip_conversion_test
