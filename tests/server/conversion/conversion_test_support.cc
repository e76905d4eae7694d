#include "tests/server/conversion/conversion_test_support.h"

#include <bit>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "core/forward/attention_config.h"
#include "core/forward/attention_layer.h"
#include "core/forward/attention_weights.h"
#include "core/util/float_format.h"
#include "gtest/gtest.h"

namespace attnserve::testing {

std::shared_ptr<const model::Model> TinyModel() {
  static const std::shared_ptr<const model::Model> tiny = [] {
    const core::AttentionConfig config{.d_model = kD, .num_heads = kHeads, .bias = true};
    auto layer = core::AttentionLayer::Create(config, core::MakeRandomWeights(config, 7));
    EXPECT_TRUE(layer.ok()) << layer.status();
    auto model = std::make_shared<model::Model>();
    model->name = "tiny";
    model->config.attention = config;
    model->layer = layer.ok() ? *layer : nullptr;
    model->source = "embedded";
    model->version = 3;
    return std::shared_ptr<const model::Model>(std::move(model));
  }();
  return tiny;
}

server::AttendResult ResultFor(const server::AttendWork& work) {
  struct Buffers {
    std::vector<float> output, weights;
  };
  auto buffers = std::make_shared<Buffers>();
  buffers->output = Sequential(work.tokens() * kD, 0.5f);
  if (work.return_weights) {
    int64_t scores = 0;
    for (int64_t b = 0; b < work.sequences(); ++b) {
      const auto& keys = work.cross_attention ? work.memory_lengths : work.query_lengths;
      scores += work.query_lengths[b] * keys[b];
    }
    for (float v : Sequential(kHeads * scores)) buffers->weights.push_back(-1.0f - v);
  }
  server::AttendResult result;
  result.output = buffers->output;
  result.weights = buffers->weights;
  result.storage = buffers;
  result.timing = {.queue_us = 11, .compute_us = 22, .batch_sequences = 5, .batch_tokens = 77};
  return result;
}

std::vector<float> Sequential(int64_t count, float start) {
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[i] = start + static_cast<float>(i);
  return values;
}

void SetTensor(v1::Tensor* tensor, const std::vector<int64_t>& shape,
               const std::vector<float>& values, bool raw) {
  tensor->Clear();
  for (int64_t dim : shape) tensor->add_shape(dim);
  if (raw) {
    tensor->set_raw(
        std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  } else {
    tensor->mutable_values()->Add(values.begin(), values.end());
  }
}

void SetSequential(v1::Tensor* tensor, const std::vector<int64_t>& shape, float start, bool raw) {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  SetTensor(tensor, shape, Sequential(count, start), raw);
}

void SetRawTensor(v1::Tensor* tensor, const std::vector<int64_t>& shape,
                  const std::vector<float>& values, v1::DataType dtype) {
  const FloatFormat format = FloatFormatNumbered(dtype).value();
  tensor->Clear();
  for (int64_t dim : shape) tensor->add_shape(dim);
  tensor->set_dtype(dtype);
  std::string* raw = tensor->mutable_raw();
  raw->resize(values.size() * static_cast<size_t>(FloatFormatBytes(format)));
  EncodeFloats(values, format, raw->data());
}

std::vector<float> RawFloats(const v1::Tensor& tensor) {
  const FloatFormat format = FloatFormatNumbered(tensor.dtype()).value();
  std::vector<float> values(tensor.raw().size() / static_cast<size_t>(FloatFormatBytes(format)));
  DecodeFloats(tensor.raw().data(), static_cast<int64_t>(values.size()), format, values.data());
  return values;
}

std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits;
  for (float value : values) bits.push_back(std::bit_cast<uint32_t>(value));
  return bits;
}

v1::AttendRequest Rank3Request() {
  v1::AttendRequest request;
  SetSequential(request.mutable_input(), {2, 3, kD});
  request.add_lengths(3);
  request.add_lengths(2);
  SetSequential(request.mutable_memory(), {2, 4, kD}, 1000.0f);
  request.add_memory_lengths(4);
  request.add_memory_lengths(1);
  SetTensor(request.mutable_attn_mask(), {2, 3, 4}, std::vector<float>(24, 1.0f));
  request.add_head_mask(true);
  request.add_head_mask(false);
  request.set_return_weights(true);
  return request;
}

v1::AttendRequest Rank2Request() {
  v1::AttendRequest request;
  SetSequential(request.mutable_input(), {3, kD});
  SetTensor(request.mutable_attn_mask(), {3, 3}, std::vector<float>(9, 1.0f));
  return request;
}

absl::StatusOr<server::AttendWork> Parse(const v1::AttendRequest& request,
                                         const server::ModelLimits& limits) {
  return server::ParseAttendRequest(request, TinyModel(), limits);
}

}  // namespace attnserve::testing
