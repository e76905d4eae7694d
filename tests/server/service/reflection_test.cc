// Server reflection (grpc.reflection.v1alpha, what ghz and grpcurl use without the .proto file):
// the server lists its services and describes AttentionService from its descriptor. The test
// speaks the reflection protocol through a generic stub, encoding the few fields it needs, so it
// does not depend on the reflection library's own generated code.
#include <gmock/gmock.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/server/service/server_test_support.h"

namespace attnserve::testing {
namespace {

using ::testing::UnorderedElementsAre;

// The length-delimited values of field `number` in the wire-format message `bytes`.
std::vector<std::string> Field(const std::string& bytes, int number) {
  google::protobuf::UnknownFieldSet fields;
  EXPECT_TRUE(fields.ParseFromString(bytes));
  std::vector<std::string> values;
  for (int i = 0; i < fields.field_count(); ++i) {
    if (fields.field(i).number() == number &&
        fields.field(i).type() == google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) {
      values.push_back(fields.field(i).length_delimited());
    }
  }
  return values;
}

// A ServerReflectionRequest with one length-delimited field set.
std::string Request(int field, const std::string& value) {
  std::string bytes;
  bytes.push_back(static_cast<char>(field << 3 | 2));
  bytes.push_back(static_cast<char>(value.size()));  // Values here are < 128 bytes.
  return bytes + value;
}

class ReflectionTest : public ServerTest {
 protected:
  void SetUp() override { StartServer(); }

  // One request/response exchange on a fresh ServerReflectionInfo stream.
  std::string Ask(const std::string& request) {
    grpc::GenericStub generic(channel());
    grpc::CompletionQueue queue;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto call = generic.PrepareCall(
        &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &queue);
    auto step = [&queue](int tag) {
      void* got = nullptr;
      bool ok = false;
      EXPECT_TRUE(queue.Next(&got, &ok));
      EXPECT_EQ(got, reinterpret_cast<void*>(static_cast<intptr_t>(tag)));
      return ok;
    };
    call->StartCall(reinterpret_cast<void*>(1));
    EXPECT_TRUE(step(1));
    grpc::Slice slice(request);
    grpc::ByteBuffer outgoing(&slice, 1);
    call->Write(outgoing, reinterpret_cast<void*>(2));
    EXPECT_TRUE(step(2));
    grpc::ByteBuffer incoming;
    call->Read(&incoming, reinterpret_cast<void*>(3));
    EXPECT_TRUE(step(3));
    call->WritesDone(reinterpret_cast<void*>(4));
    EXPECT_TRUE(step(4));
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(5));
    EXPECT_TRUE(step(5));
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::vector<grpc::Slice> slices;
    EXPECT_TRUE(incoming.Dump(&slices).ok());
    std::string response;
    for (const grpc::Slice& part : slices) {
      response.append(reinterpret_cast<const char*>(part.begin()), part.size());
    }
    return response;
  }
};

TEST_F(ReflectionTest, ListsTheServices) {
  const std::string response = Ask(Request(/*list_services=*/7, ""));
  std::vector<std::string> names;
  for (const std::string& list : Field(response, /*list_services_response=*/6)) {
    for (const std::string& service : Field(list, 1)) {
      const std::vector<std::string> name = Field(service, 1);
      ASSERT_EQ(name.size(), 1u);
      names.push_back(name[0]);
    }
  }
  EXPECT_THAT(names, UnorderedElementsAre("attnserve.v1.AttentionService",
                                          "inference.GRPCInferenceService", "grpc.health.v1.Health",
                                          "grpc.reflection.v1alpha.ServerReflection"));
}

TEST_F(ReflectionTest, DescribesAttentionServiceFromItsFileDescriptor) {
  const std::string response =
      Ask(Request(/*file_containing_symbol=*/4, "attnserve.v1.AttentionService"));
  const std::vector<std::string> files = Field(response, /*file_descriptor_response=*/4);
  ASSERT_EQ(files.size(), 1u);
  google::protobuf::FileDescriptorProto file;
  ASSERT_TRUE(file.ParseFromString(Field(files[0], 1).at(0)));
  EXPECT_EQ(file.name(), "attnserve/v1/attention.proto");
  EXPECT_EQ(file.package(), "attnserve.v1");
  ASSERT_EQ(file.service_size(), 1);
  std::vector<std::string> methods;
  for (const auto& method : file.service(0).method()) methods.push_back(method.name());
  EXPECT_THAT(methods,
              UnorderedElementsAre("Attend", "AttendStream", "ListModels", "GetModel", "Decode"));
}

}  // namespace
}  // namespace attnserve::testing
