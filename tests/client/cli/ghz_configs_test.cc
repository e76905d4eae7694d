// deploy/ghz: ghz itself cannot be installed here, so its configs are checked for shape: each
// parses as JSON, calls an existing method through reflection (no .proto), and reads a data file
// that make-data.sh produces, whose objects are valid requests of that method.
#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "attnserve/v1/attention.grpc.pb.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/support/child_process.h"
#include "tests/support/temp_folder.h"

namespace attnserve::testing {
namespace {

using ::testing::HasSubstr;

const std::filesystem::path kGhzFolder = std::filesystem::path(ATTNSERVE_SOURCE_DIR) / "deploy/ghz";

std::string ReadText(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

std::vector<std::filesystem::path> Configs() {
  std::vector<std::filesystem::path> configs;
  for (const auto& entry : std::filesystem::directory_iterator(kGhzFolder)) {
    if (entry.path().extension() == ".json") configs.push_back(entry.path());
  }
  std::sort(configs.begin(), configs.end());
  return configs;
}

// "attnserve.v1.AttentionService.Attend" or ".../Attend" into the method, or null.
const google::protobuf::MethodDescriptor* FindMethod(const std::string& call) {
  const size_t split = call.find_last_of("./");
  if (split == std::string::npos) return nullptr;
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(call.substr(0, split));
  return service == nullptr ? nullptr : service->FindMethodByName(call.substr(split + 1));
}

TEST(GhzConfigsTest, ThereAreConfigsForShortLongAndStreaming) {
  std::vector<std::string> names;
  for (const auto& config : Configs()) names.push_back(config.filename().string());
  EXPECT_THAT(names, ::testing::IsSupersetOf({"short-high-concurrency.json", "long-sequences.json",
                                              "stream.json", "decode.json"}));
}

TEST(GhzConfigsTest, EachCallsAnExistingMethodThroughReflection) {
  for (const auto& path : Configs()) {
    SCOPED_TRACE(path.string());
    const nlohmann::json config = nlohmann::json::parse(ReadText(path));
    ASSERT_TRUE(config.is_object());
    const google::protobuf::MethodDescriptor* method = FindMethod(config.value("call", ""));
    ASSERT_NE(method, nullptr) << config.value("call", "");
    EXPECT_THAT(method->service()->full_name(), ::testing::AnyOf("attnserve.v1.AttentionService",
                                                                 "inference.GRPCInferenceService"));
    // No .proto or protoset: ghz asks the server's reflection service.
    EXPECT_FALSE(config.contains("proto"));
    EXPECT_FALSE(config.contains("protoset"));
    EXPECT_EQ(config.value("insecure", false), true);
    EXPECT_TRUE(config.contains("host"));
    EXPECT_GT(config.value("total", 0), 0);
    EXPECT_GT(config.value("concurrency", 0), 0);
    EXPECT_FALSE(config.contains("data"));  // The payload comes from the generated file.
  }
}

// An Open Inference Protocol call: one FP32 [T, 512] input, raw, for the demo model.
void ExpectInferRequest(const nlohmann::json& object) {
  inference::ModelInferRequest request;
  const auto parsed = google::protobuf::util::JsonStringToMessage(object.dump(), &request);
  ASSERT_TRUE(parsed.ok()) << parsed.ToString();
  EXPECT_EQ(request.model_name(), "demo");
  ASSERT_EQ(request.inputs_size(), 1);
  EXPECT_EQ(request.inputs(0).name(), "input");
  EXPECT_EQ(request.inputs(0).datatype(), "FP32");
  ASSERT_EQ(request.inputs(0).shape_size(), 2);
  EXPECT_EQ(request.inputs(0).shape(1), 512);
  ASSERT_EQ(request.raw_input_contents_size(), 1);
  EXPECT_EQ(request.raw_input_contents(0).size(),
            static_cast<size_t>(request.inputs(0).shape(0) * 512) * 4);
}

// A Decode stream message for the demo model: opens, [rows, 512] raw steps, or closes.
void ExpectDecodeRequest(const nlohmann::json& object) {
  v1::DecodeRequest request;
  const auto parsed = google::protobuf::util::JsonStringToMessage(object.dump(), &request);
  ASSERT_TRUE(parsed.ok()) << parsed.ToString();
  EXPECT_GT(request.opens_size() + request.steps_size() + request.closes_size(), 0);
  for (const v1::DecodeOpen& open : request.opens()) EXPECT_EQ(open.model(), "demo");
  for (const v1::DecodeStep& step : request.steps()) {
    ASSERT_EQ(step.rows().shape_size(), 2);
    EXPECT_EQ(step.rows().shape(1), 512);
    EXPECT_EQ(step.rows().raw().size(), static_cast<size_t>(step.rows().shape(0) * 512) * 4);
  }
}

TEST(GhzConfigsTest, MakeDataProducesEveryDataFileAsValidRequests) {
  TempFolder temp;
  const std::filesystem::path out_dir = temp.path() / "data";
  absl::StatusOr<std::unique_ptr<ChildProcess>> script = ChildProcess::Start(
      "/usr/bin/env", {"ATTNSERVE_CLI=" ATTNSERVE_CLI_BINARY, "OUT_DIR=" + out_dir.string(), "bash",
                       (kGhzFolder / "make-data.sh").string()});
  ASSERT_TRUE(script.ok()) << script.status();
  ASSERT_EQ((*script)->Wait(absl::Seconds(120)), 0) << (*script)->Output();

  for (const auto& path : Configs()) {
    SCOPED_TRACE(path.string());
    const nlohmann::json config = nlohmann::json::parse(ReadText(path));
    const std::string data_file = config.value("data-file", "");
    // Relative to deploy/ghz, where make-data.sh writes data/ by default.
    ASSERT_EQ(data_file.rfind("data/", 0), 0u) << data_file;
    const std::filesystem::path produced = out_dir / data_file.substr(5);
    ASSERT_TRUE(std::filesystem::exists(produced)) << produced;

    const google::protobuf::MethodDescriptor* method = FindMethod(config.value("call", ""));
    ASSERT_NE(method, nullptr);
    const std::string input_type = method->input_type()->full_name();
    const nlohmann::json data = nlohmann::json::parse(ReadText(produced));
    ASSERT_TRUE(data.is_array() || data.is_object());
    const std::vector<nlohmann::json> objects =
        data.is_array() ? std::vector<nlohmann::json>(data.begin(), data.end())
                        : std::vector<nlohmann::json>{data};
    ASSERT_FALSE(objects.empty());
    for (const nlohmann::json& object : objects) {
      if (input_type == "inference.ModelInferRequest") {
        ExpectInferRequest(object);
        continue;
      }
      if (input_type == "attnserve.v1.DecodeRequest") {
        ExpectDecodeRequest(object);
        continue;
      }
      ASSERT_EQ(input_type, "attnserve.v1.AttendRequest");
      v1::AttendRequest request;
      const auto parsed = google::protobuf::util::JsonStringToMessage(object.dump(), &request);
      ASSERT_TRUE(parsed.ok()) << parsed.ToString();
      EXPECT_EQ(request.model(), "demo");
      ASSERT_EQ(request.input().shape_size(), 2);
      EXPECT_EQ(request.input().shape(1), 512);
      EXPECT_EQ(request.input().raw().size(),
                static_cast<size_t>(request.input().shape(0) * request.input().shape(1)) * 4);
    }
  }
}

}  // namespace
}  // namespace attnserve::testing
