// Requests protobuf cannot parse: a unary Attend gets INVALID_ARGUMENT with a message (and is
// counted), an AttendStream message gets an in-band error and the stream goes on to answer the
// next one. Both sent as raw bytes through gRPC's generic stub, as a broken client would.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/util/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/service/wire_messages.h"
#include "tests/server/metrics/exposition.h"
#include "tests/server/service/raw_stream.h"
#include "tests/server/service/server_test_support.h"

namespace attnserve::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kAttend[] = "/attnserve.v1.AttentionService/Attend";
constexpr char kAttendStream[] = "/attnserve.v1.AttentionService/AttendStream";
constexpr char kDecode[] = "/attnserve.v1.AttentionService/Decode";

// A field tag of wire type 7, which does not exist: no protobuf message parses from it.
grpc::ByteBuffer Garbage() {
  const std::string bytes = "\x0f\xff\xff\xff";
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer Bytes(const v1::AttendRequest& request) {
  grpc::ByteBuffer bytes;
  EXPECT_TRUE(server::SerializeWireMessage(request, &bytes).ok());
  return bytes;
}

v1::AttendResponse Parse(const grpc::ByteBuffer& bytes) {
  v1::AttendResponse response;
  EXPECT_TRUE(server::ParseWireMessage(bytes, "response", &response).ok());
  return response;
}

class WireParsingTest : public ServerTest {};

TEST_F(WireParsingTest, AnUnparseableUnaryRequestIsInvalidArgumentAndCounted) {
  StartServer();
  grpc::GenericStub stub(channel());
  grpc::ClientContext context;
  grpc::ByteBuffer request = Garbage();
  grpc::ByteBuffer response;
  grpc::Status status;
  Notification done;
  stub.UnaryCall(&context, kAttend, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(),
              HasSubstr("request: expected a serialised attnserve.v1.AttendRequest, got 4 bytes"));

  absl::StatusOr<Samples> samples = Scrape(server().metrics_port());
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_EQ(ValueOf(*samples,
                    "attnserve_requests_total{code=\"INVALID_ARGUMENT\",method=\"Attend\","
                    "model=\"<unknown>\"}"),
            1);
  // The server goes on serving.
  v1::AttendResponse ok;
  EXPECT_TRUE(Attend(MakeRequest(kSmallModel, 2, kSmallWidth, 1), &ok).ok());
}

TEST_F(WireParsingTest, AnUnparseableStreamMessageGetsAnInBandErrorAndTheStreamGoesOn) {
  StartServer();
  grpc::GenericStub stub(channel());
  grpc::CompletionQueue queue;
  grpc::ClientContext context;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, kAttendStream, &queue);
  // One operation at a time, each waited for: the tag is its step number.
  int step = 0;
  auto await = [&]() {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(queue.Next(&tag, &ok));
    EXPECT_EQ(tag, reinterpret_cast<void*>(static_cast<intptr_t>(step)));
    return ok;
  };
  auto next_tag = [&] { return reinterpret_cast<void*>(static_cast<intptr_t>(++step)); };
  call->StartCall(next_tag());
  ASSERT_TRUE(await());
  const grpc::ByteBuffer garbage = Garbage();
  call->Write(garbage, next_tag());
  ASSERT_TRUE(await());
  v1::AttendRequest valid = MakeRequest(kSmallModel, 3, kSmallWidth, 7);
  valid.set_request_id("after-garbage");
  const grpc::ByteBuffer good = Bytes(valid);
  call->Write(good, next_tag());
  ASSERT_TRUE(await());
  call->WritesDone(next_tag());
  ASSERT_TRUE(await());

  std::vector<v1::AttendResponse> answers;
  for (int i = 0; i < 2; ++i) {
    grpc::ByteBuffer bytes;
    call->Read(&bytes, next_tag());
    ASSERT_TRUE(await()) << "answer " << i << " missing";
    answers.push_back(Parse(bytes));
  }
  grpc::Status status;
  call->Finish(&status, next_tag());
  ASSERT_TRUE(await());
  EXPECT_TRUE(status.ok()) << status.error_message();

  // Answers may come in any order: one error for the garbage, one output for the valid message.
  int errors = 0, outputs = 0;
  for (const v1::AttendResponse& answer : answers) {
    if (answer.has_error()) {
      ++errors;
      EXPECT_EQ(answer.error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
      EXPECT_THAT(answer.error().message(),
                  HasSubstr("message: expected a serialised attnserve.v1.AttendRequest"));
    } else {
      ++outputs;
      EXPECT_EQ(answer.request_id(), "after-garbage");
      EXPECT_TRUE(
          Near(TensorValues(answer.output()),
               CoreCompute(*Layer(kSmallModel), {.query = TestValues(3 * kSmallWidth, 7)}).output));
    }
  }
  EXPECT_EQ(errors, 1);
  EXPECT_EQ(outputs, 1);
  queue.Shutdown();
  void* tag;
  bool ok;
  while (queue.Next(&tag, &ok)) {
  }
}

TEST_F(WireParsingTest, AnUnparseableDecodeMessageGetsAnInBandErrorAndTheStreamEndsOk) {
  StartServer();
  grpc::GenericStub stub(channel());
  RawStream call(stub, kDecode);
  ASSERT_TRUE(call.started());
  ASSERT_TRUE(call.Write(Garbage()));
  grpc::ByteBuffer bytes;
  ASSERT_TRUE(call.Read(&bytes));
  v1::DecodeResponse answer;
  ASSERT_TRUE(server::ParseWireMessage(bytes, "response", &answer).ok());
  EXPECT_EQ(answer.error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(answer.error().message(),
              HasSubstr("message: expected a serialised attnserve.v1.DecodeRequest"));
  ASSERT_TRUE(call.WritesDone());
  const grpc::Status status = call.Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();

  absl::StatusOr<Samples> samples = Scrape(server().metrics_port());
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_EQ(ValueOf(*samples,
                    "attnserve_requests_total{code=\"INVALID_ARGUMENT\",method=\"Decode\","
                    "model=\"<unknown>\"}"),
            1);
}

}  // namespace
}  // namespace attnserve::testing
