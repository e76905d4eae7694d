// The .npy reader and writer: round trips, the 2.0 header, float64 conversion, and rejected
// files whose messages name the problem.
#include "client/cli/npy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/support/temp_folder.h"

namespace attnserve::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// A .npy file as NumPy writes it: `major`.0 header with `dict` (padded to 64 bytes), then `data`.
std::string MakeNpy(int major, const std::string& dict, const std::string& data) {
  std::string header = dict;
  const size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string bytes = "\x93NUMPY";
  bytes += static_cast<char>(major);
  bytes += '\0';
  const size_t size = header.size();
  for (size_t i = 0; i < (major == 1 ? 2u : 4u); ++i) bytes += static_cast<char>(size >> (8 * i));
  return bytes + header + data;
}

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

TEST(NpyTest, RoundTripsThroughAFile) {
  testing::TempFolder temp;
  const std::vector<float> data = {1.5f, -2.0f, 0.25f, 3.0f, 4.0f, -0.0f};
  const std::vector<int64_t> shape = {2, 3};
  const auto path = temp.path() / "x.npy";
  ASSERT_TRUE(WriteNpy(path, data, shape).ok());
  absl::StatusOr<client::Tensor> read = ReadNpy(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_THAT(read->shape, ElementsAre(2, 3));
  EXPECT_THAT(read->data, ElementsAreArray(data));
}

TEST(NpyTest, WritesVersion1HeaderAlignedTo64Bytes) {
  const std::vector<float> data(5, 1.0f);
  const std::vector<int64_t> shape = {5};
  absl::StatusOr<std::string> bytes = SerializeNpy(data, shape);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t header = static_cast<unsigned char>((*bytes)[8]) |
                        static_cast<size_t>(static_cast<unsigned char>((*bytes)[9])) << 8;
  EXPECT_EQ((10 + header) % 64, 0u);
  EXPECT_EQ(bytes->size(), 10 + header + 5 * sizeof(float));
  // NumPy's repr of a one-element tuple keeps its trailing comma.
  EXPECT_THAT(*bytes, HasSubstr("'shape': (5,)"));
  EXPECT_THAT(*bytes, HasSubstr("'descr': '<f4'"));
}

TEST(NpyTest, ReadsVersion2Header) {
  const std::vector<float> data = {1, 2, 3, 4};
  absl::StatusOr<client::Tensor> read = ParseNpy(
      MakeNpy(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 2), }", Bytes(data)));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_THAT(read->shape, ElementsAre(1, 2, 2));
  EXPECT_THAT(read->data, ElementsAreArray(data));
}

TEST(NpyTest, ConvertsFloat64ToFloat32) {
  const std::vector<double> data = {0.5, -1.25, 1e-3};
  absl::StatusOr<client::Tensor> read = ParseNpy(
      MakeNpy(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", Bytes(data)));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_THAT(read->data, ElementsAre(0.5f, -1.25f, static_cast<float>(1e-3)));
}

TEST(NpyTest, RejectsOtherDtypesNamingThem) {
  for (const char* dtype : {"<i8", ">f4", "<f2", "|u1"}) {
    absl::StatusOr<client::Tensor> read = ParseNpy(MakeNpy(
        1, std::string("{'descr': '") + dtype + "', 'fortran_order': False, 'shape': (2,), }",
        std::string(16, '\0')));
    ASSERT_FALSE(read.ok()) << dtype;
    EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(read.status().message(), HasSubstr(std::string("'") + dtype + "'"));
    EXPECT_THAT(read.status().message(), HasSubstr("'<f4'"));
  }
}

TEST(NpyTest, RejectsFortranOrder) {
  absl::StatusOr<client::Tensor> read = ParseNpy(MakeNpy(
      1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", std::string(16, '\0')));
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(), HasSubstr("Fortran"));
}

TEST(NpyTest, RejectsMalformedFiles) {
  EXPECT_THAT(ParseNpy("not numpy at all").status().message(), HasSubstr("magic"));
  // Data shorter than the shape says.
  EXPECT_THAT(ParseNpy(MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
                               std::string(8, '\0')))
                  .status()
                  .message(),
              HasSubstr("needs 12"));
  // A header length past the end of the file.
  std::string truncated =
      MakeNpy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", std::string(4, '\0'));
  EXPECT_FALSE(ParseNpy(truncated.substr(0, 20)).ok());
  EXPECT_THAT(ParseNpy(MakeNpy(4, "{}", "")).status().message(), HasSubstr("version 4"));
  EXPECT_EQ(ReadNpy("/nonexistent/x.npy").status().code(), absl::StatusCode::kNotFound);
}

TEST(NpyTest, SerializeRejectsAShapeThatDoesNotMatchTheData) {
  const std::vector<float> data(5);
  const std::vector<int64_t> shape = {2, 3};
  EXPECT_EQ(SerializeNpy(data, shape).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace attnserve::cli
