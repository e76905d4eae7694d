// Unary Attend end to end: the server's answer equals what the core computes on the same layer,
// for every kind of request, in values and raw form; plus ListModels/GetModel.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/server/service/server_test_support.h"

namespace attnserve::testing {
namespace {

using ::testing::ElementsAre;

class AttendTest : public ServerTest {
 protected:
  void SetUp() override { StartServer(); }
};

TEST_F(AttendTest, OneSequenceEqualsTheCore) {
  for (bool raw : {false, true}) {
    SCOPED_TRACE(raw ? "raw" : "values");
    v1::AttendRequest request = MakeRequest(kSmallModel, 5, kSmallWidth, 1, raw);
    request.set_request_id("r-1");
    request.set_raw_output(raw);
    v1::AttendResponse response;
    ASSERT_TRUE(Attend(request, &response).ok());
    EXPECT_THAT(TensorShape(response.output()), ElementsAre(5, kSmallWidth));
    EXPECT_EQ(raw, !response.output().raw().empty());
    EXPECT_EQ(response.request_id(), "r-1");
    EXPECT_EQ(response.model(), kSmallModel);
    EXPECT_EQ(response.model_version(), 1);
    EXPECT_EQ(response.timing().batch_sequences(), 1);
    EXPECT_EQ(response.timing().batch_tokens(), 5);
    EXPECT_GT(response.timing().compute_us(), 0);
    const CoreAnswer expected =
        CoreCompute(*Layer(kSmallModel), {.query = TestValues(5 * kSmallWidth, 1)});
    EXPECT_TRUE(Near(TensorValues(response.output()), expected.output));
  }
}

TEST_F(AttendTest, PaddedBatchEqualsTheCorePerSequenceWithZeroPadding) {
  const std::vector<int64_t> lengths = {3, 6, 1};
  const v1::AttendRequest request = MakeBatchedRequest(kSmallModel, lengths, kSmallWidth, 2);
  v1::AttendResponse response;
  ASSERT_TRUE(Attend(request, &response).ok());
  ASSERT_THAT(TensorShape(response.output()), ElementsAre(3, 6, kSmallWidth));
  const std::vector<float> input = TensorValues(request.input());
  const std::vector<float> output = TensorValues(response.output());
  for (size_t b = 0; b < lengths.size(); ++b) {
    SCOPED_TRACE(b);
    const size_t at = b * 6 * kSmallWidth;
    const size_t valid = lengths[b] * kSmallWidth;
    const CoreAnswer expected =
        CoreCompute(*Layer(kSmallModel),
                    {.query = std::vector<float>(input.begin() + at, input.begin() + at + valid)});
    EXPECT_TRUE(Near({output.begin() + at, output.begin() + at + valid}, expected.output));
    for (size_t i = at + valid; i < at + 6 * kSmallWidth; ++i) ASSERT_EQ(output[i], 0.0f) << i;
  }
  EXPECT_EQ(response.timing().batch_tokens(), 10);
}

TEST_F(AttendTest, CausalCrossAttentionWithMasksAndWeightsEqualsTheCore) {
  const int64_t t = 4, s = 6;
  v1::AttendRequest request = MakeRequest(kSmallModel, t, kSmallWidth, 3);
  const std::vector<float> memory = TestValues(s * kSmallWidth, 4);
  request.mutable_memory()->add_shape(s);
  request.mutable_memory()->add_shape(kSmallWidth);
  SetRaw(memory, request.mutable_memory());
  request.set_mask(v1::MASK_CAUSAL);
  std::vector<uint8_t> mask(t * s);
  request.mutable_attn_mask()->add_shape(t);
  request.mutable_attn_mask()->add_shape(s);
  for (int64_t i = 0; i < t * s; ++i) {
    mask[i] = (i % 5) != 2;
    request.mutable_attn_mask()->add_values(mask[i] ? 1.0f : 0.0f);
  }
  request.add_head_mask(true);
  request.add_head_mask(false);
  request.set_return_weights(true);
  v1::AttendResponse response;
  ASSERT_TRUE(Attend(request, &response).ok());
  const CoreAnswer expected =
      CoreCompute(*Layer(kSmallModel), {.query = TestValues(t * kSmallWidth, 3),
                                        .memory = memory,
                                        .causal = true,
                                        .mask = mask,
                                        .head_mask = {true, false},
                                        .weights = true});
  EXPECT_TRUE(Near(TensorValues(response.output()), expected.output));
  EXPECT_THAT(TensorShape(response.weights()), ElementsAre(kSmallHeads, t, s));
  EXPECT_TRUE(Near(TensorValues(response.weights()), expected.weights));
}

TEST_F(AttendTest, NativeSingleHeadModelEqualsTheCore) {
  const v1::AttendRequest request = MakeRequest(kSingleModel, 7, kSingleWidth, 5);
  v1::AttendResponse response;
  ASSERT_TRUE(Attend(request, &response).ok());
  EXPECT_TRUE(
      Near(TensorValues(response.output()),
           CoreCompute(*Layer(kSingleModel), {.query = TestValues(7 * kSingleWidth, 5)}).output));
}

TEST_F(AttendTest, ListAndGetModelDescribeEveryServingModel) {
  grpc::ClientContext list_context;
  v1::ListModelsResponse list;
  ASSERT_TRUE(stub().ListModels(&list_context, {}, &list).ok());
  ASSERT_EQ(list.models_size(), 2);
  const v1::ModelInfo& single = list.models(0);
  EXPECT_EQ(single.name(), kSingleModel);
  EXPECT_EQ(single.variant(), "single_head");
  EXPECT_EQ(single.parameter_count(), 3 * kSingleWidth * kSingleWidth);
  const v1::ModelInfo& small = list.models(1);
  EXPECT_EQ(small.name(), kSmallModel);
  EXPECT_EQ(small.d_model(), kSmallWidth);
  EXPECT_EQ(small.num_heads(), kSmallHeads);
  EXPECT_TRUE(small.bias());
  EXPECT_EQ(small.dtype(), "fp32");
  EXPECT_EQ(small.parameter_count(), 4 * kSmallWidth * kSmallWidth + 4 * kSmallWidth);
  const server::ServerOptions defaults = TestServerOptions();
  EXPECT_EQ(small.batching().max_batch_sequences(),
            defaults.model_limits.batching.max_batch_sequences);
  EXPECT_EQ(small.batching().max_queue_size(), defaults.model_limits.batching.max_queue_size);
  EXPECT_EQ(small.max_sequence_length(), defaults.model_limits.request.max_sequence_length);
  EXPECT_FALSE(small.is_default());  // Two models, none named demo.

  grpc::ClientContext get_context;
  v1::GetModelRequest get;
  get.set_name(kSmallModel);
  v1::ModelInfo info;
  ASSERT_TRUE(stub().GetModel(&get_context, get, &info).ok());
  EXPECT_EQ(info.SerializeAsString(), small.SerializeAsString());

  grpc::ClientContext missing_context;
  get.set_name("nope");
  const grpc::Status missing = stub().GetModel(&missing_context, get, &info);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(missing.error_message(), ::testing::HasSubstr("nope"));
  EXPECT_THAT(missing.error_message(), ::testing::HasSubstr(kSmallModel));
}

}  // namespace
}  // namespace attnserve::testing
