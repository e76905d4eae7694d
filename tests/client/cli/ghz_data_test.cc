// ghz-data: the payload is JSON that protobuf maps back to valid AttendRequests of the asked
// shape, deterministic for a seed.
#include "client/cli/ghz_data.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "attnserve/v1/attention.pb.h"
#include "client/cli/random_values.h"
#include "nlohmann/json.hpp"

namespace attnserve::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

// Each JSON object of `payload` (an object or an array of them) as an AttendRequest.
std::vector<v1::AttendRequest> Requests(const std::string& payload) {
  const nlohmann::json parsed = nlohmann::json::parse(payload);  // Throws (fails) if not JSON.
  std::vector<nlohmann::json> objects;
  if (parsed.is_array()) {
    objects.assign(parsed.begin(), parsed.end());
  } else {
    objects.push_back(parsed);
  }
  std::vector<v1::AttendRequest> requests;
  for (const nlohmann::json& object : objects) {
    EXPECT_TRUE(object.is_object());
    v1::AttendRequest request;
    const auto status = google::protobuf::util::JsonStringToMessage(object.dump(), &request);
    EXPECT_TRUE(status.ok()) << status.ToString();
    requests.push_back(request);
  }
  return requests;
}

std::vector<float> RawFloats(const std::string& raw) {
  std::vector<float> values(raw.size() / sizeof(float));
  std::memcpy(values.data(), raw.data(), values.size() * sizeof(float));
  return values;
}

TEST(GhzDataTest, CountOneIsOneObjectOfTheShape) {
  absl::StatusOr<std::string> data =
      MakeGhzData({.model = "demo", .shape = {16, 512}, .count = 1, .seed = 7});
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->front(), '{');
  const std::vector<v1::AttendRequest> requests = Requests(*data);
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].model(), "demo");
  EXPECT_THAT(requests[0].input().shape(), ElementsAre(16, 512));
  EXPECT_EQ(requests[0].input().values_size(), 16 * 512);
  EXPECT_THAT(requests[0].input().values(), ElementsAreArray(RandomValues(16 * 512, 7)));
  // proto3 JSON writes int64 as strings: the shape is ["16","512"].
  EXPECT_EQ(nlohmann::json::parse(*data)["input"]["shape"][0], "16");
}

TEST(GhzDataTest, CountNIsAnArrayWithADifferentInputEach) {
  absl::StatusOr<std::string> data =
      MakeGhzData({.model = "small", .shape = {3, 16}, .count = 4, .seed = 1});
  ASSERT_TRUE(data.ok()) << data.status();
  const std::vector<v1::AttendRequest> requests = Requests(*data);
  ASSERT_EQ(requests.size(), 4u);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_THAT(requests[i].input().shape(), ElementsAre(3, 16));
    EXPECT_THAT(requests[i].input().values(), ElementsAreArray(RandomValues(48, 1 + i)));
  }
}

TEST(GhzDataTest, RawIsBase64Float32Bytes) {
  absl::StatusOr<std::string> data = MakeGhzData(
      {.model = "m", .shape = {2, 4}, .count = 1, .seed = 3, .raw = true, .raw_output = true});
  ASSERT_TRUE(data.ok()) << data.status();
  const nlohmann::json json = nlohmann::json::parse(*data);
  EXPECT_TRUE(json["input"]["raw"].is_string());
  EXPECT_FALSE(json["input"].contains("values"));
  EXPECT_EQ(json["rawOutput"], true);
  const std::vector<v1::AttendRequest> requests = Requests(*data);
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].input().values_size(), 0);
  EXPECT_THAT(RawFloats(requests[0].input().raw()), ElementsAreArray(RandomValues(8, 3)));
}

TEST(GhzDataTest, DeterministicForASeed) {
  const GhzDataOptions options{.model = "demo", .shape = {4, 8}, .count = 3, .seed = 11};
  EXPECT_EQ(*MakeGhzData(options), *MakeGhzData(options));
  GhzDataOptions other = options;
  other.seed = 12;
  EXPECT_NE(*MakeGhzData(options), *MakeGhzData(other));
}

TEST(GhzDataTest, RejectsBadShapesAndCounts) {
  EXPECT_FALSE(MakeGhzData({.model = "", .shape = {16}}).ok());
  EXPECT_FALSE(MakeGhzData({.model = "", .shape = {16, 8}, .count = 0}).ok());
  EXPECT_FALSE(ParseShapeList("16,x").ok());
  EXPECT_FALSE(ParseShapeList("16,0").ok());
  EXPECT_THAT(*ParseShapeList("16,512"), ElementsAre(16, 512));
  EXPECT_THAT(*ParseShapeList("2x16x512"), ElementsAre(2, 16, 512));
}

TEST(GhzDataTest, DecodeModeIsOneStreamsMessagesOpenStepsClose) {
  absl::StatusOr<std::string> data = MakeGhzData({.model = "demo",
                                                  .shape = {5, 8},
                                                  .seed = 3,
                                                  .raw = true,
                                                  .raw_output = true,
                                                  .decode_sessions = 3,
                                                  .decode_steps = 4});
  ASSERT_TRUE(data.ok()) << data.status();
  const nlohmann::json parsed = nlohmann::json::parse(*data);
  ASSERT_TRUE(parsed.is_array());
  ASSERT_EQ(parsed.size(), 6u);  // Open + prefill, 4 steps, close.
  std::vector<v1::DecodeRequest> messages;
  for (const nlohmann::json& object : parsed) {
    v1::DecodeRequest request;
    const auto status = google::protobuf::util::JsonStringToMessage(object.dump(), &request);
    ASSERT_TRUE(status.ok()) << status.ToString();
    messages.push_back(request);
  }
  ASSERT_EQ(messages[0].opens_size(), 3);
  EXPECT_EQ(messages[0].opens(2).session(), "s2");
  EXPECT_EQ(messages[0].opens(2).model(), "demo");
  ASSERT_EQ(messages[0].steps_size(), 3);
  EXPECT_THAT(messages[0].steps(1).rows().shape(), ElementsAre(5, 8));
  EXPECT_THAT(RawFloats(messages[0].steps(1).rows().raw()), ElementsAreArray(RandomValues(40, 4)));
  for (size_t i = 1; i <= 4; ++i) {
    EXPECT_EQ(messages[i].opens_size(), 0);
    ASSERT_EQ(messages[i].steps_size(), 3);
    EXPECT_THAT(messages[i].steps(0).rows().shape(), ElementsAre(1, 8));
    EXPECT_TRUE(messages[i].steps(0).raw_output());
    EXPECT_EQ(messages[i].closes_size(), 0);
  }
  ASSERT_EQ(messages[5].closes_size(), 3);
  EXPECT_EQ(messages[5].steps_size(), 0);
  // Distinct rows per session and step.
  EXPECT_NE(messages[1].steps(0).rows().raw(), messages[1].steps(1).rows().raw());
  EXPECT_NE(messages[1].steps(0).rows().raw(), messages[2].steps(0).rows().raw());

  EXPECT_FALSE(MakeGhzData({.model = "demo", .shape = {2, 5, 8}, .decode_sessions = 1}).ok());
}

}  // namespace
}  // namespace attnserve::cli
