#include "client/cli/rest_infer_client.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/util/json_numbers.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace attnserve::cli {
namespace {

using Json = nlohmann::json;
constexpr char kHeaderLength[] = "Inference-Header-Content-Length";

// The request body (and its JSON header's length with the binary extension).
std::pair<std::string, size_t> RequestBody(client::TensorView input,
                                           const client::InferOptions& options, RestBody body) {
  std::string shape = "[";
  for (size_t i = 0; i < input.shape.size(); ++i) {
    absl::StrAppend(&shape, i == 0 ? "" : ",", input.shape[i]);
  }
  shape.push_back(']');
  std::string text = "{";
  if (!options.id.empty()) absl::StrAppend(&text, "\"id\":", Json(options.id).dump(), ",");
  absl::StrAppend(&text, "\"parameters\":{\"causal\":",
                  options.mask == client::Mask::kCausal ? "true" : "false",
                  body == RestBody::kBinary ? ",\"binary_data_output\":true" : "", "},",
                  "\"inputs\":[{\"name\":\"input\",\"datatype\":\"FP32\",\"shape\":", shape);
  const size_t bytes = input.data.size() * sizeof(float);
  if (body == RestBody::kBinary) {
    absl::StrAppend(&text, ",\"parameters\":{\"binary_data_size\":", bytes, "}}]}");
    const size_t json_length = text.size();
    text.append(reinterpret_cast<const char*>(input.data.data()), bytes);
    return {std::move(text), json_length};
  }
  text.append(",\"data\":");
  AppendJsonFloats(input.data, &text);
  text.append("}]}");
  return {std::move(text), 0};
}

absl::Status HttpError(const httplib::Result& result) {
  if (!result) {
    return absl::UnavailableError(
        absl::StrCat("REST: no answer (", httplib::to_string(result.error()), ")"));
  }
  std::string message = result->body;
  Json parsed = Json::parse(result->body, nullptr, false);
  if (parsed.is_object() && parsed.contains("error") && parsed["error"].is_string()) {
    message = parsed["error"].get<std::string>();
  }
  const int status = result->status;
  const absl::StatusCode code = status == 400   ? absl::StatusCode::kInvalidArgument
                                : status == 404 ? absl::StatusCode::kNotFound
                                : status == 429 ? absl::StatusCode::kResourceExhausted
                                : status == 503 ? absl::StatusCode::kUnavailable
                                : status == 504 ? absl::StatusCode::kDeadlineExceeded
                                                : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat("HTTP ", status, ": ", message));
}

std::optional<int64_t> IntParameter(const Json& parameters, const char* name) {
  auto it = parameters.find(name);
  if (it == parameters.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

constexpr char kNumbersKey[] =
    "\x01"
    "numbers";
constexpr char kNumbersKeyText[] = "\\u0001numbers";

// The answer's `output` and timing; `binary` is the data after the JSON header (empty for JSON),
// `arrays` the data arrays lifted out of the header before parsing.
absl::StatusOr<client::InferResult> ParseAnswer(const Json& header, std::string_view binary,
                                                const std::vector<std::vector<double>>& arrays) {
  if (!header.is_object() || !header.contains("outputs")) {
    return absl::InternalError("REST: the answer has no outputs");
  }
  client::InferResult result;
  result.model = header.value("model_name", "");
  result.model_version = header.value("model_version", "");
  result.id = header.value("id", "");
  if (auto parameters = header.find("parameters"); parameters != header.end()) {
    result.timing.queue_us = IntParameter(*parameters, "queue_us");
    result.timing.compute_us = IntParameter(*parameters, "compute_us");
    result.timing.batch_sequences = IntParameter(*parameters, "batch_sequences");
  }
  size_t offset = 0;
  for (const Json& output : header["outputs"]) {
    size_t size = 0;
    if (output.contains("parameters") && output["parameters"].contains("binary_data_size")) {
      size = output["parameters"]["binary_data_size"].get<size_t>();
    }
    if (output.value("name", "") != "output") {
      offset += size;
      continue;
    }
    result.output.shape = output.value("shape", std::vector<int64_t>{});
    if (size > 0) {
      if (offset + size > binary.size()) {
        return absl::InternalError("REST: the answer's binary data is shorter than announced");
      }
      result.output.data.resize(size / sizeof(float));
      std::memcpy(result.output.data.data(), binary.data() + offset, size);
    } else if (output.contains("data")) {
      const Json& data = output["data"];
      if (data.is_object() && data.contains(kNumbersKey) &&
          data[kNumbersKey].get<size_t>() < arrays.size()) {
        const std::vector<double>& numbers = arrays[data[kNumbersKey].get<size_t>()];
        result.output.data.assign(numbers.begin(), numbers.end());
      } else {
        for (const Json& value : data) {
          result.output.data.push_back(static_cast<float>(value.get<double>()));
        }
      }
    }
    return result;
  }
  return absl::InternalError("REST: the answer has no `output`");
}

class RestInferClient final : public client::InferClient {
 public:
  RestInferClient(std::string host, int port, RestBody body)
      : host_(std::move(host)), port_(port), body_(body) {}

  ~RestInferClient() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    work_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }

  absl::StatusOr<client::InferResult> Infer(std::string_view model, client::TensorView input,
                                            const client::InferOptions& options) override {
    httplib::Client http(host_, port_);
    http.set_tcp_nodelay(true);
    return Call(http, model, input, options);
  }

  void InferAsync(std::string_view model, client::TensorView input,
                  const client::InferOptions& options, Callback done) override {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back([this, model = std::string(model), input, options, done = std::move(done)](
                        httplib::Client& http) { done(Call(http, model, input, options)); });
    // One connection per outstanding call: a new worker when none is idle.
    if (idle_ < static_cast<int>(jobs_.size()) &&
        static_cast<int>(workers_.size()) < kMaxRestConnections) {
      workers_.emplace_back([this] { Work(); });
    }
    work_.notify_one();
  }

 private:
  // The body for `input`, built once per distinct input: like ghz with its call data, the load
  // tool spends its CPU on sending and reading, not on re-encoding the same request (the server
  // still parses every one). Bounded by kMaxCachedBodyBytes; past it bodies are built per call.
  std::shared_ptr<const std::pair<std::string, size_t>> Body(client::TensorView input,
                                                             const client::InferOptions& options) {
    const BodyKey key{input.data.data(), input.data.size(), input.shape,
                      options.mask == client::Mask::kCausal, options.id};
    {
      std::lock_guard<std::mutex> lock(bodies_mu_);
      auto it = bodies_.find(key);
      if (it != bodies_.end()) return it->second;
    }
    auto body =
        std::make_shared<const std::pair<std::string, size_t>>(RequestBody(input, options, body_));
    std::lock_guard<std::mutex> lock(bodies_mu_);
    if (cached_bytes_ + body->first.size() <= kMaxCachedBodyBytes) {
      cached_bytes_ += body->first.size();
      bodies_.emplace(key, body);
    }
    return body;
  }

  absl::StatusOr<client::InferResult> Call(httplib::Client& http, std::string_view model,
                                           client::TensorView input,
                                           const client::InferOptions& options) {
    const auto start = std::chrono::steady_clock::now();
    const std::shared_ptr<const std::pair<std::string, size_t>> request = Body(input, options);
    const auto& [body, json_length] = *request;
    httplib::Headers headers;
    if (body_ == RestBody::kBinary) headers.emplace(kHeaderLength, absl::StrCat(json_length));
    if (model.empty()) {
      return absl::InvalidArgumentError("model: expected a name (REST names it in the URL)");
    }
    const std::string path = absl::StrCat("/v2/models/", std::string(model), "/infer");
    if (options.deadline.count() > 0) {
      http.set_read_timeout(
          std::chrono::duration_cast<std::chrono::microseconds>(options.deadline));
    }
    httplib::Result result =
        http.Post(path, headers, body,
                  body_ == RestBody::kBinary ? "application/octet-stream" : "application/json");
    if (!result || result->status != 200) return HttpError(result);
    size_t header_size = result->body.size();
    if (result->has_header(kHeaderLength) &&
        !absl::SimpleAtoi(result->get_header_value(kHeaderLength), &header_size)) {
      return absl::InternalError("REST: a malformed Inference-Header-Content-Length");
    }
    header_size = std::min(header_size, result->body.size());
    std::vector<std::vector<double>> arrays;
    const std::string reduced = ExtractJsonNumberArrays(
        std::string_view(result->body).substr(0, header_size), "data", kNumbersKeyText, 8, &arrays);
    Json header = Json::parse(reduced, nullptr, false);
    absl::StatusOr<client::InferResult> answer =
        ParseAnswer(header, std::string_view(result->body).substr(header_size), arrays);
    if (answer.ok()) {
      answer->latency = std::chrono::duration_cast<std::chrono::microseconds>(
          std::chrono::steady_clock::now() - start);
    }
    return answer;
  }

  void Work() {
    httplib::Client http(host_, port_);
    http.set_keep_alive(true);
    // The request's header and body go in two writes: with Nagle's algorithm the body would wait
    // for the server's delayed acknowledgement of the header (40 ms on Linux).
    http.set_tcp_nodelay(true);
    http.set_read_timeout(std::chrono::seconds(60));
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      work_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) return;
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job(http);
      lock.lock();
    }
  }

  static constexpr size_t kMaxCachedBodyBytes = size_t{64} << 20;
  using BodyKey = std::tuple<const float*, size_t, std::vector<int64_t>, bool, std::string>;

  const std::string host_;
  const int port_;
  const RestBody body_;
  std::mutex bodies_mu_;
  std::map<BodyKey, std::shared_ptr<const std::pair<std::string, size_t>>> bodies_;
  size_t cached_bytes_ = 0;
  std::mutex mu_;
  std::condition_variable work_;
  std::deque<std::function<void(httplib::Client&)>> jobs_;
  std::vector<std::thread> workers_;
  int idle_ = 0;
  bool stopping_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<client::InferClient>> MakeRestInferClient(const std::string& target,
                                                                         RestBody body) {
  const size_t colon = target.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(target.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rest-target: expected host:port, got \"", target, "\""));
  }
  return std::make_unique<RestInferClient>(target.substr(0, colon), port, body);
}

}  // namespace attnserve::cli
