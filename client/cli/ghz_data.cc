#include "client/cli/ghz_data.h"

#include <google/protobuf/util/json_util.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "attnserve/v1/attention.pb.h"
#include "client/cli/random_values.h"

namespace attnserve::cli {

absl::StatusOr<std::vector<int64_t>> ParseShapeList(const std::string& text) {
  std::vector<int64_t> shape;
  for (const absl::string_view part : absl::StrSplit(text, absl::ByAnyChar(",x"))) {
    int64_t dim = 0;
    if (!absl::SimpleAtoi(part, &dim) || dim < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape '", text, "': expected positive integers like 16,512"));
    }
    shape.push_back(dim);
  }
  return shape;
}

absl::StatusOr<std::string> MakeGhzData(const GhzDataOptions& options) {
  if (options.shape.size() < 2 || options.shape.size() > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shape: expected T,D (or B,T,D), got ", options.shape.size(), " numbers"));
  }
  if (options.count < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--count: expected >= 1, got ", options.count));
  }
  size_t elements = 1;
  for (const int64_t dim : options.shape) {
    if (dim < 1) return absl::InvalidArgumentError("--shape: dimensions must be >= 1");
    elements *= static_cast<size_t>(dim);
  }
  google::protobuf::util::JsonPrintOptions print;
  print.add_whitespace = options.pretty;

  std::string out = options.count > 1 ? "[" : "";
  for (int i = 0; i < options.count; ++i) {
    v1::AttendRequest request;
    request.set_model(options.model);
    request.set_raw_output(options.raw_output);
    v1::Tensor* input = request.mutable_input();
    for (const int64_t dim : options.shape) input->add_shape(dim);
    const std::vector<float> values = RandomValues(elements, options.seed + i);
    if (options.raw) {
      std::string* raw = input->mutable_raw();
      raw->resize(values.size() * sizeof(float));
      std::memcpy(raw->data(), values.data(), raw->size());
    } else {
      input->mutable_values()->Add(values.begin(), values.end());
    }
    std::string json;
    const auto status = google::protobuf::util::MessageToJsonString(request, &json, print);
    if (!status.ok()) {
      return absl::InternalError(absl::StrCat("protobuf JSON printer: ", status.ToString()));
    }
    while (!json.empty() && json.back() == '\n') json.pop_back();
    if (i > 0) out += options.pretty ? ",\n" : ",";
    out += json;
  }
  if (options.count > 1) out += "]";
  out += "\n";
  return out;
}

}  // namespace attnserve::cli
