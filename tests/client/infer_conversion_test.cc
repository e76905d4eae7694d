// The Open Inference Protocol answer as the client reads it (client/src/infer_conversion.h):
// a hostile answer's shape, whose element count times 4 bytes wraps a 64-bit size or whose
// dimensions overflow int64, is refused with a Status (never an exception, which on InferAsync's
// gRPC thread would end the process), directly and through a scripted server.
#include "client/src/infer_conversion.h"

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "attnserve/client/infer_client.h"
#include "core/util/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"

namespace attnserve::testing {
namespace {

using ::testing::HasSubstr;
namespace ac = ::attnserve::client;

// An answer whose FP32 `output` has `shape` and `raw` bytes (raw_output_contents).
inference::ModelInferResponse Answer(const std::vector<int64_t>& shape, const std::string& raw) {
  inference::ModelInferResponse response;
  response.set_model_name("m");
  auto* output = response.add_outputs();
  output->set_name("output");
  output->set_datatype("FP32");
  output->mutable_shape()->Add(shape.begin(), shape.end());
  response.add_raw_output_contents(raw);
  return response;
}

// Shapes no answer can carry, each with raw bytes that a wrapped size check would accept: 2^62
// elements are 2^64 bytes (0 mod 2^64), 2^62 + 1 are 4 (mod 2^64); 2^32 x 2^32 overflows int64.
struct Hostile {
  std::vector<int64_t> shape;
  size_t raw_bytes;
};
const Hostile kHostile[] = {{{int64_t{1} << 31, int64_t{1} << 31}, 0},
                            {{(int64_t{1} << 62) + 1}, 4},
                            {{int64_t{1} << 32, int64_t{1} << 32}, 0},
                            {{2, -2}, 16}};

TEST(InferConversionTest, AHostileShapeIsAnInternalErrorNotAnException) {
  for (const Hostile& hostile : kHostile) {
    SCOPED_TRACE(
        absl::StrCat("shape [", hostile.shape[0], ", ...] with ", hostile.raw_bytes, " raw bytes"));
    absl::StatusOr<ac::InferResult> result = absl::UnknownError("not read");
    EXPECT_NO_THROW(result = ac::internal::ReadModelInferResponse(
                        Answer(hostile.shape, std::string(hostile.raw_bytes, '\0'))));
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
    EXPECT_THAT(result.status().message(), HasSubstr("answer's output"));
  }
}

TEST(InferConversionTest, AWellFormedAnswerIsRead) {
  const std::vector<float> values = {1.5f, -2.0f, 0.25f, 8.0f, 0.0f, -0.5f};
  std::string raw(values.size() * sizeof(float), '\0');
  std::memcpy(raw.data(), values.data(), raw.size());
  absl::StatusOr<ac::InferResult> result =
      ac::internal::ReadModelInferResponse(Answer({2, 3}, raw));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->output.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(result->output.data, values);
  // A zero dimension is an empty answer, whatever the others are.
  result = ac::internal::ReadModelInferResponse(Answer({0, int64_t{1} << 62}, ""));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->output.data.empty());
  // One byte short is refused.
  result = ac::internal::ReadModelInferResponse(Answer({2, 3}, raw.substr(1)));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
}

// Answers every ModelInfer with the hostile shape it was made with.
class HostileService final : public inference::GRPCInferenceService::Service {
 public:
  explicit HostileService(Hostile hostile) : hostile_(std::move(hostile)) {}
  grpc::Status ModelInfer(grpc::ServerContext* /*context*/,
                          const inference::ModelInferRequest* /*request*/,
                          inference::ModelInferResponse* response) override {
    *response = Answer(hostile_.shape, std::string(hostile_.raw_bytes, '\0'));
    return grpc::Status::OK;
  }

 private:
  const Hostile hostile_;
};

TEST(InferConversionTest, InferAsyncGivesTheCallbackAnErrorForAHostileAnswer) {
  for (const Hostile& hostile : kHostile) {
    HostileService service(hostile);
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    ASSERT_NE(server, nullptr);
    absl::StatusOr<std::unique_ptr<ac::InferClient>> client =
        ac::InferClient::Create(absl::StrCat("127.0.0.1:", port));
    ASSERT_TRUE(client.ok()) << client.status();
    const std::vector<float> input(8, 0.5f);
    Notification called;
    absl::StatusOr<ac::InferResult> result;
    (*client)->InferAsync("m", {input, {1, 8}}, {}, [&](absl::StatusOr<ac::InferResult> answer) {
      result = std::move(answer);
      called.Notify();
    });
    ASSERT_TRUE(called.WaitForNotificationWithTimeout(absl::Seconds(60)));
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
    server->Shutdown();
  }
}

}  // namespace
}  // namespace attnserve::testing
