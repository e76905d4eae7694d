// attnserve::client::InferClient: ModelInfer calls of the Open Inference Protocol (KServe v2
// gRPC, inference.GRPCInferenceService) to an attnserve server, which serves it on the same port
// as attnserve.v1. It exists so C++ tools (attnserve-cli bench --protocol oip) can drive that
// protocol through the same channel settings as Client: TLS, retries, message limits, load
// balancing all come from ClientOptions.
//
//   auto infer = attnserve::client::InferClient::Create("127.0.0.1:50051");
//   absl::StatusOr<InferResult> result = (*infer)->Infer("demo", {data, {128, 512}});
//
// The request carries the input as raw little-endian FP32 bytes (raw_input_contents), tensor
// `input`, and the `causal` parameter when InferOptions::mask is kCausal; the server answers raw
// too. Errors keep the server's gRPC code and message; retries are those of Client (UNAVAILABLE,
// RESOURCE_EXHAUSTED, CANCELLED, up to ClientOptions::max_attempts).
//
// Thread-safe: one InferClient serves any number of threads and calls.
#ifndef ATTNSERVE_CLIENT_INFER_CLIENT_H_
#define ATTNSERVE_CLIENT_INFER_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnserve/client/client.h"
#include "attnserve/client/types.h"

namespace attnserve::client {

struct InferOptions {
  Mask mask = Mask::kNone;
  // The request's `id`, echoed back.
  std::string id = {};
  // 0 = ClientOptions::default_deadline.
  std::chrono::milliseconds deadline{0};
};

// The server's account of the batch, from the answer's parameters. The protocol's answer carries
// no batch_tokens; a field the server did not send stays empty (never a made-up 0).
struct InferTiming {
  std::optional<int64_t> queue_us = {};
  std::optional<int64_t> compute_us = {};
  std::optional<int64_t> batch_sequences = {};
};

struct InferResult {
  Tensor output = {};              // `output`, in the input's shape.
  std::string model = {};          // model_name of the answer.
  std::string model_version = {};  // The protocol's versions are strings.
  std::string id = {};
  InferTiming timing = {};
  std::chrono::microseconds latency{0};  // Client side: call start to answer, retries included.
};

class InferClient {
 public:
  using Callback = std::function<void(absl::StatusOr<InferResult>)>;

  // As Client::Create: does not connect yet; InvalidArgument naming the option for bad options.
  static absl::StatusOr<std::unique_ptr<InferClient>> Create(const std::string& target,
                                                             const ClientOptions& options = {});
  virtual ~InferClient() = default;

  // ModelInfer of `input` ([T, d_model] or [B, T, d_model]) by `model` ("" = the server's default
  // model). Blocks until the answer. InvalidArgument when the data does not hold product(shape)
  // elements (nothing sent); Internal for an answer without a well-formed `output`.
  virtual absl::StatusOr<InferResult> Infer(std::string_view model, TensorView input,
                                            const InferOptions& options = {}) = 0;
  // The same without blocking: `done` runs once, on a gRPC thread, and must not block; a request
  // that cannot be built is answered at once on the calling thread.
  virtual void InferAsync(std::string_view model, TensorView input, const InferOptions& options,
                          Callback done) = 0;
};

}  // namespace attnserve::client

#endif  // ATTNSERVE_CLIENT_INFER_CLIENT_H_
