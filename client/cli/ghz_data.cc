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

namespace {

// `rows` [rows, d] values from `seed` into `tensor` (raw float32 bytes or values).
void FillRows(int64_t rows, int64_t d, uint64_t seed, bool raw, v1::Tensor* tensor) {
  tensor->add_shape(rows);
  tensor->add_shape(d);
  const std::vector<float> values = RandomValues(static_cast<size_t>(rows * d), seed);
  if (raw) {
    std::string* bytes = tensor->mutable_raw();
    bytes->resize(values.size() * sizeof(float));
    std::memcpy(bytes->data(), values.data(), bytes->size());
  } else {
    tensor->mutable_values()->Add(values.begin(), values.end());
  }
}

// One Decode stream's messages (GhzDataOptions::decode_sessions).
std::vector<v1::DecodeRequest> DecodeMessages(const GhzDataOptions& options) {
  const int64_t context = options.shape[0], d = options.shape[1];
  std::vector<v1::DecodeRequest> messages(static_cast<size_t>(options.decode_steps) + 2);
  for (int k = 0; k < options.decode_sessions; ++k) {
    const std::string session = absl::StrCat("s", k);
    v1::DecodeOpen* open = messages.front().add_opens();
    open->set_session(session);
    open->set_model(options.model);
    for (int i = 0; i <= options.decode_steps; ++i) {
      v1::DecodeStep* step = messages[static_cast<size_t>(i)].add_steps();
      step->set_session(session);
      step->set_raw_output(options.raw_output);
      // Message 0 carries the prompt, then one row per message.
      FillRows(i == 0 ? context : 1, d, options.seed + (i == 0 ? k : 1000 + i * 64 + k),
               options.raw, step->mutable_rows());
    }
    messages.back().add_closes()->set_session(session);
  }
  return messages;
}

}  // namespace

absl::StatusOr<std::string> MakeGhzData(const GhzDataOptions& options) {
  if (options.decode_sessions < 0 || options.decode_steps < 0) {
    return absl::InvalidArgumentError("--decode-sessions and --decode-steps: expected >= 0");
  }
  if (options.decode_sessions > 0 && options.shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shape: expected C,D (prompt rows, d_model) with --decode-sessions, got ",
                     options.shape.size(), " numbers"));
  }
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
  if (options.decode_sessions > 0) {
    std::string out = "[";
    const std::vector<v1::DecodeRequest> messages = DecodeMessages(options);
    for (size_t i = 0; i < messages.size(); ++i) {
      std::string json;
      const auto status = google::protobuf::util::MessageToJsonString(messages[i], &json, print);
      if (!status.ok()) {
        return absl::InternalError(absl::StrCat("protobuf JSON printer: ", status.ToString()));
      }
      while (!json.empty() && json.back() == '\n') json.pop_back();
      if (i > 0) out += options.pretty ? ",\n" : ",";
      out += json;
    }
    return out + "]\n";
  }

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
