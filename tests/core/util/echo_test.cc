// EchoForMessage: short strings whole; long ones cut to 128 bytes on a character boundary, with
// their size.
#include "core/util/echo.h"

#include <string>

#include "gtest/gtest.h"

namespace attnserve {
namespace {

TEST(EchoForMessageTest, ShortTextIsQuotedWhole) {
  EXPECT_EQ(EchoForMessage(""), "");
  EXPECT_EQ(EchoForMessage("demo"), "demo");
  const std::string exact(kMaxEchoBytes, 'a');
  EXPECT_EQ(EchoForMessage(exact), exact);
}

TEST(EchoForMessageTest, LongTextIsCutAndSized) {
  const std::string long_name(8000, 'x');
  EXPECT_EQ(EchoForMessage(long_name), std::string(kMaxEchoBytes, 'x') + "...(8000 bytes)");
}

TEST(EchoForMessageTest, NeverCutsInsideAUtf8Character) {
  // 127 ASCII bytes, then "é" (2 bytes) straddling the cut at 128.
  const std::string text = std::string(127, 'a') + "\xC3\xA9" + std::string(10, 'b');
  EXPECT_EQ(EchoForMessage(text), std::string(127, 'a') + "...(139 bytes)");
}

}  // namespace
}  // namespace attnserve
