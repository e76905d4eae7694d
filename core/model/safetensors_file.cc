#include "core/model/safetensors_file.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "core/model/json_text.h"
#include "core/util/checked_math.h"
#include "core/util/half_float.h"
#include "nlohmann/json.hpp"

namespace attnserve::model {
namespace {

// The file format and ReadFloat32 both assume a little-endian host.
static_assert(std::endian::native == std::endian::little);

using Json = nlohmann::json;

// The reference implementation's cap: a header this large is an attack or a corrupt file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr size_t kLengthFieldBytes = 8;
constexpr char kMetadataKey[] = "__metadata__";

struct DtypeInfo {
  TensorDtype dtype;
  absl::string_view name;
  int64_t size;
};

constexpr std::array<DtypeInfo, 15> kDtypes = {{
    {TensorDtype::kBool, "BOOL", 1},
    {TensorDtype::kU8, "U8", 1},
    {TensorDtype::kI8, "I8", 1},
    {TensorDtype::kF8E5M2, "F8_E5M2", 1},
    {TensorDtype::kF8E4M3, "F8_E4M3", 1},
    {TensorDtype::kI16, "I16", 2},
    {TensorDtype::kU16, "U16", 2},
    {TensorDtype::kF16, "F16", 2},
    {TensorDtype::kBF16, "BF16", 2},
    {TensorDtype::kI32, "I32", 4},
    {TensorDtype::kU32, "U32", 4},
    {TensorDtype::kF32, "F32", 4},
    {TensorDtype::kF64, "F64", 8},
    {TensorDtype::kI64, "I64", 8},
    {TensorDtype::kU64, "U64", 8},
}};

const DtypeInfo& Info(TensorDtype dtype) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.dtype == dtype) return info;
  }
  return kDtypes[0];  // Unreachable for valid enumerators.
}

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

std::string Quoted(absl::string_view s) { return absl::StrCat("\"", s, "\""); }

// How every message names a tensor: tensor "W_Q".
std::string TensorLabel(absl::string_view name) { return absl::StrCat("tensor ", Quoted(name)); }

// A JSON value for an error message, shortened so a huge bad value cannot flood the log.
std::string JsonText(const Json& value) { return JsonSnippet(value, 80); }

absl::Status TensorError(absl::string_view name, absl::string_view detail) {
  return absl::InvalidArgumentError(absl::StrCat(TensorLabel(name), ": ", detail));
}

// One top-level entry after its own checks, before the cross-entry range checks.
struct ParsedEntry {
  TensorView view;
  int64_t begin = 0;
  int64_t end = 0;
};

absl::StatusOr<Json> ParseHeaderJson(const char* begin, const char* end) {
  absl::StatusOr<Json> header = ParseJson(std::string_view(begin, end - begin), "header");
  if (!header.ok()) return header.status();
  if (!header->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("header is a JSON ", header->type_name(), ", expected an object"));
  }
  return header;
}

// The length field and the split into header and data section.
struct ImageLayout {
  std::span<const std::byte> header;
  std::span<const std::byte> data;
};

absl::StatusOr<ImageLayout> SplitImage(std::span<const std::byte> image) {
  if (image.size() < kLengthFieldBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("file is ", image.size(), " bytes, too short for the 8-byte header length"));
  }
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, image.data(), kLengthFieldBytes);  // Little-endian host.
  if (header_bytes > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header length ", header_bytes, " exceeds the cap of ", kMaxHeaderBytes));
  }
  const size_t available = image.size() - kLengthFieldBytes;
  if (header_bytes > available) {
    return absl::InvalidArgumentError(absl::StrCat("header length ", header_bytes,
                                                   " runs past the end of the file: only ",
                                                   available, " bytes follow the length field"));
  }
  const auto header_size = static_cast<size_t>(header_bytes);
  return ImageLayout{.header = image.subspan(kLengthFieldBytes, header_size),
                     .data = image.subspan(kLengthFieldBytes + header_size)};
}

absl::StatusOr<std::map<std::string, std::string>> ParseMetadata(const Json& value) {
  if (!value.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Quoted(kMetadataKey), " is a JSON ", value.type_name(), ", expected an object of strings"));
  }
  std::map<std::string, std::string> metadata;
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Quoted(kMetadataKey), " must map to strings, but ", Quoted(key),
                       " is a JSON ", item.type_name(), " (", JsonText(item), ")"));
    }
    metadata.emplace(key, item.get<std::string>());
  }
  return metadata;
}

// `value` as a non-negative int64_t; `what` names it in the error ("shape[1]").
absl::StatusOr<int64_t> NonNegativeInteger(absl::string_view tensor, absl::string_view what,
                                           const Json& value) {
  if (value.is_number_unsigned()) {
    const auto number = value.get<uint64_t>();
    if (number <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return static_cast<int64_t>(number);
    }
    return TensorError(tensor, absl::StrCat(what, " is ", number, ", larger than 2^63 - 1"));
  }
  // nlohmann stores "-0" as a signed integer.
  if (value.is_number_integer() && value.get<int64_t>() >= 0) return value.get<int64_t>();
  return TensorError(
      tensor, absl::StrCat(what, " is ", JsonText(value), ", expected a non-negative integer"));
}

absl::Status CheckMembers(absl::string_view name, const Json& entry) {
  static constexpr std::array<absl::string_view, 3> kMembers = {"dtype", "shape", "data_offsets"};
  if (!entry.is_object()) {
    return TensorError(name, absl::StrCat("entry is a JSON ", entry.type_name(),
                                          ", expected an object with dtype, shape and "
                                          "data_offsets"));
  }
  for (auto it = entry.begin(); it != entry.end(); ++it) {
    const std::string& key = it.key();
    if (std::find(kMembers.begin(), kMembers.end(), absl::string_view(key)) == kMembers.end()) {
      return TensorError(name, absl::StrCat("unknown member ", Quoted(key),
                                            "; expected only dtype, shape and data_offsets"));
    }
  }
  for (absl::string_view member : kMembers) {
    if (!entry.contains(std::string(member))) {
      return TensorError(name, absl::StrCat("missing member ", Quoted(member)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorDtype> ParseEntryDtype(absl::string_view name, const Json& value) {
  if (!value.is_string()) {
    return TensorError(name, absl::StrCat("dtype is a JSON ", value.type_name(), " (",
                                          JsonText(value), "), expected a string"));
  }
  const auto& text = value.get_ref<const std::string&>();
  auto dtype = ParseDtype(text);
  if (!dtype.ok()) return TensorError(name, dtype.status().message());
  return *dtype;
}

absl::StatusOr<std::vector<int64_t>> ParseShape(absl::string_view name, const Json& value) {
  if (!value.is_array()) {
    return TensorError(name, absl::StrCat("shape is a JSON ", value.type_name(), " (",
                                          JsonText(value), "), expected an array"));
  }
  std::vector<int64_t> shape;
  shape.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    auto dim = NonNegativeInteger(name, absl::StrCat("shape[", i, "]"), value[i]);
    if (!dim.ok()) return dim.status();
    shape.push_back(*dim);
  }
  return shape;
}

absl::StatusOr<std::pair<int64_t, int64_t>> ParseOffsets(absl::string_view name,
                                                         const Json& value) {
  if (!value.is_array() || value.size() != 2) {
    return TensorError(name, absl::StrCat("data_offsets is ", JsonText(value),
                                          ", expected an array of two integers [begin, end]"));
  }
  auto begin = NonNegativeInteger(name, "data_offsets[0]", value[0]);
  if (!begin.ok()) return begin.status();
  auto end = NonNegativeInteger(name, "data_offsets[1]", value[1]);
  if (!end.ok()) return end.status();
  if (*begin > *end) {
    return TensorError(name,
                       absl::StrCat("data_offsets [", *begin, ", ", *end, "] has begin after end"));
  }
  return std::make_pair(*begin, *end);
}

absl::Status CheckByteCount(const ParsedEntry& entry) {
  const TensorView& view = entry.view;
  const std::string what =
      absl::StrCat("shape ", FormatShape(view.shape), " × ", AbslView(DtypeName(view.dtype)));
  const int64_t span = entry.end - entry.begin;
  const std::optional<int64_t> elements = CheckedProduct(view.shape);
  int64_t needed = 0;
  if (!elements.has_value() || __builtin_mul_overflow(*elements, DtypeSize(view.dtype), &needed)) {
    return TensorError(view.name, absl::StrCat(what,
                                               " needs more than 2^63 - 1 bytes, "
                                               "data_offsets span ",
                                               span));
  }
  if (needed != span) {
    return TensorError(view.name,
                       absl::StrCat(what, " needs ", needed, " bytes, data_offsets span ", span));
  }
  return absl::OkStatus();
}

absl::StatusOr<ParsedEntry> ParseEntry(const std::string& name, const Json& entry,
                                       size_t data_size) {
  if (auto s = CheckMembers(name, entry); !s.ok()) return s;
  ParsedEntry parsed;
  parsed.view.name = name;
  auto dtype = ParseEntryDtype(name, entry["dtype"]);
  if (!dtype.ok()) return dtype.status();
  parsed.view.dtype = *dtype;
  auto shape = ParseShape(name, entry["shape"]);
  if (!shape.ok()) return shape.status();
  parsed.view.shape = *std::move(shape);
  auto offsets = ParseOffsets(name, entry["data_offsets"]);
  if (!offsets.ok()) return offsets.status();
  std::tie(parsed.begin, parsed.end) = *offsets;
  if (auto s = CheckByteCount(parsed); !s.ok()) return s;
  if (static_cast<uint64_t>(parsed.end) > data_size) {
    return TensorError(name, absl::StrCat("data_offsets [", parsed.begin, ", ", parsed.end,
                                          "] end past the data section (", data_size, " bytes)"));
  }
  return parsed;
}

std::string RangeText(const ParsedEntry& entry) {
  return absl::StrCat("[", entry.begin, ", ", entry.end, ")");
}

// Sorts `entries` by offset and checks they tile the data section exactly: each tensor starts
// where the previous one ends, the first at 0 and the last at the end.
absl::Status CheckCoverage(std::vector<ParsedEntry>& entries, size_t data_size) {
  std::sort(entries.begin(), entries.end(), [](const ParsedEntry& a, const ParsedEntry& b) {
    return std::tie(a.begin, a.end, a.view.name) < std::tie(b.begin, b.end, b.view.name);
  });
  int64_t covered = 0;  // Bytes [0, covered) belong to the tensors checked so far.
  const ParsedEntry* previous = nullptr;
  for (const ParsedEntry& entry : entries) {
    if (entry.begin < covered) {
      return TensorError(entry.view.name, absl::StrCat("bytes ", RangeText(entry), " overlap ",
                                                       TensorLabel(previous->view.name), " at ",
                                                       RangeText(*previous)));
    }
    if (entry.begin > covered) {
      return absl::InvalidArgumentError(
          absl::StrCat("gap in the data section: bytes [", covered, ", ", entry.begin,
                       ") belong to no tensor (next is ", TensorLabel(entry.view.name), " at ",
                       RangeText(entry), ")"));
    }
    covered = entry.end;
    previous = &entry;
  }
  if (static_cast<uint64_t>(covered) != data_size) {
    const std::string after = previous == nullptr
                                  ? "there are no tensors"
                                  : absl::StrCat("the last is ", TensorLabel(previous->view.name),
                                                 " at ", RangeText(*previous));
    return absl::InvalidArgumentError(absl::StrCat("trailing bytes: the data section is ",
                                                   data_size, " bytes but tensors cover only ",
                                                   covered, " (", after, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view DtypeName(TensorDtype dtype) {
  const absl::string_view name = Info(dtype).name;
  return std::string_view(name.data(), name.size());
}

absl::StatusOr<TensorDtype> ParseDtype(std::string_view name) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.name == AbslView(name)) return info.dtype;
  }
  std::vector<absl::string_view> names;
  for (const DtypeInfo& info : kDtypes) names.push_back(info.name);
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", Quoted(AbslView(name)),
                                                 "; expected one of ", absl::StrJoin(names, ", ")));
}

int64_t DtypeSize(TensorDtype dtype) { return Info(dtype).size; }

int64_t TensorView::num_elements() const {
  // Not a plain running product: ParseSafetensors accepts an empty tensor such as
  // [2^32, 2^32, 0] (CheckByteCount counts it with CheckedProduct), whose leading dimensions alone
  // overflow int64, undefined behaviour that UBSan reports (the input is in
  // tests/fuzz/regressions/safetensors/).
  return CheckedProduct(shape).value_or(std::numeric_limits<int64_t>::max());
}

const TensorView* SafetensorsIndex::Find(std::string_view name) const {
  // Files hold a handful of tensors: a linear scan beats keeping a second index in sync.
  for (const TensorView& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

absl::StatusOr<SafetensorsIndex> ParseSafetensors(std::span<const std::byte> image) {
  auto layout = SplitImage(image);
  if (!layout.ok()) return layout.status();
  const auto* header_chars = reinterpret_cast<const char*>(layout->header.data());
  auto header = ParseHeaderJson(header_chars, header_chars + layout->header.size());
  if (!header.ok()) return header.status();

  SafetensorsIndex index;
  std::vector<ParsedEntry> entries;
  for (const auto& [name, value] : header->items()) {
    if (name == kMetadataKey) {
      auto metadata = ParseMetadata(value);
      if (!metadata.ok()) return metadata.status();
      index.metadata = *std::move(metadata);
      continue;
    }
    auto entry = ParseEntry(name, value, layout->data.size());
    if (!entry.ok()) return entry.status();
    entries.push_back(*std::move(entry));
  }
  if (auto s = CheckCoverage(entries, layout->data.size()); !s.ok()) return s;

  index.tensors.reserve(entries.size());
  for (ParsedEntry& entry : entries) {
    entry.view.bytes = layout->data.subspan(static_cast<size_t>(entry.begin),
                                            static_cast<size_t>(entry.end - entry.begin));
    index.tensors.push_back(std::move(entry.view));
  }
  return index;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::filesystem::path& path) {
  auto file = FileBytes::Open(path);
  if (!file.ok()) return file.status();
  return Parse(path, *std::move(file));
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::filesystem::path path, FileBytes file) {
  auto index = ParseSafetensors(file.bytes());
  if (!index.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": ", index.status().message()));
  }
  return SafetensorsFile(std::move(path), std::move(file), *std::move(index));
}

absl::StatusOr<std::vector<float>> ReadFloat32(const TensorView& tensor) {
  const auto count = static_cast<size_t>(tensor.num_elements());
  const bool convertible = tensor.dtype == TensorDtype::kF32 || tensor.dtype == TensorDtype::kF16 ||
                           tensor.dtype == TensorDtype::kBF16;
  if (!convertible) {
    return absl::InvalidArgumentError(absl::StrCat(TensorLabel(tensor.name), " has dtype ",
                                                   AbslView(DtypeName(tensor.dtype)),
                                                   "; expected F32, F16 or BF16"));
  }
  // ParseSafetensors guarantees this; a view built by hand might not.
  const size_t expected_bytes = count * static_cast<size_t>(DtypeSize(tensor.dtype));
  if (tensor.bytes.size() != expected_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(TensorLabel(tensor.name), ": shape ", FormatShape(tensor.shape), " × ",
                     AbslView(DtypeName(tensor.dtype)), " needs ", expected_bytes,
                     " bytes, the view has ", tensor.bytes.size()));
  }
  std::vector<float> values(count);
  // memcpy rather than casts: the data section need not be aligned for the element type.
  const std::byte* src = tensor.bytes.data();
  if (tensor.dtype == TensorDtype::kF32) {
    if (count > 0) std::memcpy(values.data(), src, count * sizeof(float));
    return values;
  }
  const bool is_half = tensor.dtype == TensorDtype::kF16;
  for (size_t i = 0; i < count; ++i) {
    uint16_t bits = 0;
    std::memcpy(&bits, src + i * sizeof(bits), sizeof(bits));
    values[i] = is_half ? HalfToFloat(bits) : BFloat16ToFloat(bits);
  }
  return values;
}

std::string FormatShape(std::span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace attnserve::model
