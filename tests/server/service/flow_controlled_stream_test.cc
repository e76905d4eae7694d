// FlowControlledStream against a drain that finishes the stream while a read is outstanding and
// the read then completes with a message: the message must not be accepted, since gRPC deletes
// the stream as soon as that reaction returns and work started for it would answer into freed
// memory. The drain is injected at the exact point (OnReadCompleted), on a real gRPC server
// hosting a test stream through gRPC's generic callback service.
#include "server/service/flow_controlled_stream.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "server/service/open_calls.h"
#include "server/service/stream_registry.h"
#include "tests/server/service/raw_stream.h"

namespace attnserve::server {
namespace {

grpc::ByteBuffer Bytes(const std::string& text) {
  grpc::Slice slice(text);
  return grpc::ByteBuffer(&slice, 1);
}

// What the streams did, shared with the test.
struct Record {
  std::atomic<int> accepted{0};
  std::mutex mu;
  std::vector<std::thread> workers;  // Answering later, as a batch thread does.
};

// Echoes each message from a worker thread a moment later; on its first completed read with a
// message, drains every stream first (as SIGTERM would at that instant).
class EchoStream final : public FlowControlledStream {
 public:
  EchoStream(StreamRegistry* streams, Record* record)
      : FlowControlledStream(
            streams, {.drained_status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "drained")}),
        streams_(streams),
        record_(record) {
    Begin([] { return false; });
  }

 private:
  void OnReadCompleted(bool ok) override {
    if (ok) streams_->DrainAll();
  }
  void OnMessage(grpc::ByteBuffer* bytes) override {
    record_->accepted.fetch_add(1);
    auto copy = std::make_shared<grpc::ByteBuffer>(*bytes);
    std::lock_guard<std::mutex> lock(record_->mu);
    record_->workers.emplace_back([this, copy] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      Answer(*copy, 0);
    });
  }

  StreamRegistry* const streams_;
  Record* const record_;
};

class EchoService final : public grpc::CallbackGenericService {
 public:
  EchoService(StreamRegistry* streams, Record* record) : streams_(streams), record_(record) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new EchoStream(streams_, record_);
  }

 private:
  StreamRegistry* const streams_;
  Record* const record_;
};

TEST(FlowControlledStreamTest, AMessageReadAfterADrainFinishedTheStreamIsNotAccepted) {
  OpenCalls open_calls;
  StreamRegistry streams(&open_calls, int64_t{1} << 30);
  Record record;
  EchoService service(&streams, &record);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);

  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  {
    testing::RawStream call(stub, "/test.Echo/Stream");
    ASSERT_TRUE(call.started());
    ASSERT_TRUE(call.Write(Bytes("hello")));
    grpc::ByteBuffer answer;
    // Finished without an answer: the message was not accepted.
    EXPECT_FALSE(call.Read(&answer));
    const grpc::Status status = call.Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  }
  EXPECT_EQ(record.accepted.load(), 0);

  {
    std::lock_guard<std::mutex> lock(record.mu);
    for (std::thread& worker : record.workers) worker.join();
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  EXPECT_EQ(streams.Count(), 0);
}

}  // namespace
}  // namespace attnserve::server
