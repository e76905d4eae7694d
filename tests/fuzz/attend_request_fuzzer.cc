// Fuzzes what the server does with the bytes of one received AttendRequest: a unary Attend and
// every AttendStream message carry the same message type and take the same path
// (server/service/attend_submitter.cc), so one target covers both:
//   1. protobuf parses the bytes (ParseWireMessage's parse; failing here is INVALID_ARGUMENT);
//   2. the request is routed to a model and ParseAttendRequest validates it against the model and
//      its limits (server/conversion/attnserve_v1);
//   3. an accepted request runs through the batch runner (the core validates its inputs again and
//      computes) and FillAttendResponse shapes the answer, which must serialise.
// The models are tiny (d_model 8) and the limits small, so every accepted request computes in
// microseconds.
//
// Invariants, beyond "no crash, no sanitizer report": a rejected request is INVALID_ARGUMENT; an
// accepted one computes, or fails only with OUT_OF_RANGE (finite inputs whose fp32 scores
// overflow); an OK answer has the request's shape and only finite values.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "attnserve/v1/attention.pb.h"
#include "core/forward/attention_config.h"
#include "core/forward/attention_layer.h"
#include "core/forward/attention_weights.h"
#include "core/model/model.h"
#include "core/util/float_format.h"
#include "google/protobuf/stubs/logging.h"
#include "server/batching/clock.h"
#include "server/conversion/attnserve_v1/conversion.h"
#include "server/runtime/attend_task.h"
#include "server/runtime/attend_work.h"
#include "server/runtime/batch_runner.h"
#include "server/runtime/model_limits.h"
#include "tests/fuzz/fuzz_check.h"

namespace attnserve::fuzz {
namespace {

using server::AttendResult;
using server::AttendWork;

struct Served {
  std::shared_ptr<const model::Model> model;
  server::ModelLimits limits;
};

// A model with random weights, its limits derived from config.json-style overrides as the
// server's model lifecycle derives them (ApplyModelConfig over the server's defaults).
Served MakeServed(const std::string& name, const core::AttentionConfig& attention) {
  model::ModelConfig config;
  config.attention = attention;
  config.max_sequence_length = 16;
  config.batching.max_batch_sequences = 4;
  config.batching.max_batch_tokens = 32;
  server::ModelLimits defaults;
  // Small enough that return_weights on the longest sequences is refused.
  defaults.request.max_response_bytes = 8 << 10;
  Served served{.limits = server::ApplyModelConfig(defaults, config)};
  FuzzCheck(server::ValidateModelLimits(served.limits).ok(), "the fuzzer's model limits");
  auto layer = core::AttentionLayer::Create(attention, core::MakeRandomWeights(attention, 7));
  FuzzCheck(layer.ok(), "creating the fuzzer's model", layer.status());
  auto model = std::make_shared<model::Model>();
  model->name = name;
  model->config = config;
  model->layer = *std::move(layer);
  model->source = "embedded";
  served.model = std::move(model);
  return served;
}

// The router's part, minus the name lookup: "single" is the single-head variant, any other name
// the default multi-head model (2 heads, bias), so that mutations of the name still reach the
// validation instead of stopping at NOT_FOUND.
const Served& Route(const std::string& name) {
  static const Served* const tiny = new Served(MakeServed(
      "tiny",
      {.d_model = 8, .num_heads = 2, .variant = core::AttentionVariant::kMultiHead, .bias = true}));
  static const Served* const single =
      new Served(MakeServed("single", {.d_model = 8,
                                       .num_heads = 1,
                                       .variant = core::AttentionVariant::kSingleHead,
                                       .bias = false}));
  return name == "single" ? *single : *tiny;
}

// The tensor's floats, whichever of values / raw holds them, raw decoded by its dtype.
std::vector<float> Floats(const v1::Tensor& tensor) {
  if (tensor.raw().empty()) return {tensor.values().begin(), tensor.values().end()};
  const std::optional<FloatFormat> format = FloatFormatNumbered(tensor.dtype());
  FuzzCheck(format.has_value(), "an answer's dtype is not a DataType");
  const int64_t bytes_per_value = FloatFormatBytes(*format);
  FuzzCheck(static_cast<int64_t>(tensor.raw().size()) % bytes_per_value == 0,
            "an answer's raw bytes are not whole values of its dtype");
  std::vector<float> values(tensor.raw().size() / static_cast<size_t>(bytes_per_value));
  DecodeFloats(tensor.raw().data(), static_cast<int64_t>(values.size()), *format, values.data());
  return values;
}

void CheckTensor(const v1::Tensor& tensor, const std::vector<int64_t>& shape,
                 const std::string& name) {
  FuzzCheck(std::vector<int64_t>(tensor.shape().begin(), tensor.shape().end()) == shape,
            absl::StrCat(name, ": not the expected shape"));
  int64_t elements = 1;
  for (int64_t dim : shape) elements *= dim;
  const std::vector<float> values = Floats(tensor);
  FuzzCheck(static_cast<int64_t>(values.size()) == elements,
            absl::StrCat(name, ": ", values.size(), " values for ", elements, " elements"));
  // binary16 ends at 65504: a larger finite fp32 answer asked for as FP16 is ±inf by design.
  const bool infinity_allowed = tensor.dtype() == v1::DATA_TYPE_FP16;
  for (float value : values) {
    FuzzCheck(!std::isnan(value) && (infinity_allowed || std::isfinite(value)),
              absl::StrCat(name, ": not finite"));
  }
}

// The answer to an accepted request, as the batch runner's done callback sees it.
void CheckAnswer(const v1::AttendRequest& request, const AttendWork& work,
                 absl::StatusOr<AttendResult> result) {
  v1::AttendResponse response;
  if (!result.ok()) {
    FuzzCheck(result.status().code() == absl::StatusCode::kOutOfRange,
              "an accepted request failed other than by fp32 overflow", result.status());
    server::FillErrorResponse(request.model(), request.request_id(), result.status(), &response);
    return;
  }
  const absl::Status filled = server::FillAttendResponse(work, *result, &response);
  FuzzCheck(filled.ok(), "FillAttendResponse of a computed request", filled);
  const std::vector<int64_t> input_shape(request.input().shape().begin(),
                                         request.input().shape().end());
  CheckTensor(response.output(), input_shape, "output");
  if (request.return_weights()) {
    const int64_t heads = work.model->config.attention.num_heads;
    std::vector<int64_t> shape = {heads, work.padded_query_length, work.padded_memory_length};
    if (work.batched) shape.insert(shape.begin(), work.sequences());
    CheckTensor(response.weights(), shape, "weights");
  }
  std::string bytes;
  FuzzCheck(response.SerializeToString(&bytes), "serialising the response");
}

void Attend(const v1::AttendRequest& request) {
  const Served& served = Route(request.model());
  absl::StatusOr<AttendWork> work =
      server::ParseAttendRequest(request, served.model, served.limits);
  if (!work.ok()) {
    FuzzCheck(work.status().code() == absl::StatusCode::kInvalidArgument,
              "a refused request is not INVALID_ARGUMENT", work.status());
    // What an AttendStream answers for it (a unary call returns the status itself).
    v1::AttendResponse response;
    server::FillErrorResponse(request.model(), request.request_id(), work.status(), &response);
    return;
  }
  // One compute thread, as a batch too small to be worth a second one runs.
  static server::BatchRunner* const runner = new server::BatchRunner({.compute_threads = 1});
  bool answered = false;
  server::BatchRunner::Batch batch;
  batch.tasks.push_back(std::make_unique<server::AttendTask>(
      *std::move(work), batching::kNoDeadline, nullptr,
      [&](const AttendWork& done_work, absl::StatusOr<AttendResult> result) {
        answered = true;
        CheckAnswer(request, done_work, std::move(result));
      }));
  batch.enqueue_us = {0};
  batch.sequences = batch.tasks.front()->sequences();
  batch.tokens = batch.tasks.front()->tokens();
  runner->Run(std::move(batch));
  FuzzCheck(answered, "the batch runner did not answer the request");
}

}  // namespace
}  // namespace attnserve::fuzz

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // protobuf logs every string field that is not UTF-8 before failing the parse: noise here.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  attnserve::v1::AttendRequest request;
  // ParseWireMessage's parse; a message protobuf cannot parse is answered INVALID_ARGUMENT there.
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  attnserve::fuzz::Attend(request);
  return 0;
}
