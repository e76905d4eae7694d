// attnserve_echo_server: the floor under attnserve's service path. It speaks attnserve.v1 on the
// same gRPC, protobuf and callback-API choices as attnserve (raw-bytes Attend parsed into an
// AttendRequest, the same channel arguments: fixed stream windows, message limits) and answers
// every Attend with its input echoed as the output tensor — the bytes an answer of that size
// carries, without any attention computed, queueing or batching. `attnserve-cli bench` drives it
// as it drives attnserve (GetModel describes a demo-shaped model), so the CPU per request measured
// on each side is what gRPC and protobuf alone cost for those bytes: run_echo_floor.sh compares it
// with attnserve's.
//
// Logs "listening on <port>" once serving; exits 0 on SIGTERM or SIGINT.
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>
#include <signal.h>

#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "attnserve/v1/attention.grpc.pb.h"
#include "core/util/reuse_large_allocations.h"
#include "server/service/wire_messages.h"

namespace {

namespace v1 = attnserve::v1;

using EchoBase = v1::AttentionService::WithRawCallbackMethod_Attend<
    v1::AttentionService::WithCallbackMethod_GetModel<v1::AttentionService::Service>>;

struct EchoOptions {
  int64_t d_model = 512;
  int num_heads = 8;
};

class EchoService final : public EchoBase {
 public:
  explicit EchoService(const EchoOptions& options) : options_(options) {}

  grpc::ServerUnaryReactor* Attend(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request_bytes,
                                   grpc::ByteBuffer* response_bytes) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    v1::AttendRequest request;
    absl::Status status = attnserve::server::ParseWireMessage(*request_bytes, "request", &request);
    if (status.ok()) {
      v1::AttendResponse response;
      response.set_model(request.model());
      response.set_request_id(request.request_id());
      v1::Tensor* output = response.mutable_output();
      output->Swap(request.mutable_input());  // The echo: as many bytes out as came in.
      if (request.raw_output()) output->set_dtype(request.raw_output_dtype());
      response.mutable_timing()->set_batch_sequences(1);
      status = attnserve::server::SerializeWireMessage(response, response_bytes);
    }
    reactor->Finish(status.ok() ? grpc::Status::OK
                                : grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                               std::string(status.message())));
    return reactor;
  }

  grpc::ServerUnaryReactor* GetModel(grpc::CallbackServerContext* context,
                                     const v1::GetModelRequest* /*request*/,
                                     v1::ModelInfo* response) override {
    response->set_name("echo");
    response->set_d_model(static_cast<int32_t>(options_.d_model));
    response->set_num_heads(options_.num_heads);
    response->set_variant("multi_head");
    response->set_dtype("fp32");
    response->set_version(1);
    response->set_source("embedded");
    response->set_is_default(true);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  const EchoOptions options_;
};

}  // namespace

int main(int argc, char** argv) {
  attnserve::ReuseLargeAllocations();  // As attnserve does: the floor has its process settings.
  CLI::App app{"attnserve_echo_server: attnserve.v1 Attend answered with its input (no compute)"};
  std::string address = "127.0.0.1:0";
  int64_t stream_window_bytes = int64_t{1} << 20;
  int64_t max_message_bytes = int64_t{256} << 20;
  EchoOptions options;
  app.add_option("--grpc-address", address, "host:port (port 0 = any free port)")
      ->capture_default_str();
  app.add_option("--grpc-stream-window-bytes", stream_window_bytes,
                 "HTTP/2 window of each stream (attnserve's default)")
      ->capture_default_str();
  app.add_option("--max-message-bytes", max_message_bytes, "largest message either way")
      ->capture_default_str();
  app.add_option("--d-model", options.d_model, "d_model GetModel reports")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  // SIGTERM / SIGINT are taken by a thread that then shuts the server down.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  EchoService service(options);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(static_cast<int>(max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(max_message_bytes));
  // As attnserve's server.cc: fixed stream windows, no bandwidth probing.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                             static_cast<int>(stream_window_bytes));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::cerr << "attnserve_echo_server: cannot listen on " << address << "\n";
    return 1;
  }
  std::cout << "attnserve_echo_server: listening on " << port << std::endl;
  int signal = 0;
  sigwait(&signals, &signal);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return 0;
}
