// A deliberate data race, for ThreadSanitizer builds only: proof that tests/sanitizers/tsan.supp
// does not hide races in code that gRPC calls. A callback handler (running under gRPC's dispatch
// frames, which the suppressions must not match) and a thread it starts both write one variable
// without synchronisation. The tsan stage runs this with the project's suppressions and passes
// only if TSan reports the race in HandlerWrite/ThreadWrite.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "attnserve/v1/attention.grpc.pb.h"

namespace {

// Read at the end of main, so the compiler keeps the writes.
int racy_value = 0;

// noinline: the report names these frames, and the test looks for them.
[[gnu::noinline]] void HandlerWrite() { racy_value = 1; }
[[gnu::noinline]] void ThreadWrite() { racy_value = 2; }

class RacyService final : public attnserve::v1::AttentionService::CallbackService {
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const attnserve::v1::ListModelsRequest* /*request*/,
                                       attnserve::v1::ListModelsResponse* /*response*/) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    std::thread([reactor] {
      ThreadWrite();
      reactor->Finish(grpc::Status::OK);
    }).detach();
    HandlerWrite();  // After the thread started: unordered with its write.
    return reactor;
  }
};

}  // namespace

int main() {
  RacyService service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "tsan_canary: could not start a server on 127.0.0.1\n");
    return 1;
  }
  auto stub = attnserve::v1::AttentionService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  attnserve::v1::ListModelsResponse response;
  const grpc::Status status = stub->ListModels(&context, {}, &response);
  server->Shutdown();
  std::printf("tsan_canary: ListModels returned %s; value %d\n", status.ok() ? "OK" : "an error",
              racy_value);
  return status.ok() ? 0 : 1;
}
