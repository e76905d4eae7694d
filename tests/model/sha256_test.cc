// Sha256Hex against the FIPS 180-2 test vectors (what `sha256sum` prints), and IsSha256Hex.
#include "core/model/sha256.h"

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace attnserve::model {
namespace {

TEST(Sha256Test, KnownDigests) {
  EXPECT_EQ(Sha256Hex("").value(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc").value(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq").value(),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // A million 'a's: more than one block, through the byte-span overload.
  const std::vector<std::byte> million(1'000'000, std::byte{'a'});
  EXPECT_EQ(Sha256Hex(std::span<const std::byte>(million)).value(),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256Test, BinaryBytesIncludingZerosCount) {
  const std::string with_nul("a\0b", 3);
  EXPECT_NE(Sha256Hex(with_nul).value(), Sha256Hex("ab").value());
  EXPECT_EQ(Sha256Hex(with_nul).value().size(), kSha256HexLength);
}

TEST(Sha256Test, IsSha256HexAcceptsSixtyFourHexDigitsOfEitherCase) {
  const std::string lower = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  EXPECT_TRUE(IsSha256Hex(lower));
  EXPECT_TRUE(IsSha256Hex("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD"));
  EXPECT_FALSE(IsSha256Hex(""));
  EXPECT_FALSE(IsSha256Hex(lower.substr(1)));
  EXPECT_FALSE(IsSha256Hex(lower + "0"));
  EXPECT_FALSE(IsSha256Hex(absl::StrCat("g", lower.substr(1))));
  EXPECT_FALSE(IsSha256Hex(absl::StrCat(" ", lower.substr(1))));
  EXPECT_FALSE(IsSha256Hex(absl::StrCat("sha256:", lower.substr(7))));
}

}  // namespace
}  // namespace attnserve::model
