// Logging set-up: JSON lines stay valid JSON whatever the message holds, and bad --log-level /
// --log-format values are refused naming the flag.
#include "server/app/logging.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "nlohmann/json.hpp"

namespace attnserve::server {
namespace {

using ::testing::HasSubstr;

TEST(JsonEscapeTest, EveryMessageBecomesAValidJsonStringWithTheSameText) {
  const std::string message = std::string("model \"demo\": C:\\path\n\ttab\r bell\x07 end ") +
                              std::string(1, '\0') + "nul, ünïcode";
  const std::string line = "{\"msg\":\"" + JsonEscape(message) + "\"}";
  const nlohmann::json parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(parsed.is_object()) << line;
  EXPECT_EQ(parsed["msg"].get<std::string>(), message);
}

TEST(ConfigureLoggingTest, RefusesUnknownLevelsAndFormatsNamingTheFlag) {
  const absl::Status level = ConfigureLogging("loud", "text");
  EXPECT_EQ(level.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(level.message(), HasSubstr("--log-level"));
  EXPECT_THAT(level.message(), HasSubstr("\"loud\""));
  const absl::Status format = ConfigureLogging("info", "xml");
  EXPECT_EQ(format.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(format.message(), HasSubstr("--log-format"));
  EXPECT_TRUE(ConfigureLogging("off", "json").ok());
  EXPECT_TRUE(ConfigureLogging("debug", "text").ok());
}

}  // namespace
}  // namespace attnserve::server
