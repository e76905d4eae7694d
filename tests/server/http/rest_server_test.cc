// The Open Inference Protocol's REST binding end to end: a real Server on 127.0.0.1 called with
// an HTTP client. Answers equal gRPC ModelInfer's bit for bit (JSON and binary), errors are the
// protocol's, limits and slow clients leave the server serving, the drain answers what it
// accepted, and the metrics count REST under its own method.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/server/service/server_test_support.h"

namespace attnserve::testing {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

std::string Bytes(const void* data, size_t size) {
  return std::string(static_cast<const char*>(data), size);
}

class RestServerTest : public ServerTest {
 protected:
  httplib::Client Http() {
    httplib::Client client("127.0.0.1", server().http_port());
    client.set_read_timeout(std::chrono::seconds(30));
    return client;
  }

  // gRPC ModelInfer of `x` [B, T, d] with `lengths`, causal, raw, asking for the weights too.
  inference::ModelInferResponse ModelInfer(const std::vector<float>& x,
                                           const std::vector<int64_t>& shape,
                                           const std::vector<int32_t>& lengths) {
    auto stub = inference::GRPCInferenceService::NewStub(channel());
    inference::ModelInferRequest request;
    request.set_model_name(kSmallModel);
    auto* input = request.add_inputs();
    input->set_name("input");
    input->set_datatype("FP32");
    for (int64_t dim : shape) input->add_shape(dim);
    request.add_raw_input_contents(Bytes(x.data(), x.size() * sizeof(float)));
    auto* length = request.add_inputs();
    length->set_name("lengths");
    length->set_datatype("INT32");
    length->add_shape(static_cast<int64_t>(lengths.size()));
    request.add_raw_input_contents(Bytes(lengths.data(), lengths.size() * sizeof(int32_t)));
    (*request.mutable_parameters())["causal"].set_bool_param(true);
    (*request.mutable_parameters())["return_weights"].set_bool_param(true);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    inference::ModelInferResponse response;
    EXPECT_TRUE(stub->ModelInfer(&context, request, &response).ok());
    return response;
  }
};

std::vector<float> JsonFloats(const Json& data) {
  std::vector<float> values;
  for (const Json& value : data) values.push_back(static_cast<float>(value.get<double>()));
  return values;
}

std::vector<float> RawFloats(const std::string& raw) {
  std::vector<float> values(raw.size() / sizeof(float));
  std::memcpy(values.data(), raw.data(), raw.size());
  return values;
}

TEST_F(RestServerTest, InferEqualsModelInferBitForBitAsJsonAndAsBinary) {
  StartServer();
  const std::vector<int64_t> shape = {2, 5, kSmallWidth};
  const std::vector<float> x = TestValues(2 * 5 * kSmallWidth, 21);
  const std::vector<int32_t> lengths = {5, 3};
  const inference::ModelInferResponse expected = ModelInfer(x, shape, lengths);
  ASSERT_EQ(expected.raw_output_contents_size(), 2);
  const std::vector<float> want_output = RawFloats(expected.raw_output_contents(0));
  const std::vector<float> want_weights = RawFloats(expected.raw_output_contents(1));

  // JSON in, JSON out: numbers in shortest round-trip form both ways.
  Json input = {{"name", "input"}, {"shape", shape}, {"datatype", "FP32"}, {"data", x}};
  Json body = {
      {"id", "j1"},
      {"parameters", {{"causal", true}, {"return_weights", true}}},
      {"inputs",
       {input, {{"name", "lengths"}, {"shape", {2}}, {"datatype", "INT32"}, {"data", lengths}}}}};
  httplib::Client http = Http();
  httplib::Result json = http.Post("/v2/models/small/infer", body.dump(), "application/json");
  ASSERT_TRUE(json);
  ASSERT_EQ(json->status, 200) << json->body;
  EXPECT_EQ(json->get_header_value("Content-Type"), "application/json");
  Json answer = Json::parse(json->body);
  EXPECT_EQ(answer["id"], "j1");
  EXPECT_EQ(answer["model_name"], "small");
  ASSERT_EQ(answer["outputs"].size(), 2u);
  EXPECT_EQ(answer["outputs"][0]["name"], "output");
  EXPECT_EQ(answer["outputs"][0]["shape"], Json(shape));
  EXPECT_EQ(JsonFloats(answer["outputs"][0]["data"]), want_output);
  EXPECT_EQ(JsonFloats(answer["outputs"][1]["data"]), want_weights);

  // Binary in, binary out (the weights as JSON, by their own parameter).
  Json header = {
      {"parameters", {{"causal", true}, {"binary_data_output", true}}},
      {"inputs",
       {{{"name", "input"},
         {"shape", shape},
         {"datatype", "FP32"},
         {"parameters", {{"binary_data_size", x.size() * 4}}}},
        {{"name", "lengths"}, {"shape", {2}}, {"datatype", "INT32"}, {"data", lengths}}}},
      {"outputs",
       {{{"name", "output"}}, {{"name", "weights"}, {"parameters", {{"binary_data", false}}}}}}};
  const std::string header_text = header.dump();
  httplib::Headers headers = {
      {"Inference-Header-Content-Length", absl::StrCat(header_text.size())}};
  httplib::Result binary =
      http.Post("/v2/models/small/versions/1/infer", headers,
                header_text + Bytes(x.data(), x.size() * 4), "application/octet-stream");
  ASSERT_TRUE(binary);
  ASSERT_EQ(binary->status, 200) << binary->body;
  const size_t json_length =
      std::stoul(binary->get_header_value("Inference-Header-Content-Length"));
  Json binary_header = Json::parse(binary->body.substr(0, json_length));
  EXPECT_EQ(binary_header["outputs"][0]["parameters"]["binary_data_size"], want_output.size() * 4);
  EXPECT_EQ(RawFloats(binary->body.substr(json_length)), want_output);
  EXPECT_EQ(JsonFloats(binary_header["outputs"][1]["data"]), want_weights);
}

TEST_F(RestServerTest, EndpointsAnswerAndErrorsAreTheProtocolsJson) {
  StartServer();
  httplib::Client http = Http();
  httplib::Result server_metadata = http.Get("/v2");
  ASSERT_TRUE(server_metadata);
  EXPECT_EQ(server_metadata->status, 200);
  EXPECT_EQ(Json::parse(server_metadata->body)["extensions"], Json({"binary_tensor_data"}));
  EXPECT_EQ(http.Get("/v2/health/live")->status, 200);
  EXPECT_EQ(http.Get("/v2/health/ready")->status, 200);
  httplib::Result metadata = http.Get("/v2/models/small");
  ASSERT_EQ(metadata->status, 200);
  EXPECT_EQ(Json::parse(metadata->body)["inputs"][0]["shape"], Json({-1, -1, kSmallWidth}));
  EXPECT_EQ(http.Get("/v2/models/small/versions/1")->status, 200);
  EXPECT_EQ(http.Get("/v2/models/small/ready")->status, 200);
  EXPECT_EQ(http.Get("/v2/models/single/versions/1/ready")->status, 200);

  const auto expect_error = [](const httplib::Result& result, int status,
                               const std::string& fragment) {
    ASSERT_TRUE(result);
    EXPECT_EQ(result->status, status) << result->body;
    EXPECT_EQ(result->get_header_value("Content-Type"), "application/json");
    EXPECT_THAT(Json::parse(result->body)["error"].get<std::string>(), HasSubstr(fragment));
  };
  expect_error(http.Get("/v2/models/nope"), 404, "nope");
  expect_error(http.Get("/v2/models/small/versions/7"), 404, "version: expected \"1\"");
  expect_error(http.Get("/v2/models/small/versions/7/ready"), 404, "version");
  expect_error(http.Get("/v3"), 404, "path: expected /v2");
  expect_error(http.Get("/v2/models/small/infer"), 405, "method: expected POST");
  expect_error(http.Post("/v2/health/live", "", "text/plain"), 405, "method: expected GET");
  expect_error(http.Post("/v2/models/small/infer", "{", "application/json"), 400, "malformed JSON");
  expect_error(http.Post("/v2/models/nope/infer", R"({"inputs": []})", "application/json"), 404,
               "nope");
  expect_error(http.Post("/v2/models/small/infer",
                         R"({"inputs": [{"name": "input", "shape": [1, 3], "datatype": "FP32",)"
                         R"( "data": [1, 2, 3]}]})",
                         "application/json"),
               400, "d_model 16");
  // Still serving after all that.
  EXPECT_EQ(http.Get("/v2/health/ready")->status, 200);
}

TEST_F(RestServerTest, OversizedBodiesAndHeadersAreRefusedAndTheServerKeepsServing) {
  server::ServerOptions options = TestServerOptions();
  options.max_message_bytes = 4096;
  StartServer(options);
  httplib::Client http = Http();
  httplib::Result large =
      http.Post("/v2/models/small/infer", std::string(8192, ' '), "application/json");
  ASSERT_TRUE(large);
  EXPECT_EQ(large->status, 413);
  EXPECT_THAT(large->body, HasSubstr("request body: expected at most 4096 bytes"));
  httplib::Result long_header =
      http.Get("/v2/health/live", httplib::Headers{{"X-Long", std::string(10000, 'a')}});
  if (long_header) {
    EXPECT_EQ(long_header->status, 400);  // Or closed: either way, refused.
  }
  httplib::Result long_path = http.Get(absl::StrCat("/v2/models/", std::string(9000, 'm')));
  if (long_path) {
    EXPECT_EQ(long_path->status, 414);
  }
  httplib::Client fresh = Http();
  EXPECT_EQ(fresh.Get("/v2/health/live")->status, 200);
  Json body = {{"inputs",
                {{{"name", "input"},
                  {"shape", {2, kSmallWidth}},
                  {"datatype", "FP32"},
                  {"data", TestValues(2 * kSmallWidth, 3)}}}}};
  httplib::Result ok = fresh.Post("/v2/models/small/infer", body.dump(), "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

// A raw TCP connection to the REST port.
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST_F(RestServerTest, ClientsThatStallMidRequestAreDisconnectedAndOthersServed) {
  server::ServerOptions options = TestServerOptions();
  options.http.read_timeout_ms = 300;
  // After its 400 the server waits the keep-alive timeout for the client's next request before it
  // closes the connection.
  options.http.keep_alive_timeout_s = 1;
  options.http.threads = 2;
  StartServer(options);
  // Both workers taken by clients that send half a request and then nothing.
  std::vector<int> stalled;
  for (const char* partial :
       {"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n",
        "POST /v2/models/small/infer HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{\"inputs\""}) {
    const int fd = Connect(server().http_port());
    ASSERT_GE(fd, 0);
    ASSERT_GT(send(fd, partial, std::strlen(partial), 0), 0);
    stalled.push_back(fd);
  }
  // Each is cut off after the read timeout (the server closes; recv sees the end or a reset),
  // and the workers are free again.
  for (int fd : stalled) {
    timeval wait{.tv_sec = 10, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
    char buffer[512];
    ssize_t got;
    while ((got = recv(fd, buffer, sizeof(buffer), 0)) > 0) {
    }
    EXPECT_TRUE(got == 0 || errno == ECONNRESET) << "errno " << errno;
    close(fd);
  }
  httplib::Client http = Http();
  httplib::Result live = http.Get("/v2/health/live");
  ASSERT_TRUE(live);
  EXPECT_EQ(live->status, 200);
}

TEST_F(RestServerTest, DrainAnswersTheAcceptedInferAndRefusesNewOnes) {
  server::ServerOptions options = TestServerOptions();
  options.model_limits.batching.max_queue_delay_us = 60'000'000;  // Held until the drain.
  StartServer(options);
  Json body = {{"inputs",
                {{{"name", "input"},
                  {"shape", {3, kSmallWidth}},
                  {"datatype", "FP32"},
                  {"data", TestValues(3 * kSmallWidth, 4)}}}}};
  int accepted_status = 0;
  std::jthread accepted([&] {
    httplib::Client http = Http();
    httplib::Result result = http.Post("/v2/models/small/infer", body.dump(), "application/json");
    accepted_status = result ? result->status : -1;
  });
  absl::StatusOr<server::ModelRoute> route = server().router().Route(kSmallModel);
  ASSERT_TRUE(route.ok());
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (route->queue->QueueSize() != 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up);
    std::this_thread::yield();
  }
  server().service().BeginDrain();  // What Shutdown starts with.
  httplib::Client http = Http();
  EXPECT_EQ(http.Get("/v2/health/ready")->status, 503);
  EXPECT_EQ(http.Get("/v2/models/small/ready")->status, 503);
  httplib::Result refused = http.Post("/v2/models/small/infer", body.dump(), "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_THAT(refused->body, HasSubstr("error"));
  http.stop();
  server().Shutdown(absl::Seconds(10));
  accepted.join();
  EXPECT_EQ(accepted_status, 200);
}

TEST_F(RestServerTest, MetricsCountRestInfersUnderTheirOwnMethod) {
  StartServer();
  httplib::Client http = Http();
  Json body = {{"inputs",
                {{{"name", "input"},
                  {"shape", {1, kSmallWidth}},
                  {"datatype", "FP32"},
                  {"data", TestValues(kSmallWidth, 5)}}}}};
  ASSERT_EQ(http.Post("/v2/models/small/infer", body.dump(), "application/json")->status, 200);
  ASSERT_EQ(http.Post("/v2/models/small/infer", "[]", "application/json")->status, 400);
  httplib::Client metrics("127.0.0.1", server().metrics_port());
  httplib::Result scrape = metrics.Get("/metrics");
  ASSERT_TRUE(scrape);
  EXPECT_THAT(
      scrape->body,
      HasSubstr(R"(attnserve_requests_total{code="OK",method="RestInfer",model="small"} 1)"));
  EXPECT_THAT(scrape->body, HasSubstr(R"(attnserve_requests_total{code="INVALID_ARGUMENT",)"
                                      R"(method="RestInfer",model="small"} 1)"));
}

}  // namespace
}  // namespace attnserve::testing
