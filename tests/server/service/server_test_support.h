// Helpers for the end-to-end server tests: a Server on 127.0.0.1 with an ephemeral port and a
// temporary repository of small models, request builders, and the core's own answer to compare
// the server's with.
#ifndef ATTNSERVE_TESTS_SERVER_SERVICE_SERVER_TEST_SUPPORT_H_
#define ATTNSERVE_TESTS_SERVER_SERVICE_SERVER_TEST_SUPPORT_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attnserve/v1/attention.grpc.pb.h"
#include "core/forward/attention_layer.h"
#include "gtest/gtest.h"
#include "server/app/server.h"
#include "tests/support/temp_folder.h"

namespace attnserve::testing {

// The repository every ServerTest starts with: "small" (d_model 16, 2 heads, multi-head with
// bias) and "single" (d_model 8, native single head, no bias).
inline constexpr char kSmallModel[] = "small";
inline constexpr int64_t kSmallWidth = 16;
inline constexpr int64_t kSmallHeads = 2;
inline constexpr char kSingleModel[] = "single";
inline constexpr int64_t kSingleWidth = 8;

// Options for a test server: 127.0.0.1:0, no polling, no demo model, batching that releases a
// batch at once (max_queue_delay_us 0), one compute thread.
server::ServerOptions TestServerOptions();

class ServerTest : public ::testing::Test {
 protected:
  ~ServerTest() override;

  // Writes the repository (once) and starts a server with `options` (its address and
  // repository root are replaced by the test's). Fatal failure if it does not start.
  void StartServer(server::ServerOptions options = TestServerOptions());
  // Drains and stops the server (if running).
  void StopServer();

  server::Server& server() { return *server_; }
  v1::AttentionService::Stub& stub() { return *stub_; }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }
  std::filesystem::path repository() const { return temp_.path() / "models"; }
  // The serving layer of `model`.
  std::shared_ptr<const core::AttentionLayer> Layer(const std::string& model);

  // A unary Attend with a 30 s deadline.
  grpc::Status Attend(const v1::AttendRequest& request, v1::AttendResponse* response);

 private:
  TempFolder temp_;
  bool repository_written_ = false;
  std::unique_ptr<server::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
};

// Deterministic values in [-1, 1].
std::vector<float> TestValues(size_t count, uint64_t seed);

// A self-attention request of one [length, width] sequence (rank 2), values from `seed`.
v1::AttendRequest MakeRequest(const std::string& model, int64_t length, int64_t width,
                              uint64_t seed, bool raw = false);
// A rank-3 request [lengths.size(), max(lengths), width] with `lengths` set (padding rows hold
// garbage the server must ignore).
v1::AttendRequest MakeBatchedRequest(const std::string& model, const std::vector<int64_t>& lengths,
                                     int64_t width, uint64_t seed);

// A tensor's elements, from values or raw.
std::vector<float> TensorValues(const v1::Tensor& tensor);
std::vector<int64_t> TensorShape(const v1::Tensor& tensor);
void SetRaw(const std::vector<float>& values, v1::Tensor* tensor);

// What the core computes for one sequence's rows (optionally with memory rows and masks),
// straight through core::AttentionExecutor, with no server code involved.
struct CoreCase {
  std::vector<float> query = {};   // [T, d]
  std::vector<float> memory = {};  // [S, d] or empty
  bool causal = false;
  std::vector<uint8_t> mask = {};  // [T, S] or empty
  std::vector<bool> head_mask = {};
  bool weights = false;
};
struct CoreAnswer {
  std::vector<float> output;
  std::vector<float> weights;
};
CoreAnswer CoreCompute(const core::AttentionLayer& layer, const CoreCase& c);

// max |a - b| <= 1e-5 · max(1, |b|) elementwise, sizes equal.
::testing::AssertionResult Near(const std::vector<float>& actual,
                                const std::vector<float>& expected);

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_SERVER_SERVICE_SERVER_TEST_SUPPORT_H_
