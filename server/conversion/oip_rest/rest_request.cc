// rest_conversion.h, request side: a REST infer body -> inference::ModelInferRequest.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/util/echo.h"
#include "core/util/json_numbers.h"
#include "nlohmann/json.hpp"
#include "server/conversion/oip_rest/rest_conversion.h"

namespace attnserve::server::oip_rest {
namespace {

using Json = nlohmann::json;
using InputTensor = inference::ModelInferRequest::InferInputTensor;

template <typename... Pieces>
absl::Status Invalid(const Pieces&... pieces) {
  return absl::InvalidArgumentError(absl::StrCat(pieces...));
}

std::string Quoted(absl::string_view text) {
  return absl::StrCat("\"", EchoForMessage(std::string_view(text.data(), text.size())), "\"");
}

// The JSON type of `value`, for messages.
absl::string_view TypeName(const Json& value) {
  if (value.is_number_integer()) return "an integer";
  if (value.is_number()) return "a number";
  if (value.is_boolean()) return "a boolean";
  if (value.is_string()) return "a string";
  if (value.is_array()) return "an array";
  if (value.is_object()) return "an object";
  return "null";
}

// Rejects nesting deeper than kMaxJsonDepth before the parser sees it: parsing is iterative, but
// a million '[' would still cost memory, and flattening `data` recurses.
absl::Status CheckDepth(absl::string_view json) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) {
        return Invalid("request body: expected JSON nested at most ", kMaxJsonDepth,
                       " levels deep, got deeper at byte ", i);
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return absl::OkStatus();
}

// Parses `text`, which is `original` with its data arrays lifted out; errors locate the problem
// in `original`.
absl::StatusOr<Json> ParseJson(absl::string_view text, absl::string_view original) {
  if (absl::Status depth = CheckDepth(text); !depth.ok()) return depth;
  Json parsed = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    text = original;
    // The parser without exceptions says only that it failed; the SAX pass says where.
    struct Locator : nlohmann::json_sax<Json> {
      std::string what;
      bool null() override { return true; }
      bool boolean(bool) override { return true; }
      bool number_integer(number_integer_t) override { return true; }
      bool number_unsigned(number_unsigned_t) override { return true; }
      bool number_float(number_float_t, const string_t&) override { return true; }
      bool string(string_t&) override { return true; }
      bool binary(binary_t&) override { return true; }
      bool start_object(std::size_t) override { return true; }
      bool key(string_t&) override { return true; }
      bool end_object() override { return true; }
      bool start_array(std::size_t) override { return true; }
      bool end_array() override { return true; }
      bool parse_error(std::size_t position, const std::string&,
                       const nlohmann::detail::exception&) override {
        what = absl::StrCat("byte ", position);
        return false;
      }
    } locator;
    Json::sax_parse(text.begin(), text.end(), &locator, nlohmann::detail::input_format_t::json,
                    /*strict=*/true);
    return Invalid("request body: expected a JSON object, got malformed JSON",
                   locator.what.empty() ? "" : absl::StrCat(" (at ", locator.what, ")"));
  }
  if (!parsed.is_object()) {
    return Invalid("request body: expected a JSON object, got ", TypeName(parsed));
  }
  return parsed;
}

// Fails unless every key of `object` is one of `known`.
absl::Status CheckKeys(const Json& object, absl::string_view where,
                       std::initializer_list<absl::string_view> known) {
  for (const auto& [key, value] : object.items()) {
    bool found = false;
    for (absl::string_view name : known) found = found || key == name;
    if (!found) {
      std::string list;
      for (absl::string_view name : known) absl::StrAppend(&list, list.empty() ? "" : ", ", name);
      return Invalid(where, ": expected only the keys ", list, ", got ", Quoted(key));
    }
  }
  return absl::OkStatus();
}

// JSON parameters -> the protocol's InferParameter map.
absl::Status ToParameters(const Json& object, absl::string_view where,
                          google::protobuf::Map<std::string, inference::InferParameter>* out) {
  if (!object.is_object()) {
    return Invalid(where, ": expected an object, got ", TypeName(object));
  }
  for (const auto& [key, value] : object.items()) {
    inference::InferParameter& parameter = (*out)[key];
    if (value.is_boolean()) {
      parameter.set_bool_param(value.get<bool>());
    } else if (value.is_number_unsigned()) {
      parameter.set_uint64_param(value.get<uint64_t>());
    } else if (value.is_number_integer()) {
      parameter.set_int64_param(value.get<int64_t>());
    } else if (value.is_number_float()) {
      parameter.set_double_param(value.get<double>());
    } else if (value.is_string()) {
      parameter.set_string_param(value.get<std::string>());
    } else {
      return Invalid(where, "[", Quoted(key), "]: expected a boolean, number or string, got ",
                     TypeName(value));
    }
  }
  return absl::OkStatus();
}

// How one element is read from JSON and written as raw bytes, by datatype.
enum class Element { kFloat, kInt32, kBool, kUint8, kUnsupported };

Element ElementOf(const std::string& datatype) {
  if (datatype == "FP32") return Element::kFloat;
  if (datatype == "INT32") return Element::kInt32;
  if (datatype == "BOOL") return Element::kBool;
  if (datatype == "UINT8") return Element::kUint8;
  return Element::kUnsupported;
}

// The data arrays lifted out of a body before parsing (ExtractJsonNumberArrays).
using Extractions = std::vector<std::vector<double>>;

// The values of one JSON tensor, flattened, in the form its datatype keeps.
struct Values {
  std::vector<float> floats;
  std::vector<int32_t> ints;
  std::vector<uint8_t> bytes;  // BOOL and UINT8
};

// The shortest text of `value`, for messages.
std::string NumberText(double value) {
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof(text), value).ptr);
}

size_t Count(const Values& values) {
  return values.floats.size() + values.ints.size() + values.bytes.size();
}

// One JSON number of the data, read as a double, into the form `element` keeps.
absl::Status AppendNumber(double value, Element element, const std::string& where, Values* out) {
  const auto wrong = [&](absl::string_view expected) {
    return Invalid(where, "[", Count(*out), "]: expected ", expected, ", got ", NumberText(value));
  };
  switch (element) {
    case Element::kFloat:
      if (!std::isfinite(static_cast<float>(value))) return wrong("a number within FP32's range");
      out->floats.push_back(static_cast<float>(value));
      return absl::OkStatus();
    case Element::kInt32:
      if (value != std::floor(value) || value < std::numeric_limits<int32_t>::min() ||
          value > std::numeric_limits<int32_t>::max()) {
        return wrong("an INT32 integer");
      }
      out->ints.push_back(static_cast<int32_t>(value));
      return absl::OkStatus();
    case Element::kBool:
      return wrong("true or false");
    case Element::kUint8:
      if (value != std::floor(value) || value < 0 || value > 255) {
        return wrong("an integer in 0..255");
      }
      out->bytes.push_back(static_cast<uint8_t>(value));
      return absl::OkStatus();
    case Element::kUnsupported:
      break;
  }
  return wrong("a value");
}

absl::Status AppendValue(const Json& value, Element element, const std::string& where,
                         Values* out) {
  if (value.is_number()) return AppendNumber(value.get<double>(), element, where, out);
  if (value.is_boolean() && element == Element::kBool) {
    out->bytes.push_back(value.get<bool>() ? 1 : 0);
    return absl::OkStatus();
  }
  return Invalid(where, "[", Count(*out), "]: expected ",
                 element == Element::kBool ? "true or false" : "a number", ", got ",
                 TypeName(value));
}

// Flattens `data` (nested arrays, row-major) into *out. Depth is bounded by CheckDepth.
absl::Status Flatten(const Json& data, Element element, const std::string& where, Values* out) {
  if (!data.is_array()) return AppendValue(data, element, where, out);
  for (const Json& item : data) {
    if (absl::Status s = Flatten(item, element, where, out); !s.ok()) return s;
  }
  return absl::OkStatus();
}

template <typename T>
void AppendRaw(const std::vector<T>& values, std::string* raw) {
  const size_t at = raw->size();
  raw->resize(at + values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(raw->data() + at, values.data(), values.size() * sizeof(T));
}

// Typed contents of the protocol, for requests without binary inputs.
void ToContents(Values values, Element element, InputTensor* tensor) {
  auto* contents = tensor->mutable_contents();
  switch (element) {
    case Element::kFloat:
      contents->mutable_fp32_contents()->Add(values.floats.begin(), values.floats.end());
      break;
    case Element::kInt32:
      contents->mutable_int_contents()->Add(values.ints.begin(), values.ints.end());
      break;
    case Element::kBool:
      for (uint8_t flag : values.bytes) contents->add_bool_contents(flag != 0);
      break;
    case Element::kUint8:
      for (uint8_t value : values.bytes) contents->add_uint_contents(value);
      break;
    case Element::kUnsupported:
      break;
  }
}

// One input's JSON description, before its data is placed.
struct InputJson {
  const Json* data = nullptr;     // null for binary inputs
  std::optional<int64_t> binary;  // binary_data_size
};

absl::StatusOr<InputJson> ToInputHeader(const Json& input, int index, InputTensor* tensor) {
  const std::string where = absl::StrCat("inputs[", index, "]");
  if (!input.is_object()) return Invalid(where, ": expected an object, got ", TypeName(input));
  if (auto s = CheckKeys(input, where, {"name", "shape", "datatype", "data", "parameters"});
      !s.ok()) {
    return s;
  }
  for (const char* key : {"name", "datatype"}) {
    auto it = input.find(key);
    if (it == input.end() || !it->is_string()) {
      return Invalid(where, ".", key, ": expected a string, got ",
                     it == input.end() ? "none" : TypeName(*it));
    }
  }
  tensor->set_name(input["name"].get<std::string>());
  tensor->set_datatype(input["datatype"].get<std::string>());
  auto shape = input.find("shape");
  if (shape == input.end() || !shape->is_array()) {
    return Invalid(where, ".shape: expected an array of integers, got ",
                   shape == input.end() ? "none" : TypeName(*shape));
  }
  for (size_t i = 0; i < shape->size(); ++i) {
    const Json& dim = (*shape)[i];
    if (!dim.is_number_integer() ||
        (dim.is_number_unsigned() &&
         dim.get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()})) {
      return Invalid(where, ".shape[", i, "]: expected an integer, got ",
                     dim.is_number() ? dim.dump() : std::string(TypeName(dim)));
    }
    tensor->add_shape(dim.get<int64_t>());
  }
  InputJson header;
  if (auto parameters = input.find("parameters"); parameters != input.end()) {
    const std::string at = absl::StrCat(where, ".parameters");
    if (!parameters->is_object()) {
      return Invalid(at, ": expected an object, got ", TypeName(*parameters));
    }
    if (auto s = CheckKeys(*parameters, at, {"binary_data_size"}); !s.ok()) return s;
    if (auto size = parameters->find("binary_data_size"); size != parameters->end()) {
      if (!size->is_number_unsigned()) {
        return Invalid(at, ".binary_data_size: expected an integer >= 0, got ",
                       size->is_number() ? size->dump() : std::string(TypeName(*size)));
      }
      if (size->get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()}) {
        return Invalid(at, ".binary_data_size: expected at most the body's size, got ",
                       size->dump());
      }
      header.binary = static_cast<int64_t>(size->get<uint64_t>());
    }
  }
  auto data = input.find("data");
  if (header.binary && data != input.end()) {
    return Invalid(where, ": expected its data in \"data\" or as binary data ",
                   "(parameters.binary_data_size), got both");
  }
  if (!header.binary) {
    if (data == input.end()) {
      return Invalid(where, ".data: expected the tensor's values (or parameters.binary_data_size ",
                     "with the values after the JSON header), got none");
    }
    header.data = &*data;
  }
  return header;
}

// Reads the JSON values of `tensor` into raw bytes (`raw` set) or its typed contents.
// The key that stands for an array ExtractJsonNumberArrays lifted out of the body, as parsed
// and as written into the text (a control character, escaped).
constexpr char kExtractedKey[] =
    "\x01"
    "attnserve-numbers";
constexpr char kExtractedKeyText[] = "\\u0001attnserve-numbers";

// The numbers `data` stands for when it is an extracted array, else null.
const std::vector<double>* Extracted(const Json& data, const Extractions& arrays) {
  if (!data.is_object() || data.size() != 1) return nullptr;
  auto it = data.find(kExtractedKey);
  if (it == data.end() || !it->is_number_unsigned() || it->get<uint64_t>() >= arrays.size()) {
    return nullptr;
  }
  return &arrays[it->get<uint64_t>()];
}

absl::Status PlaceJsonData(const Json& data, const Extractions& arrays, InputTensor* tensor,
                           std::string* raw) {
  const std::string where = absl::StrCat("inputs[", Quoted(tensor->name()), "].data");
  const Element element = ElementOf(tensor->datatype());
  if (element == Element::kUnsupported) {
    if (tensor->datatype() == "BF16" || tensor->datatype() == "FP16") {
      return Invalid(where, ": expected ", tensor->datatype(),
                     " values as binary data (parameters.binary_data_size; JSON has no ",
                     tensor->datatype(), " numbers), got JSON");
    }
    // The model's checks name the datatypes this tensor accepts.
    return absl::OkStatus();
  }
  Values values;
  if (const std::vector<double>* numbers = Extracted(data, arrays); numbers != nullptr) {
    if (element == Element::kFloat) {
      // The extraction kept only numbers within FP32's range (ParseJsonNumberArray).
      values.floats.assign(numbers->begin(), numbers->end());
    } else {
      for (double number : *numbers) {
        if (absl::Status s = AppendNumber(number, element, where, &values); !s.ok()) return s;
      }
    }
  } else if (absl::Status s = Flatten(data, element, where, &values); !s.ok()) {
    return s;
  }
  if (raw == nullptr) {
    ToContents(std::move(values), element, tensor);
  } else {
    AppendRaw(values.floats, raw);
    AppendRaw(values.ints, raw);
    AppendRaw(values.bytes, raw);
  }
  return absl::OkStatus();
}

absl::Status ToInputs(const Json& inputs, const Extractions& arrays, absl::string_view binary_data,
                      bool has_header_length, inference::ModelInferRequest* request) {
  if (!inputs.is_array()) {
    return Invalid("inputs: expected an array of tensors, got ", TypeName(inputs));
  }
  std::vector<InputJson> headers;
  bool any_binary = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    absl::StatusOr<InputJson> header =
        ToInputHeader(inputs[i], static_cast<int>(i), request->add_inputs());
    if (!header.ok()) return header.status();
    any_binary = any_binary || header->binary.has_value();
    headers.push_back(*header);
  }
  size_t offset = 0;
  for (size_t i = 0; i < headers.size(); ++i) {
    InputTensor* tensor = request->mutable_inputs(static_cast<int>(i));
    std::string* raw = any_binary ? request->add_raw_input_contents() : nullptr;
    if (headers[i].data != nullptr) {
      if (auto s = PlaceJsonData(*headers[i].data, arrays, tensor, raw); !s.ok()) return s;
      continue;
    }
    const uint64_t size = static_cast<uint64_t>(*headers[i].binary);
    if (!has_header_length) {
      return Invalid(kHeaderLengthHeader, ": expected the JSON header's length in bytes (inputs[",
                     Quoted(tensor->name()), "] has binary data after it), got none");
    }
    if (size > binary_data.size() - offset) {
      return Invalid("inputs[", Quoted(tensor->name()), "].parameters.binary_data_size: expected ",
                     "at most the ", binary_data.size() - offset,
                     " bytes of binary data left after the JSON header, got ", size);
    }
    raw->assign(binary_data.data() + offset, size);
    offset += size;
  }
  if (offset != binary_data.size()) {
    return Invalid("request body: expected ", offset,
                   " bytes of binary data after the JSON header (the inputs' binary_data_size), "
                   "got ",
                   binary_data.size());
  }
  return absl::OkStatus();
}

// *binary holds the request's default (binary_data_output) on entry.
absl::Status ToOutputs(const Json& outputs, bool binary_default,
                       inference::ModelInferRequest* request, BinaryOutputs* binary) {
  if (!outputs.is_array()) {
    return Invalid("outputs: expected an array of {\"name\": ...}, got ", TypeName(outputs));
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string where = absl::StrCat("outputs[", i, "]");
    const Json& output = outputs[i];
    if (!output.is_object()) return Invalid(where, ": expected an object, got ", TypeName(output));
    if (auto s = CheckKeys(output, where, {"name", "parameters"}); !s.ok()) return s;
    auto name = output.find("name");
    if (name == output.end() || !name->is_string()) {
      return Invalid(where, ".name: expected a string, got ",
                     name == output.end() ? "none" : TypeName(*name));
    }
    request->add_outputs()->set_name(name->get<std::string>());
    bool wanted = binary_default;
    if (auto parameters = output.find("parameters"); parameters != output.end()) {
      const std::string at = absl::StrCat(where, ".parameters");
      if (!parameters->is_object()) {
        return Invalid(at, ": expected an object, got ", TypeName(*parameters));
      }
      if (auto s = CheckKeys(*parameters, at, {"binary_data"}); !s.ok()) return s;
      if (auto flag = parameters->find("binary_data"); flag != parameters->end()) {
        if (!flag->is_boolean()) {
          return Invalid(at, ".binary_data: expected true or false, got ", TypeName(*flag));
        }
        wanted = flag->get<bool>();
      }
    }
    // Unknown names are the model's checks to refuse.
    if (*name == "output") binary->output = wanted;
    if (*name == "weights") binary->weights = wanted;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<size_t> ParseHeaderLength(std::string_view value, size_t body_size) {
  size_t length = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), length);
  if (value.empty() || error != std::errc() || end != value.data() + value.size() ||
      length > body_size) {
    return Invalid(kHeaderLengthHeader, ": expected the JSON header's length in bytes (0..",
                   body_size, ", the body's size), got ",
                   Quoted(absl::string_view(value.data(), value.size())));
  }
  return length;
}

absl::Status ParseInferRequest(std::string_view model_name, std::string_view version,
                               std::string_view body, std::optional<size_t> json_length,
                               inference::ModelInferRequest* request, BinaryOutputs* binary) {
  request->Clear();
  *binary = {};
  const absl::string_view body_view(body.data(), body.size());
  const size_t header_size = json_length.value_or(body.size());
  // The data arrays, most of a body, are read by the fast reader; the parser reads the rest.
  const absl::string_view header = body_view.substr(0, header_size);
  Extractions arrays;
  const std::string reduced =
      ExtractJsonNumberArrays(std::string_view(header.data(), header.size()), "data",
                              kExtractedKeyText, kMaxJsonDepth, &arrays);
  absl::StatusOr<Json> parsed = ParseJson(reduced, header);
  if (!parsed.ok()) return parsed.status();
  const Json& root = *parsed;
  if (auto s = CheckKeys(root, "request body", {"id", "parameters", "inputs", "outputs"});
      !s.ok()) {
    return s;
  }
  request->set_model_name(std::string(model_name));
  request->set_model_version(std::string(version));
  if (auto id = root.find("id"); id != root.end()) {
    if (!id->is_string()) return Invalid("id: expected a string, got ", TypeName(*id));
    request->set_id(id->get<std::string>());
  }
  bool binary_default = false;
  if (auto parameters = root.find("parameters"); parameters != root.end()) {
    if (auto s = ToParameters(*parameters, "parameters", request->mutable_parameters()); !s.ok()) {
      return s;
    }
    // The extension's own parameter; the model sees the rest.
    auto* map = request->mutable_parameters();
    if (auto it = map->find("binary_data_output"); it != map->end()) {
      if (it->second.parameter_choice_case() != inference::InferParameter::kBoolParam) {
        return Invalid("parameters[\"binary_data_output\"]: expected true or false");
      }
      binary_default = it->second.bool_param();
      map->erase(it);
    }
  }
  auto inputs = root.find("inputs");
  if (inputs == root.end()) {
    return Invalid("inputs: expected an array of tensors, got none");
  }
  if (auto s = ToInputs(*inputs, arrays, body_view.substr(header_size), json_length.has_value(),
                        request);
      !s.ok())
    return s;
  binary->output = binary_default;
  binary->weights = binary_default;
  if (auto outputs = root.find("outputs"); outputs != root.end()) {
    if (auto s = ToOutputs(*outputs, binary_default, request, binary); !s.ok()) return s;
  }
  return absl::OkStatus();
}

int HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

}  // namespace attnserve::server::oip_rest
