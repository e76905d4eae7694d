#include "tests/server/service/server_test_support.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/forward/attention_batch.h"
#include "core/forward/attention_executor.h"
#include "core/forward/attention_weights.h"
#include "core/model/model_writer.h"
#include "core/model/weight_naming.h"

namespace attnserve::testing {
namespace {

model::ModelConfig Config(int64_t d_model, int64_t heads, core::AttentionVariant variant,
                          bool bias) {
  model::ModelConfig config;
  config.attention = {.d_model = d_model, .num_heads = heads, .variant = variant, .bias = bias};
  return config;
}

}  // namespace

server::ServerOptions TestServerOptions() {
  server::ServerOptions options;
  options.grpc_address = "127.0.0.1:0";
  options.metrics_address = "127.0.0.1:0";
  options.http.address = "127.0.0.1:0";
  options.model_poll_interval_ms = 0;
  options.repository.demo_model = repository::DemoModelPolicy::kNever;
  options.model_limits.batching.max_queue_delay_us = 0;
  options.runner.compute_threads = 1;
  return options;
}

ServerTest::~ServerTest() { StopServer(); }

void ServerTest::StartServer(server::ServerOptions options) {
  if (!repository_written_) {
    const model::ModelConfig small =
        Config(kSmallWidth, kSmallHeads, core::AttentionVariant::kMultiHead, true);
    const model::ModelConfig single =
        Config(kSingleWidth, 1, core::AttentionVariant::kSingleHead, false);
    ASSERT_TRUE(model::WriteModelFolder(repository() / kSmallModel, small,
                                        core::MakeRandomWeights(small.attention, 11),
                                        model::WeightNaming::kSeed, model::TensorDtype::kF32)
                    .ok());
    ASSERT_TRUE(model::WriteModelFolder(repository() / kSingleModel, single,
                                        core::MakeRandomWeights(single.attention, 12),
                                        model::WeightNaming::kSeed, model::TensorDtype::kF32)
                    .ok());
    repository_written_ = true;
  }
  options.grpc_address = "127.0.0.1:0";
  options.repository.root = repository();
  absl::StatusOr<std::unique_ptr<server::Server>> started = server::Server::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  server_ = *std::move(started);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  channel_ = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                       grpc::InsecureChannelCredentials(), args);
  stub_ = v1::AttentionService::NewStub(channel_);
}

void ServerTest::StopServer() {
  if (server_ != nullptr) server_->Shutdown(absl::Seconds(10));
  stub_.reset();
  channel_.reset();
  server_.reset();
}

std::shared_ptr<const core::AttentionLayer> ServerTest::Layer(const std::string& model) {
  absl::StatusOr<server::ModelRoute> route = server_->router().Route(model);
  EXPECT_TRUE(route.ok()) << route.status();
  return route.ok() ? route->model->layer : nullptr;
}

grpc::Status ServerTest::Attend(const v1::AttendRequest& request, v1::AttendResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return stub_->Attend(&context, request, response);
}

std::vector<float> TestValues(size_t count, uint64_t seed) {
  std::vector<float> values(count);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& value : values) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    value = static_cast<float>(static_cast<double>(state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
  }
  return values;
}

void SetRaw(const std::vector<float>& values, v1::Tensor* tensor) {
  tensor->clear_values();
  tensor->mutable_raw()->resize(values.size() * sizeof(float));
  std::memcpy(tensor->mutable_raw()->data(), values.data(), values.size() * sizeof(float));
}

v1::AttendRequest MakeRequest(const std::string& model, int64_t length, int64_t width,
                              uint64_t seed, bool raw) {
  v1::AttendRequest request;
  request.set_model(model);
  request.mutable_input()->add_shape(length);
  request.mutable_input()->add_shape(width);
  const std::vector<float> values = TestValues(static_cast<size_t>(length * width), seed);
  if (raw) {
    SetRaw(values, request.mutable_input());
  } else {
    request.mutable_input()->mutable_values()->Add(values.begin(), values.end());
  }
  return request;
}

v1::AttendRequest MakeBatchedRequest(const std::string& model, const std::vector<int64_t>& lengths,
                                     int64_t width, uint64_t seed) {
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  v1::AttendRequest request;
  request.set_model(model);
  for (int64_t dim : {static_cast<int64_t>(lengths.size()), longest, width}) {
    request.mutable_input()->add_shape(dim);
  }
  const std::vector<float> values =
      TestValues(static_cast<size_t>(lengths.size() * longest * width), seed);
  request.mutable_input()->mutable_values()->Add(values.begin(), values.end());
  for (int64_t length : lengths) request.add_lengths(static_cast<int32_t>(length));
  return request;
}

std::vector<float> TensorValues(const v1::Tensor& tensor) {
  if (!tensor.raw().empty()) {
    std::vector<float> values(tensor.raw().size() / sizeof(float));
    std::memcpy(values.data(), tensor.raw().data(), values.size() * sizeof(float));
    return values;
  }
  return {tensor.values().begin(), tensor.values().end()};
}

std::vector<int64_t> TensorShape(const v1::Tensor& tensor) {
  return {tensor.shape().begin(), tensor.shape().end()};
}

CoreAnswer CoreCompute(const core::AttentionLayer& layer, const CoreCase& c) {
  const int64_t d = layer.config().d_model;
  const int64_t t = static_cast<int64_t>(c.query.size()) / d;
  const int64_t s = c.memory.empty() ? t : static_cast<int64_t>(c.memory.size()) / d;
  const std::vector<int64_t> query_offsets = {0, t};
  const std::vector<int64_t> memory_offsets = {0, s};
  std::unique_ptr<bool[]> head_mask(new bool[c.head_mask.size() + 1]);
  std::copy(c.head_mask.begin(), c.head_mask.end(), head_mask.get());
  core::AttentionInputs inputs;
  inputs.query = {.data = c.query, .offsets = query_offsets};
  if (!c.memory.empty())
    inputs.memory = core::RaggedBatch{.data = c.memory, .offsets = memory_offsets};
  inputs.mask = {.causal = c.causal, .explicit_mask = c.mask};
  inputs.head_mask = {head_mask.get(), c.head_mask.size()};
  CoreAnswer answer;
  answer.output.resize(static_cast<size_t>(t * d));
  if (c.weights) answer.weights.resize(static_cast<size_t>(layer.config().num_heads * t * s));
  core::AttentionExecutor executor(core::ExecutorOptions{.compute_threads = 1});
  const absl::Status status =
      executor.Forward(layer, inputs, {.output = answer.output, .weights = answer.weights});
  EXPECT_TRUE(status.ok()) << status;
  return answer;
}

::testing::AssertionResult Near(const std::vector<float>& actual,
                                const std::vector<float>& expected) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << ", expected " << expected.size();
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    const double tolerance = 1e-5 * std::max(1.0, std::fabs(static_cast<double>(expected[i])));
    if (!(std::fabs(static_cast<double>(actual[i]) - expected[i]) <= tolerance)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << actual[i] << ", expected " << expected[i];
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace attnserve::testing
