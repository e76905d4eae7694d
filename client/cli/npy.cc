#include "client/cli/npy.h"

#include <bit>
#include <cctype>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attnserve::cli {
namespace {

// The bytes are copied as they are into floats: the formats read and written are little-endian.
static_assert(std::endian::native == std::endian::little, "npy.cc assumes a little-endian host");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
// NumPy pads the header so that the data starts on a 64-byte boundary (aligned loads, mmap).
constexpr size_t kHeaderAlignment = 64;

uint32_t ReadLittleEndian(std::string_view bytes, size_t offset, size_t size) {
  uint32_t value = 0;
  for (size_t i = 0; i < size; ++i) {
    value |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
  }
  return value;
}

// The value text after `'key':` in the header dict, up to (not including) the next top-level
// comma or closing brace. Tolerates either quote style and any spacing.
std::optional<std::string> DictValue(const std::string& header, const std::string& key) {
  for (const char quote : {'\'', '"'}) {
    const std::string quoted = std::string(1, quote) + key + std::string(1, quote);
    size_t at = header.find(quoted);
    if (at == std::string::npos) continue;
    at = header.find(':', at + quoted.size());
    if (at == std::string::npos) return std::nullopt;
    ++at;
    while (at < header.size() && std::isspace(static_cast<unsigned char>(header[at]))) ++at;
    int depth = 0;
    size_t end = at;
    for (; end < header.size(); ++end) {
      const char c = header[end];
      if (c == '(') ++depth;
      if (c == ')') --depth;
      if (depth == 0 && (c == ',' || c == '}')) break;
    }
    std::string value = header.substr(at, end - at);
    while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back()))) {
      value.pop_back();
    }
    return value;
  }
  return std::nullopt;
}

std::string Unquote(const std::string& text) {
  if (text.size() >= 2 && (text.front() == '\'' || text.front() == '"') &&
      text.back() == text.front()) {
    return text.substr(1, text.size() - 2);
  }
  return text;
}

// "(3, 4)", "(5,)" or "()" into dimensions.
absl::StatusOr<std::vector<int64_t>> ParseShape(const std::string& text) {
  if (text.size() < 2 || text.front() != '(' || text.back() != ')') {
    return absl::InvalidArgumentError(
        absl::StrCat("npy header: 'shape' must be a tuple, got ", text));
  }
  std::vector<int64_t> shape;
  std::stringstream items(text.substr(1, text.size() - 2));
  std::string item;
  while (std::getline(items, item, ',')) {
    size_t first = item.find_first_not_of(" \t");
    if (first == std::string::npos) continue;  // The trailing comma of "(5,)".
    item = item.substr(first, item.find_last_not_of(" \tL") - first + 1);
    int64_t dim = 0;
    for (const char c : item) {
      if (!std::isdigit(static_cast<unsigned char>(c)) || dim > (int64_t{1} << 40)) {
        return absl::InvalidArgumentError(
            absl::StrCat("npy header: bad dimension '", item, "' in shape ", text));
      }
      dim = dim * 10 + (c - '0');
    }
    shape.push_back(dim);
  }
  return shape;
}

}  // namespace

absl::StatusOr<client::Tensor> ParseNpy(std::string_view bytes) {
  if (bytes.size() < kMagicSize + 4 || bytes.substr(0, kMagicSize) != kMagic) {
    return absl::InvalidArgumentError("not a .npy file (no \\x93NUMPY magic)");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  const int minor = static_cast<unsigned char>(bytes[7]);
  size_t header_start = 0;
  size_t header_size = 0;
  if (major == 1) {
    header_start = 10;
    header_size = ReadLittleEndian(bytes, 8, 2);
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return absl::InvalidArgumentError("npy file truncated in its header");
    header_start = 12;
    header_size = ReadLittleEndian(bytes, 8, 4);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("npy format version ", major, ".", minor,
                                                   " is not supported (1.0, 2.0 and 3.0 are)"));
  }
  if (bytes.size() < header_start + header_size) {
    return absl::InvalidArgumentError("npy file truncated in its header");
  }
  const std::string header(bytes.substr(header_start, header_size));

  const std::optional<std::string> descr = DictValue(header, "descr");
  const std::optional<std::string> fortran = DictValue(header, "fortran_order");
  const std::optional<std::string> shape_text = DictValue(header, "shape");
  if (!descr || !fortran || !shape_text) {
    return absl::InvalidArgumentError(absl::StrCat(
        "npy header lacks 'descr', 'fortran_order' or 'shape': ", header.substr(0, 200)));
  }
  const std::string dtype = Unquote(*descr);
  size_t item_size = 0;
  if (dtype == "<f4") {
    item_size = 4;
  } else if (dtype == "<f8") {
    item_size = 8;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("npy dtype '", dtype,
                     "' is not supported: expected '<f4' (little-endian float32) or '<f8' "
                     "(little-endian float64, converted to float32)"));
  }
  if (*fortran != "False") {
    return absl::InvalidArgumentError(
        absl::StrCat("npy array is in Fortran (column-major) order (fortran_order: ", *fortran,
                     "): save it in C order, e.g. numpy.save(path, numpy.ascontiguousarray(a))"));
  }
  absl::StatusOr<std::vector<int64_t>> shape = ParseShape(*shape_text);
  if (!shape.ok()) return shape.status();

  size_t count = 1;
  for (const int64_t dim : *shape) {
    if (dim != 0 && count > (size_t{1} << 40) / static_cast<size_t>(dim)) {
      return absl::InvalidArgumentError(absl::StrCat("npy shape ", *shape_text, " is too large"));
    }
    count *= static_cast<size_t>(dim);
  }
  const std::string_view data = bytes.substr(header_start + header_size);
  if (data.size() != count * item_size) {
    return absl::InvalidArgumentError(absl::StrCat("npy data holds ", data.size(), " bytes; shape ",
                                                   *shape_text, " of ", dtype, " needs ",
                                                   count * item_size));
  }
  client::Tensor tensor;
  tensor.shape = *std::move(shape);
  tensor.data.resize(count);
  if (item_size == 4) {
    std::memcpy(tensor.data.data(), data.data(), data.size());
  } else {
    for (size_t i = 0; i < count; ++i) {
      double value = 0;
      std::memcpy(&value, data.data() + i * 8, 8);
      tensor.data[i] = static_cast<float>(value);
    }
  }
  return tensor;
}

absl::StatusOr<client::Tensor> ReadNpy(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot open for reading"));
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) return absl::InternalError(absl::StrCat(path.string(), ": read failed"));
  absl::StatusOr<client::Tensor> tensor = ParseNpy(bytes);
  if (!tensor.ok()) {
    return absl::Status(tensor.status().code(),
                        absl::StrCat(path.string(), ": ", tensor.status().message()));
  }
  return tensor;
}

absl::StatusOr<std::string> SerializeNpy(std::span<const float> data,
                                         std::span<const int64_t> shape) {
  size_t count = 1;
  for (const int64_t dim : shape) {
    if (dim < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension ", dim));
    count *= static_cast<size_t>(dim);
  }
  if (count != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape (", absl::StrJoin(shape, ", "), ") needs ", count, " values, got ", data.size()));
  }
  // Python's repr of the tuple: "(5,)" for one dimension, "()" for none.
  std::string shape_text = absl::StrCat("(", absl::StrJoin(shape, ", "));
  if (shape.size() == 1) shape_text += ",";
  shape_text += ")";
  std::string header =
      absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': ", shape_text, ", }");
  const size_t unpadded = kMagicSize + 4 + header.size() + 1;  // +1: the closing newline.
  header.append((kHeaderAlignment - unpadded % kHeaderAlignment) % kHeaderAlignment, ' ');
  header += '\n';
  if (header.size() > 0xFFFF) return absl::InvalidArgumentError("too many dimensions for npy 1.0");

  std::string bytes(kMagic, kMagicSize);
  bytes += '\x01';
  bytes += '\x00';
  bytes += static_cast<char>(header.size() & 0xFF);
  bytes += static_cast<char>(header.size() >> 8);
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(data.data()), data.size_bytes());
  return bytes;
}

absl::Status WriteNpy(const std::filesystem::path& path, std::span<const float> data,
                      std::span<const int64_t> shape) {
  absl::StatusOr<std::string> bytes = SerializeNpy(data, shape);
  if (!bytes.ok()) return bytes.status();
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) return absl::InternalError(absl::StrCat(path.string(), ": cannot open for writing"));
  file.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
  file.close();
  if (!file) return absl::InternalError(absl::StrCat(path.string(), ": write failed"));
  return absl::OkStatus();
}

}  // namespace attnserve::cli
