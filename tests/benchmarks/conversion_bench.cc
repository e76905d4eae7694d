// attnserve_conversion_bench: what the server's conversion costs per request for each wire
// protocol, wire bytes included, on the demo model (d_model 512) with raw FP32 contents:
//   *Request:  request bytes -> protobuf message -> AttendWork (ParseAttendRequest for
//              attnserve.v1 Attend; ParseModelInferRequest for the Open Inference Protocol)
//   *Response: AttendResult -> response message -> response bytes
//   BM_V1ResponseEncoded: AttendResult -> response bytes (AttendResponseEncoder, what Attend and
//              AttendStream answer with), into an uninitialised buffer as gRPC's slice is
//   BM_DecodeRequest: a Decode message of B one-row steps -> DecodeRequest (on the heap, or on a
//              protobuf arena as the Decode stream parses) -> B StepRequests (ParseDecodeStep)
//   BM_DecodeAnswer: a Decode message's answer of B one-row steps (the runtime's output rows) ->
//              DecodeResponse (FillDecodeStepOutput per step) -> bytes; BM_DecodeAnswerEncoded the
//              same bytes by DecodeResponseEncoder, what the Decode stream answers with
// ModelInfer's cost beyond Attend's, and the encoder's against the message path, measured apart
// from the load generator, gRPC and a busy machine. Arguments: T (query rows).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnserve/v1/attention.pb.h"
#include "core/model/model.h"
#include "inference/grpc_predict_v2.pb.h"
#include "server/conversion/attnserve_v1/conversion.h"
#include "server/conversion/attnserve_v1/decode_conversion.h"
#include "server/conversion/attnserve_v1/decode_response_encoder.h"
#include "server/conversion/attnserve_v1/response_encoder.h"
#include "server/conversion/oip/oip_conversion.h"

namespace attnserve {
namespace {

std::shared_ptr<const model::Model> Demo() {
  absl::StatusOr<std::shared_ptr<const model::Model>> demo = model::DemoModel();
  if (!demo.ok()) {
    std::cerr << demo.status() << "\n";
    std::abort();
  }
  return *demo;
}

const server::ModelLimits kLimits{};

std::string InputBytes(int64_t rows) {
  std::vector<float> values(static_cast<size_t>(rows * 512));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 97) * 0.01f;
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

std::string V1RequestBytes(int64_t rows) {
  v1::AttendRequest request;
  request.set_model("demo");
  request.set_raw_output(true);
  request.mutable_input()->add_shape(rows);
  request.mutable_input()->add_shape(512);
  request.mutable_input()->set_raw(InputBytes(rows));
  return request.SerializeAsString();
}

std::string OipRequestBytes(int64_t rows) {
  inference::ModelInferRequest request;
  request.set_model_name("demo");
  auto* input = request.add_inputs();
  input->set_name("input");
  input->set_datatype("FP32");
  input->add_shape(rows);
  input->add_shape(512);
  request.add_raw_input_contents(InputBytes(rows));
  return request.SerializeAsString();
}

void Check(const absl::Status& status, benchmark::State& state) {
  if (!status.ok()) state.SkipWithError(status.ToString().c_str());
}

void BM_V1Request(benchmark::State& state) {
  const std::shared_ptr<const model::Model> model = Demo();
  const std::string bytes = V1RequestBytes(state.range(0));
  for (auto _ : state) {
    v1::AttendRequest request;
    request.ParseFromString(bytes);
    absl::StatusOr<server::AttendWork> work = server::ParseAttendRequest(request, model, kLimits);
    Check(work.status(), state);
    benchmark::DoNotOptimize(work);
  }
}

void BM_OipRequest(benchmark::State& state) {
  const std::shared_ptr<const model::Model> model = Demo();
  const std::string bytes = OipRequestBytes(state.range(0));
  for (auto _ : state) {
    inference::ModelInferRequest request;
    request.ParseFromString(bytes);
    server::oip::InferAnswer answer;
    absl::StatusOr<server::AttendWork> work =
        server::oip::ParseModelInferRequest(&request, model, kLimits, &answer);
    Check(work.status(), state);
    benchmark::DoNotOptimize(work);
  }
}

// The work and an answer of the right size for `rows`, as the batcher would hand them back.
struct Answered {
  server::AttendWork work;
  server::oip::InferAnswer answer;
  std::vector<float> output;
  server::AttendResult result;
};

Answered Answer(int64_t rows) {
  inference::ModelInferRequest request;
  request.ParseFromString(OipRequestBytes(rows));
  Answered answered;
  absl::StatusOr<server::AttendWork> work =
      server::oip::ParseModelInferRequest(&request, Demo(), kLimits, &answered.answer);
  if (!work.ok()) std::abort();
  answered.work = *std::move(work);
  answered.output.assign(static_cast<size_t>(rows * 512), 0.5f);
  answered.result.output = answered.output;
  answered.result.timing = {.queue_us = 10, .compute_us = 3000, .batch_sequences = 1};
  return answered;
}

void BM_V1Response(benchmark::State& state) {
  const Answered answered = Answer(state.range(0));
  for (auto _ : state) {
    v1::AttendResponse response;
    Check(server::FillAttendResponse(answered.work, answered.result, &response), state);
    benchmark::DoNotOptimize(response.SerializeAsString());
  }
}

void BM_V1ResponseEncoded(benchmark::State& state) {
  const Answered answered = Answer(state.range(0));
  for (auto _ : state) {
    absl::StatusOr<server::AttendResponseEncoder> encoder =
        server::AttendResponseEncoder::Create(answered.work, answered.result);
    Check(encoder.status(), state);
    if (!encoder.ok()) break;
    std::unique_ptr<char[]> bytes(new char[encoder->size()]);
    encoder->EncodeTo(bytes.get());
    benchmark::DoNotOptimize(bytes.get());
  }
}

void BM_OipResponse(benchmark::State& state) {
  const Answered answered = Answer(state.range(0));
  for (auto _ : state) {
    inference::ModelInferResponse response;
    Check(server::oip::FillModelInferResponse(answered.work, answered.result, answered.answer,
                                              &response),
          state);
    benchmark::DoNotOptimize(response.SerializeAsString());
  }
}

// A Decode message of B one-row steps (d_model 512, raw fp32), as a client sends a round.
std::string DecodeRequestBytes(int64_t steps) {
  v1::DecodeRequest request;
  request.set_request_id("round");
  const std::string row = InputBytes(1);
  for (int64_t i = 0; i < steps; ++i) {
    v1::DecodeStep* step = request.add_steps();
    step->set_session("session-" + std::to_string(i));
    step->mutable_rows()->add_shape(1);
    step->mutable_rows()->add_shape(512);
    step->mutable_rows()->set_raw(row);
    step->set_raw_output(true);
  }
  return request.SerializeAsString();
}

void BM_DecodeRequest(benchmark::State& state) {
  const server::DecodeStreamSession session{.id = 1, .model = Demo(), .serial = 1, .closed = {}};
  const std::string bytes = DecodeRequestBytes(state.range(0));
  const bool on_arena = state.range(1) != 0;
  for (auto _ : state) {
    google::protobuf::Arena arena;
    v1::DecodeRequest heap_request;
    v1::DecodeRequest& request =
        on_arena ? *google::protobuf::Arena::CreateMessage<v1::DecodeRequest>(&arena)
                 : heap_request;
    request.ParseFromString(bytes);
    for (int i = 0; i < request.steps_size(); ++i) {
      absl::StatusOr<decoding::StepRequest> step = server::ParseDecodeStep(request, i, session);
      Check(step.status(), state);
      benchmark::DoNotOptimize(step);
    }
  }
}

// A Decode answer of B steps of one row each (d_model 512) in `format`: the message without the
// outputs, and the outputs.
struct DecodeAnswer {
  v1::DecodeResponse response;
  std::vector<std::optional<server::DecodeStepOutput>> outputs;
};

DecodeAnswer MakeDecodeAnswer(int64_t steps, bool bf16) {
  const server::DecodeOutputFormat format{
      .raw_output = true, .raw_format = bf16 ? FloatFormat::kBFloat16 : FloatFormat::kFloat32};
  DecodeAnswer answer;
  answer.response.set_request_id("round");
  for (int64_t i = 0; i < steps; ++i) {
    answer.response.add_steps()->set_session("session-" + std::to_string(i));
    answer.outputs.push_back(server::DecodeStepOutput{
        .rows = std::vector<float>(512, 0.25f), .d_model = 512, .format = format});
  }
  return answer;
}

void BM_DecodeAnswer(benchmark::State& state) {
  const DecodeAnswer answer = MakeDecodeAnswer(state.range(0), state.range(1) != 0);
  for (auto _ : state) {
    v1::DecodeResponse response = answer.response;
    for (size_t i = 0; i < answer.outputs.size(); ++i) {
      const server::DecodeStepOutput& output = *answer.outputs[i];
      server::FillDecodeStepOutput(output.rows, output.d_model, output.format,
                                   response.mutable_steps(static_cast<int>(i)));
    }
    benchmark::DoNotOptimize(response.SerializeAsString());
  }
}

void BM_DecodeAnswerEncoded(benchmark::State& state) {
  const DecodeAnswer answer = MakeDecodeAnswer(state.range(0), state.range(1) != 0);
  for (auto _ : state) {
    v1::DecodeResponse response = answer.response;  // As the path above: a message per answer.
    absl::StatusOr<server::DecodeResponseEncoder> encoder =
        server::DecodeResponseEncoder::Create(response, answer.outputs);
    Check(encoder.status(), state);
    if (!encoder.ok()) break;
    std::unique_ptr<char[]> bytes(new char[encoder->size()]);
    encoder->EncodeTo(bytes.get());
    benchmark::DoNotOptimize(bytes.get());
  }
}

BENCHMARK(BM_V1Request)->Arg(16)->Arg(128)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_OipRequest)->Arg(16)->Arg(128)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_V1Response)->Arg(16)->Arg(128)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_V1ResponseEncoded)->Arg(16)->Arg(128)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_OipResponse)->Arg(16)->Arg(128)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeRequest)
    ->ArgNames({"B", "arena"})
    ->Args({64, 0})
    ->Args({64, 1})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeAnswer)
    ->ArgNames({"B", "bf16"})
    ->Args({64, 0})
    ->Args({64, 1})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeAnswerEncoded)
    ->ArgNames({"B", "bf16"})
    ->Args({64, 0})
    ->Args({64, 1})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace attnserve

BENCHMARK_MAIN();
