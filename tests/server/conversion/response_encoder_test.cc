// AttendResponseEncoder writes, byte for byte, protobuf's serialisation of the message that
// FillAttendResponse fills, for every answer shape and encoding.
#include "server/conversion/attnserve_v1/response_encoder.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "attnserve/v1/attention.pb.h"
#include "gtest/gtest.h"
#include "server/conversion/attnserve_v1/conversion.h"
#include "server/runtime/attend_work.h"
#include "tests/server/conversion/conversion_test_support.h"

namespace attnserve::testing {
namespace {

namespace v1 = ::attnserve::v1;
using server::AttendResponseEncoder;
using server::AttendResult;
using server::AttendWork;

// What the encoder writes for (work, result); empty (and a test failure) if it refuses.
std::string Encoded(const AttendWork& work, const AttendResult& result) {
  return EncodedBytes(AttendResponseEncoder::Create(work, result));
}

// FillAttendResponse's message, serialised by protobuf.
std::string Reference(const AttendWork& work, const AttendResult& result) {
  v1::AttendResponse response;
  EXPECT_TRUE(server::FillAttendResponse(work, result, &response).ok());
  return response.SerializeAsString();
}

struct Case {
  const char* name;
  v1::AttendRequest request;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  // Batched cross-attention, padded query and memory rows, weights.
  cases.push_back({"rank3 cross padded", Rank3Request()});
  // Unpadded self-attention with weights, then without.
  cases.push_back({"rank2 weights", Rank2Request()});
  cases.back().request.set_return_weights(true);
  cases.push_back({"rank2 no weights", Rank2Request()});
  cases.back().request.set_return_weights(false);
  // Padded rank-2 self-attention (lengths shorter than T).
  cases.push_back({"rank2 padded", Rank2Request()});
  cases.back().request.set_return_weights(true);
  cases.back().request.add_lengths(2);
  // A request id and a long model name need multi-byte lengths.
  cases.push_back({"long request id", Rank3Request()});
  cases.back().request.set_request_id(std::string(300, 'r'));
  return cases;
}

TEST(AttendResponseEncoderTest, WritesProtobufsSerialisationOfTheFilledResponse) {
  for (Case& c : Cases()) {
    for (bool raw : {false, true}) {
      for (v1::DataType dtype : {v1::DATA_TYPE_FP32, v1::DATA_TYPE_BF16, v1::DATA_TYPE_FP16}) {
        if (!raw && dtype != v1::DATA_TYPE_FP32) continue;  // values are always float32
        SCOPED_TRACE(::testing::Message()
                     << c.name << " raw=" << raw << " " << v1::DataType_Name(dtype));
        c.request.set_raw_output(raw);
        c.request.set_raw_output_dtype(dtype);
        const absl::StatusOr<AttendWork> work = Parse(c.request);
        ASSERT_TRUE(work.ok()) << work.status();
        const AttendResult result = ResultFor(*work);
        const std::string encoded = Encoded(*work, result);
        EXPECT_EQ(encoded, Reference(*work, result));
        v1::AttendResponse parsed;
        EXPECT_TRUE(parsed.ParseFromString(encoded));
        EXPECT_EQ(parsed.output().raw().empty(), !raw);
      }
    }
  }
}

TEST(AttendResponseEncoderTest, AMismatchedResultIsInternal) {
  const absl::StatusOr<AttendWork> work = Parse(Rank3Request());
  ASSERT_TRUE(work.ok()) << work.status();
  AttendResult result = ResultFor(*work);
  result.output = result.output.first(result.output.size() - 1);
  EXPECT_EQ(AttendResponseEncoder::Create(*work, result).status().code(),
            absl::StatusCode::kInternal);
  result = ResultFor(*work);
  result.weights = {};
  EXPECT_EQ(AttendResponseEncoder::Create(*work, result).status().code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace attnserve::testing
