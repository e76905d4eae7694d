// RawStream: a bidi call driven one operation at a time through gRPC's generic stub, for tests that
// send raw bytes (as a broken client would) or talk to a generic service.
#ifndef ATTNSERVE_TESTS_SERVER_SERVICE_RAW_STREAM_H_
#define ATTNSERVE_TESTS_SERVER_SERVICE_RAW_STREAM_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>

#include "gtest/gtest.h"

namespace attnserve::testing {

// A raw bidi call on `method` through the generic stub, one operation at a time, each waited for
// (its tag is its step number).
class RawStream {
 public:
  RawStream(grpc::GenericStub& stub, const char* method) {
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    call_ = stub.PrepareCall(&context_, method, &queue_);
    call_->StartCall(NextTag());
    started_ = Await();
  }
  ~RawStream() {
    queue_.Shutdown();
    void* tag;
    bool ok;
    while (queue_.Next(&tag, &ok)) {
    }
  }
  bool started() const { return started_; }
  bool Write(const grpc::ByteBuffer& bytes) {
    call_->Write(bytes, NextTag());
    return Await();
  }
  bool Read(grpc::ByteBuffer* bytes) {
    call_->Read(bytes, NextTag());
    return Await();
  }
  bool WritesDone() {
    call_->WritesDone(NextTag());
    return Await();
  }
  grpc::Status Finish() {
    grpc::Status status;
    call_->Finish(&status, NextTag());
    EXPECT_TRUE(Await());
    return status;
  }

 private:
  void* NextTag() { return reinterpret_cast<void*>(static_cast<intptr_t>(++step_)); }
  bool Await() {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(queue_.Next(&tag, &ok));
    EXPECT_EQ(tag, reinterpret_cast<void*>(static_cast<intptr_t>(step_)));
    return ok;
  }

  grpc::CompletionQueue queue_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  int step_ = 0;
  bool started_ = false;
};

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_SERVER_SERVICE_RAW_STREAM_H_
