// Safetensors reading and writing: round trips through the writer, one test per kind of broken
// file (status code and message), FileBytes's errors, and the atomic file writer.
#include "core/model/safetensors_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "core/model/file_bytes.h"
#include "core/model/safetensors_writer.h"
#include "core/util/half_float.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_folder.h"

namespace attnserve::model {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::StartsWith;

// A file image built by hand: little-endian `header_length` (the JSON's size unless given), the
// JSON header, then `data`.
std::string Image(std::string_view header, std::string_view data = "",
                  uint64_t header_length = UINT64_MAX) {
  if (header_length == UINT64_MAX) header_length = header.size();
  std::string image;
  for (int i = 0; i < 8; ++i) image.push_back(static_cast<char>((header_length >> (8 * i)) & 0xff));
  image.append(header);
  image.append(data);
  return image;
}

std::span<const std::byte> Bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

absl::Status ParseStatus(const std::string& image) {
  return ParseSafetensors(Bytes(image)).status();
}

// `count` zero bytes: tensor data whose values do not matter to the test.
std::string Zeros(size_t count) { return std::string(count, '\0'); }

// The header entry for a tensor: "name": {...}.
std::string Entry(std::string_view name, std::string_view dtype, std::string_view shape,
                  std::string_view offsets) {
  return "\"" + std::string(name) + "\": {\"dtype\": \"" + std::string(dtype) +
         "\", \"shape\": " + std::string(shape) + ", \"data_offsets\": " + std::string(offsets) +
         "}";
}

void ExpectInvalid(const absl::Status& status, const std::vector<std::string>& fragments) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  for (const std::string& fragment : fragments) {
    EXPECT_THAT(Message(status), HasSubstr(fragment));
  }
}

// A fresh folder per test, removed afterwards.
class SafetensorsFileTest : public ::testing::Test {
 protected:
  fs::path WriteRaw(const std::string& name, std::string_view contents) {
    const fs::path path = dir_ / name;
    std::ofstream out(path, std::ios::binary);
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    return path;
  }

  std::vector<std::string> Listing() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      names.push_back(entry.path().filename().string());
    }
    return names;
  }

  attnserve::testing::TempFolder temp_{"safetensors_test"};
  const fs::path& dir_ = temp_.path();
};

using FileBytesTest = SafetensorsFileTest;
using SafetensorsWriterTest = SafetensorsFileTest;

// --- Valid files -----------------------------------------------------------------------------

TEST_F(SafetensorsFileTest, RoundTripsF32F16BF16AndMetadata) {
  const std::vector<float> w_q = {1.0f, -2.5f, 0.1f, 3.0e5f, -0.0f, 7.0f};
  const std::vector<float> b_q = {0.5f, -0.25f, 65504.0f};
  const std::vector<float> w_o = {1.0f, 0.1f, -3.0e38f, 1e-40f};
  const std::vector<TensorToWrite> tensors = {
      {.name = "W_Q", .dtype = TensorDtype::kF32, .shape = {2, 3}, .values = w_q},
      {.name = "b_Q", .dtype = TensorDtype::kF16, .shape = {3}, .values = b_q},
      {.name = "W_O", .dtype = TensorDtype::kBF16, .shape = {2, 2}, .values = w_o}};
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "héllo"}};
  auto image = SerializeSafetensors(tensors, metadata);
  ASSERT_TRUE(image.ok()) << image.status();
  const fs::path path = dir_ / "weights.safetensors";
  ASSERT_TRUE(WriteFileAtomically(path, *image).ok());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->path(), path);
  const SafetensorsIndex& index = file->index();
  EXPECT_THAT(index.metadata, ElementsAre(Pair("format", "pt"), Pair("note", "héllo")));
  ASSERT_EQ(index.tensors.size(), 3u);
  // In data-offset order, which is the writer's order.
  EXPECT_EQ(index.tensors[0].name, "W_Q");
  EXPECT_EQ(index.tensors[1].name, "b_Q");
  EXPECT_EQ(index.tensors[2].name, "W_O");

  const TensorView* t = index.Find("W_Q");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, TensorDtype::kF32);
  EXPECT_THAT(t->shape, ElementsAre(2, 3));
  EXPECT_EQ(t->num_elements(), 6);
  EXPECT_EQ(ReadFloat32(*t).value(), w_q);

  t = index.Find("b_Q");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, TensorDtype::kF16);
  EXPECT_EQ(t->bytes.size(), 6u);
  EXPECT_EQ(ReadFloat32(*t).value(), b_q);  // All exactly representable in binary16.

  t = index.Find("W_O");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, TensorDtype::kBF16);
  std::vector<float> expected;
  for (float v : w_o) expected.push_back(BFloat16ToFloat(FloatToBFloat16(v)));
  EXPECT_EQ(ReadFloat32(*t).value(), expected);
  EXPECT_EQ(index.Find("missing"), nullptr);
}

TEST_F(SafetensorsFileTest, WriterPadsTheHeaderToEightBytes) {
  for (size_t name_length = 1; name_length <= 9; ++name_length) {
    const std::vector<float> values = {1.0f};
    const std::vector<TensorToWrite> tensors = {
        {.name = std::string(name_length, 'x'), .shape = {1}, .values = values}};
    auto image = SerializeSafetensors(tensors, {});
    ASSERT_TRUE(image.ok()) << image.status();
    uint64_t header_length = 0;
    std::memcpy(&header_length, image->data(), 8);
    EXPECT_EQ((8 + header_length) % 8, 0u);
    EXPECT_EQ(image->size(), 8 + header_length + 4);
    const std::string header = image->substr(8, header_length);
    EXPECT_EQ(header.substr(0, header.find_last_not_of(' ') + 1).back(), '}');
    EXPECT_TRUE(ParseSafetensors(Bytes(*image)).ok());
  }
}

TEST_F(SafetensorsFileTest, F16ValuesRoundToNearestEven) {
  // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: it goes to 1 (even mantissa).
  const std::vector<float> values = {1.0f + 0x1.0p-11f, 0.1f, 1e6f};
  const std::vector<TensorToWrite> tensors = {
      {.name = "x", .dtype = TensorDtype::kF16, .shape = {3}, .values = values}};
  auto image = SerializeSafetensors(tensors, {});
  ASSERT_TRUE(image.ok());
  auto index = ParseSafetensors(Bytes(*image));
  ASSERT_TRUE(index.ok()) << index.status();
  const std::vector<float> read = ReadFloat32(index->tensors[0]).value();
  EXPECT_EQ(read[0], 1.0f);
  EXPECT_EQ(read[1], HalfToFloat(FloatToHalf(0.1f)));
  EXPECT_EQ(read[2], std::numeric_limits<float>::infinity());
}

TEST_F(SafetensorsFileTest, ReadsUnalignedData) {
  // A 3-byte U8 tensor first puts the F32 and F16 data at odd offsets.
  float f32[2] = {1.5f, -2.0f};
  uint16_t f16 = FloatToHalf(0.75f);
  std::string data = "abc";
  data.append(reinterpret_cast<const char*>(f32), sizeof(f32));
  data.append(reinterpret_cast<const char*>(&f16), sizeof(f16));
  const std::string header = "{" + Entry("u", "U8", "[3]", "[0, 3]") + ", " +
                             Entry("f", "F32", "[2]", "[3, 11]") + ", " +
                             Entry("h", "F16", "[]", "[11, 13]") + "}";
  const std::string image = Image(header, data);
  auto index = ParseSafetensors(Bytes(image));
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_THAT(ReadFloat32(*index->Find("f")).value(), ElementsAre(1.5f, -2.0f));
  // A scalar (shape []) has one element.
  EXPECT_EQ(index->Find("h")->num_elements(), 1);
  EXPECT_THAT(ReadFloat32(*index->Find("h")).value(), ElementsAre(0.75f));
}

TEST_F(SafetensorsFileTest, AcceptsEmptyIndexAndZeroSizedTensors) {
  auto empty = ParseSafetensors(Bytes(Image("{}")));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->tensors.empty());

  const std::string header =
      "{" + Entry("a", "F32", "[0, 4]", "[0, 0]") + ", " + Entry("b", "F32", "[1]", "[0, 4]") + "}";
  const std::string image = Image(header, Zeros(4));
  auto index = ParseSafetensors(Bytes(image));
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->Find("a")->num_elements(), 0);
  EXPECT_TRUE(ReadFloat32(*index->Find("a")).value().empty());
}

TEST_F(SafetensorsFileTest, ZeroSizedTensorWithHugeDimensionsHasNoElements) {
  // 0 bytes, so the file is valid; but 2^32 · 2^32 alone overflows int64, and num_elements() used
  // to multiply its way there (undefined behaviour, reported by UBSan;
  // tests/fuzz/regressions/safetensors/ holds the fuzzer's input).
  const std::string image =
      Image("{" + Entry("e", "BF16", "[4294967296, 4294967296, 0]", "[0, 0]") + "}");
  auto index = ParseSafetensors(Bytes(image));
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->Find("e")->num_elements(), 0);
  EXPECT_TRUE(ReadFloat32(*index->Find("e")).value().empty());
}

TEST_F(SafetensorsFileTest, DtypeNamesRoundTrip) {
  for (const char* name : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
                           "I32", "U32", "F32", "F64", "I64", "U64"}) {
    auto dtype = ParseDtype(name);
    ASSERT_TRUE(dtype.ok()) << name;
    EXPECT_EQ(DtypeName(*dtype), name);
  }
  EXPECT_EQ(DtypeSize(TensorDtype::kBool), 1);
  EXPECT_EQ(DtypeSize(TensorDtype::kBF16), 2);
  EXPECT_EQ(DtypeSize(TensorDtype::kF32), 4);
  EXPECT_EQ(DtypeSize(TensorDtype::kU64), 8);
  ExpectInvalid(ParseDtype("f32").status(), {"unknown dtype \"f32\"", "F32", "BF16", "BOOL"});
}

TEST_F(SafetensorsFileTest, ReadFloat32RejectsOtherDtypes) {
  const std::string image = Image("{" + Entry("x", "I32", "[2]", "[0, 8]") + "}", Zeros(8));
  auto index = ParseSafetensors(Bytes(image));
  ASSERT_TRUE(index.ok()) << index.status();
  ExpectInvalid(ReadFloat32(index->tensors[0]).status(),
                {"tensor \"x\" has dtype I32; expected F32, F16 or BF16"});
}

// --- Broken files: the length field and the JSON -----------------------------------------------

TEST_F(SafetensorsFileTest, RejectsFileShorterThanTheLengthField) {
  ExpectInvalid(ParseStatus(std::string(5, '\0')), {"file is 5 bytes", "8-byte header length"});
  ExpectInvalid(ParseStatus(""), {"file is 0 bytes"});
}

TEST_F(SafetensorsFileTest, RejectsDataCutShort) {
  const std::string image = Image("{" + Entry("w", "F32", "[4]", "[0, 16]") + "}", Zeros(12));
  ExpectInvalid(ParseStatus(image),
                {"tensor \"w\"", "[0, 16]", "end past the data section (12 bytes)"});
}

TEST_F(SafetensorsFileTest, RejectsHeaderLengthPastTheEnd) {
  ExpectInvalid(ParseStatus(Image("{}", "", 1000)),
                {"header length 1000", "runs past the end", "only 2 bytes"});
}

TEST_F(SafetensorsFileTest, RejectsHeaderOverTheCap) {
  ExpectInvalid(ParseStatus(Image("{}", "", 100'000'001)),
                {"header length 100000001", "exceeds the cap of 100000000"});
  // A length that would wrap around when added to 8.
  ExpectInvalid(ParseStatus(Image("{}", "", UINT64_MAX - 1)), {"exceeds the cap"});
}

TEST_F(SafetensorsFileTest, RejectsBadJson) {
  ExpectInvalid(ParseStatus(Image("{\"w\": ")), {"header is not valid JSON", "parse error"});
  ExpectInvalid(ParseStatus(Image("{} x")), {"header is not valid JSON"});
  // Invalid UTF-8 in a name.
  ExpectInvalid(ParseStatus(Image("{\"\xff\": 1}")), {"header is not valid JSON"});
}

TEST_F(SafetensorsFileTest, RejectsHeaderThatIsNotAnObject) {
  ExpectInvalid(ParseStatus(Image("[1, 2]")), {"header is a JSON array, expected an object"});
  ExpectInvalid(ParseStatus(Image("\"w\"")), {"header is a JSON string"});
}

TEST_F(SafetensorsFileTest, RejectsDuplicateTensorNames) {
  const std::string header =
      "{" + Entry("w", "F32", "[1]", "[0, 4]") + ", " + Entry("w", "F32", "[1]", "[4, 8]") + "}";
  ExpectInvalid(ParseStatus(Image(header, Zeros(8))), {"header has duplicate key \"w\""});
  ExpectInvalid(ParseStatus(Image(R"({"__metadata__": {}, "__metadata__": {}})")),
                {"header has duplicate key \"__metadata__\""});
}

TEST_F(SafetensorsFileTest, RejectsDuplicateMembersInAnEntry) {
  const std::string header =
      R"({"w": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}})";
  ExpectInvalid(ParseStatus(Image(header, Zeros(4))), {"duplicate key \"dtype\" inside \"w\""});
}

// --- Broken files: entries ---------------------------------------------------------------------

TEST_F(SafetensorsFileTest, RejectsEntryThatIsNotAnObject) {
  ExpectInvalid(ParseStatus(Image(R"({"w": [1, 2]})")),
                {"tensor \"w\"", "entry is a JSON array", "expected an object"});
}

TEST_F(SafetensorsFileTest, RejectsUnknownDtype) {
  const std::string image = Image("{" + Entry("w", "F17", "[1]", "[0, 4]") + "}", Zeros(4));
  ExpectInvalid(ParseStatus(image), {"tensor \"w\"", "unknown dtype \"F17\"", "F32", "BF16"});
  const std::string number =
      Image(R"({"w": {"dtype": 32, "shape": [1], "data_offsets": [0, 4]}})", Zeros(4));
  ExpectInvalid(ParseStatus(number),
                {"tensor \"w\"", "dtype is a JSON number", "expected a string"});
}

TEST_F(SafetensorsFileTest, RejectsEntryWithMissingMember) {
  const std::string image = Image(R"({"w": {"dtype": "F32", "shape": [1]}})", Zeros(4));
  ExpectInvalid(ParseStatus(image), {"tensor \"w\"", "missing member \"data_offsets\""});
}

TEST_F(SafetensorsFileTest, RejectsEntryWithExtraMember) {
  const std::string image =
      Image(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "offsets": [0, 4]}})",
            Zeros(4));
  ExpectInvalid(ParseStatus(image), {"tensor \"w\"", "unknown member \"offsets\"",
                                     "expected only dtype, shape and data_offsets"});
}

TEST_F(SafetensorsFileTest, RejectsNegativeShape) {
  const std::string image = Image("{" + Entry("w", "F32", "[2, -4]", "[0, 4]") + "}", Zeros(4));
  ExpectInvalid(ParseStatus(image),
                {"tensor \"w\"", "shape[1] is -4", "expected a non-negative integer"});
}

TEST_F(SafetensorsFileTest, RejectsNonIntegerShape) {
  ExpectInvalid(ParseStatus(Image("{" + Entry("w", "F32", "[2.5]", "[0, 4]") + "}", Zeros(4))),
                {"tensor \"w\"", "shape[0] is 2.5", "expected a non-negative integer"});
  ExpectInvalid(ParseStatus(Image("{" + Entry("w", "F32", "[\"1\"]", "[0, 4]") + "}", Zeros(4))),
                {"tensor \"w\"", "shape[0] is \"1\""});
  ExpectInvalid(ParseStatus(Image("{" + Entry("w", "F32", "4", "[0, 4]") + "}", Zeros(4))),
                {"tensor \"w\"", "shape is a JSON number", "expected an array"});
}

TEST_F(SafetensorsFileTest, RejectsMalformedDataOffsets) {
  ExpectInvalid(ParseStatus(Image("{" + Entry("w", "F32", "[1]", "[0, 4, 8]") + "}", Zeros(8))),
                {"tensor \"w\"", "data_offsets is [0,4,8]", "two integers"});
  ExpectInvalid(ParseStatus(Image("{" + Entry("w", "F32", "[0]", "[4, 0]") + "}", Zeros(4))),
                {"tensor \"w\"", "data_offsets [4, 0] has begin after end"});
  ExpectInvalid(ParseStatus(Image("{" + Entry("w", "F32", "[1]", "[-4, 0]") + "}", Zeros(4))),
                {"tensor \"w\"", "data_offsets[0] is -4"});
  ExpectInvalid(
      ParseStatus(Image("{" + Entry("w", "F32", "[1]", "[0, 18446744073709551615]") + "}")),
      {"tensor \"w\"", "data_offsets[1] is 18446744073709551615, larger than 2^63 - 1"});
}

TEST_F(SafetensorsFileTest, RejectsShapeThatDoesNotMatchTheBytes) {
  const std::string image = Image("{" + Entry("W_Q", "F32", "[4, 4]", "[0, 60]") + "}", Zeros(60));
  ExpectInvalid(ParseStatus(image),
                {"tensor \"W_Q\": shape [4, 4] × F32 needs 64 bytes, data_offsets span 60"});
}

TEST_F(SafetensorsFileTest, RejectsShapeWhoseProductOverflows) {
  // 2^32 · 2^32 elements overflow int64_t.
  ExpectInvalid(ParseStatus(Image(
                    "{" + Entry("w", "F32", "[4294967296, 4294967296]", "[0, 4]") + "}", Zeros(4))),
                {"tensor \"w\"", "shape [4294967296, 4294967296] × F32",
                 "needs more than 2^63 - 1 bytes", "span 4"});
  // 2^62 elements fit, but 2^64 bytes do not.
  ExpectInvalid(ParseStatus(Image("{" + Entry("w", "F32", "[4611686018427387904]", "[0, 4]") + "}",
                                  Zeros(4))),
                {"tensor \"w\"", "needs more than 2^63 - 1 bytes"});
  // A zero dimension makes the product zero, whatever the others are.
  EXPECT_TRUE(
      ParseStatus(
          Image("{" + Entry("w", "F32", "[9223372036854775807, 9223372036854775807, 0]", "[0, 0]") +
                "}"))
          .ok());
}

// --- Broken files: the data section ------------------------------------------------------------

TEST_F(SafetensorsFileTest, RejectsOverlappingRanges) {
  const std::string header =
      "{" + Entry("a", "F32", "[4]", "[0, 16]") + ", " + Entry("b", "F32", "[4]", "[8, 24]") + "}";
  ExpectInvalid(ParseStatus(Image(header, Zeros(24))),
                {"tensor \"b\"", "bytes [8, 24) overlap tensor \"a\" at [0, 16)"});
}

TEST_F(SafetensorsFileTest, RejectsAGapBetweenTensors) {
  const std::string header =
      "{" + Entry("a", "F32", "[4]", "[0, 16]") + ", " + Entry("b", "F32", "[4]", "[20, 36]") + "}";
  ExpectInvalid(ParseStatus(Image(header, Zeros(36))),
                {"gap in the data section", "bytes [16, 20) belong to no tensor",
                 "tensor \"b\" at [20, 36)"});
}

TEST_F(SafetensorsFileTest, RejectsAGapAtTheStart) {
  const std::string header = "{" + Entry("a", "F32", "[1]", "[4, 8]") + "}";
  ExpectInvalid(ParseStatus(Image(header, Zeros(8))), {"gap", "bytes [0, 4)", "tensor \"a\""});
}

TEST_F(SafetensorsFileTest, RejectsTrailingGarbage) {
  const std::string header = "{" + Entry("a", "F32", "[4]", "[0, 16]") + "}";
  ExpectInvalid(
      ParseStatus(Image(header, Zeros(16) + "junk")),
      {"trailing bytes", "data section is 20 bytes", "cover only 16", "tensor \"a\" at [0, 16)"});
  ExpectInvalid(ParseStatus(Image("{}", "junk")),
                {"trailing bytes", "data section is 4 bytes", "no tensors"});
}

// --- Broken files: metadata ----------------------------------------------------------------------

TEST_F(SafetensorsFileTest, RejectsMetadataThatIsNotStrings) {
  ExpectInvalid(ParseStatus(Image(R"({"__metadata__": {"format": "pt", "step": 1}})")),
                {"\"__metadata__\" must map to strings", "\"step\" is a JSON number (1)"});
  ExpectInvalid(ParseStatus(Image(R"({"__metadata__": ["pt"]})")),
                {"\"__metadata__\" is a JSON array", "expected an object of strings"});
}

// Deep nesting is refused before parsing, wherever it is: the parser's memory and the recursion
// of dump() (which overflowed the stack on 500,000 '[') stay bounded. Brackets in strings do not
// count, and 64 levels are still parsed (and then refused for what they hold).
TEST_F(SafetensorsFileTest, RejectsDeepNestingBeforeParsing) {
  constexpr size_t kDepth = 500'000;
  const std::string nested = std::string(kDepth, '[') + std::string(kDepth, ']');
  ExpectInvalid(ParseStatus(Image("{" + Entry("w", "F32", "[" + nested + "]", "[0, 4]") + "}")),
                {"header nests deeper than 64 levels (at byte "});
  ExpectInvalid(ParseStatus(Image(R"({"__metadata__": {"format": )" + nested + "}}")),
                {"header nests deeper than 64 levels"});
  // The header object, the entry and the shape array are 3 levels: 61 more make 64.
  const std::string deep = std::string(61, '[') + std::string(61, ']');
  ExpectInvalid(ParseStatus(Image("{" + Entry("w", "F32", "[" + deep + "]", "[0, 4]") + "}")),
                {"tensor \"w\"", "shape[0] is [[[[", "expected a non-negative integer"});
  const std::string deeper = std::string(62, '[') + std::string(62, ']');
  ExpectInvalid(ParseStatus(Image("{" + Entry("w", "F32", "[" + deeper + "]", "[0, 4]") + "}")),
                {"header nests deeper than 64 levels"});
  // A name of 100 '[' then an escaped quote and a '{': inside a string, none of it nests.
  const std::string image =
      Image("{" + Entry(std::string(100, '[') + "\\\"{", "F32", "[1]", "[0, 4]") + "}", Zeros(4));
  absl::StatusOr<SafetensorsIndex> index = ParseSafetensors(Bytes(image));
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->tensors[0].name, std::string(100, '[') + "\"{");
}

// --- SafetensorsFile::Open -----------------------------------------------------------------------

TEST_F(SafetensorsFileTest, OpenPrefixesErrorsWithThePath) {
  const fs::path path = WriteRaw("bad.safetensors", Image("[]"));
  auto file = SafetensorsFile::Open(path);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(file.status()),
              AllOf(StartsWith(path.string() + ": "), HasSubstr("header is a JSON array")));
}

TEST_F(SafetensorsFileTest, OpenOfAMissingFileIsNotFound) {
  auto file = SafetensorsFile::Open(dir_ / "missing.safetensors");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(file.status()), StartsWith((dir_ / "missing.safetensors").string()));
}

TEST_F(SafetensorsFileTest, OpenedFileSurvivesAMove) {
  const std::vector<float> values = {1.0f, 2.0f};
  const std::vector<TensorToWrite> tensors = {{.name = "x", .shape = {2}, .values = values}};
  const fs::path path = dir_ / "x.safetensors";
  ASSERT_TRUE(WriteFileAtomically(path, SerializeSafetensors(tensors, {}).value()).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  SafetensorsFile moved = *std::move(file);
  EXPECT_EQ(ReadFloat32(moved.index().tensors[0]).value(), values);
}

// --- FileBytes ---------------------------------------------------------------------------------

TEST_F(FileBytesTest, ReadsTheWholeFile) {
  const fs::path path = WriteRaw("data", "hello");
  auto file = FileBytes::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const std::span<const std::byte> bytes = file->bytes();
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), "hello");
  // Moving keeps the bytes at the same address and empties the source.
  FileBytes moved = *std::move(file);
  EXPECT_EQ(moved.bytes().data(), bytes.data());
  EXPECT_TRUE(
      file->bytes().empty());  // NOLINT(bugprone-use-after-move): testing the moved-from state.
  // Assigning over another FileBytes releases its bytes and takes these.
  auto other = FileBytes::Open(WriteRaw("other", "xyz"));
  ASSERT_TRUE(other.ok()) << other.status();
  *other = std::move(moved);
  EXPECT_EQ(other->bytes().data(), bytes.data());
  EXPECT_EQ(other->bytes().size(), 5u);
}

TEST_F(FileBytesTest, EmptyFileReadsAsAnEmptySpan) {
  auto file = FileBytes::Open(WriteRaw("empty", ""));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->bytes().empty());
}

// A file whose size differs from what fstat said when it was opened is being rewritten: Aborted,
// naming the path, never a fault. (/proc files report size 0 and then read as text: "grew".)
TEST_F(FileBytesTest, AFileChangingSizeWhileReadIsAbortedNotAFault) {
  auto file = FileBytes::Open("/proc/self/status");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(Message(file.status()),
              AllOf(StartsWith("/proc/self/status: "), HasSubstr("grew while it was read"),
                    HasSubstr("renaming it into place")));
}

TEST_F(FileBytesTest, MissingFileIsNotFound) {
  const fs::path path = dir_ / "missing";
  auto file = FileBytes::Open(path);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(file.status()),
              AllOf(StartsWith(path.string() + ": "), HasSubstr(std::strerror(ENOENT))));
  // A path through a regular file does not exist either.
  const fs::path through_file = WriteRaw("plain", "x") / "child";
  EXPECT_EQ(FileBytes::Open(through_file).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(FileBytesTest, DirectoryIsFailedPrecondition) {
  auto file = FileBytes::Open(dir_);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(file.status()),
              AllOf(StartsWith(dir_.string() + ": "), HasSubstr("directory"),
                    HasSubstr("not a regular file")));
}

TEST_F(FileBytesTest, FifoIsFailedPreconditionWithoutBlocking) {
  const fs::path path = dir_ / "fifo";
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0) << std::strerror(errno);
  auto file = FileBytes::Open(path);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(file.status()), HasSubstr("FIFO"));
}

TEST_F(FileBytesTest, SymlinkLoopIsInvalidArgument) {
  const fs::path a = dir_ / "a";
  const fs::path b = dir_ / "b";
  fs::create_symlink(b, a);
  fs::create_symlink(a, b);
  auto file = FileBytes::Open(a);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(file.status()),
              AllOf(StartsWith(a.string() + ": "), HasSubstr(std::strerror(ELOOP))));
}

TEST_F(FileBytesTest, FollowsSymlinks) {
  const fs::path target = WriteRaw("target", "abc");
  const fs::path link = dir_ / "link";
  fs::create_symlink(target, link);
  auto file = FileBytes::Open(link);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->bytes().size(), 3u);
}

// --- Writer --------------------------------------------------------------------------------------

TEST_F(SafetensorsWriterTest, RejectsBadTensors) {
  const std::vector<float> three = {1.0f, 2.0f, 3.0f};
  auto serialize = [](std::vector<TensorToWrite> tensors) {
    return SerializeSafetensors(tensors, {}).status();
  };
  ExpectInvalid(serialize({{.name = "w", .shape = {2, 2}, .values = three}}),
                {"tensor \"w\"", "shape [2, 2] has 4 elements, values has 3"});
  ExpectInvalid(
      serialize({{.name = "w", .dtype = TensorDtype::kI32, .shape = {3}, .values = three}}),
      {"tensor \"w\"", "cannot write dtype I32"});
  ExpectInvalid(serialize({{.name = "w", .shape = {3}, .values = three},
                           {.name = "w", .shape = {3}, .values = three}}),
                {"tensor \"w\"", "duplicate name"});
  ExpectInvalid(serialize({{.name = "", .shape = {3}, .values = three}}), {"name is empty"});
  ExpectInvalid(serialize({{.name = "__metadata__", .shape = {3}, .values = three}}), {"reserved"});
  ExpectInvalid(serialize({{.name = "w", .shape = {-1, -3}, .values = three}}),
                {"tensor \"w\"", "negative"});
}

TEST_F(SafetensorsWriterTest, WritesAnEmptyTensorWhateverItsOtherDimensions) {
  // The reader accepts [2^32, 2^32, 0] (no elements, 0 bytes); the writer used to multiply the
  // leading dimensions first and refuse it as "too large".
  constexpr int64_t kHuge = int64_t{1} << 32;
  auto serialize = [](std::vector<TensorToWrite> tensors) {
    return SerializeSafetensors(tensors, {});
  };
  auto image = serialize({{.name = "e", .shape = {kHuge, kHuge, 0}, .values = {}}});
  ASSERT_TRUE(image.ok()) << image.status();
  auto index = ParseSafetensors(Bytes(*image));
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_THAT(index->tensors[0].shape, ElementsAre(kHuge, kHuge, 0));
  // Still refused: a product past 2^63 with no zero, and values for an empty shape.
  const std::vector<float> one = {1.0f};
  ExpectInvalid(serialize({{.name = "w", .shape = {kHuge, kHuge}, .values = one}}).status(),
                {"tensor \"w\"", "too large"});
  ExpectInvalid(serialize({{.name = "w", .shape = {kHuge, 0}, .values = one}}).status(),
                {"tensor \"w\"", "has 0 elements, values has 1"});
}

TEST_F(SafetensorsWriterTest, ReplacesTheFileAndLeavesNoTemporary) {
  const fs::path path = WriteRaw("out", "old contents");
  ASSERT_TRUE(WriteFileAtomically(path, "new").ok());
  std::ifstream in(path, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "new");
  EXPECT_THAT(Listing(), ElementsAre("out"));
}

TEST_F(SafetensorsWriterTest, FailureIsInternalAndLeavesNoTemporary) {
  // Renaming a file over a non-empty directory fails after the temporary is written.
  const fs::path path = dir_ / "occupied";
  fs::create_directory(path);
  WriteRaw("occupied/keep", "x");
  const absl::Status status = WriteFileAtomically(path, "data");
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(Message(status), AllOf(StartsWith(path.string() + ": "), HasSubstr("rename")));
  EXPECT_THAT(Listing(), ElementsAre("occupied"));

  const absl::Status missing = WriteFileAtomically(dir_ / "no" / "such" / "dir", "data");
  EXPECT_EQ(missing.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(Message(missing), HasSubstr(std::strerror(ENOENT)));
}

}  // namespace
}  // namespace attnserve::model
