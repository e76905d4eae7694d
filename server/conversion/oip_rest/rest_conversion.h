// Conversion for the Open Inference Protocol's HTTP/REST binding (KServe v2 REST): JSON bodies,
// with the binary tensor data extension, to and from the protocol's messages, so that a REST
// infer takes exactly the path of a gRPC ModelInfer (oip_conversion.h validates it against the
// model). The HTTP server itself lives in server/http/; nothing here sees HTTP.
//
// A request body is JSON: {"id", "parameters", "inputs": [{"name", "shape", "datatype",
// "data" | "parameters": {"binary_data_size": N}}], "outputs": [{"name", "parameters":
// {"binary_data": bool}}]}. With the binary extension the JSON header is the first
// Inference-Header-Content-Length bytes of the body and the binary inputs follow it, in input
// order. JSON `data` may be flat or nested (row-major). When any input is binary, every input
// travels as raw little-endian bytes; otherwise as the protocol's typed contents. Either way the
// values reach the model bit for bit (JSON numbers are read as doubles, then rounded once to
// FP32). The request parameter `binary_data_output` (bool) asks for every output as binary
// data; an output's own `binary_data` overrides it.
//
// Pure functions; thread-safe.
#ifndef ATTNSERVE_SERVER_CONVERSION_OIP_REST_REST_CONVERSION_H_
#define ATTNSERVE_SERVER_CONVERSION_OIP_REST_REST_CONVERSION_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inference/grpc_predict_v2.pb.h"

namespace attnserve::server::oip_rest {

// The header of the binary tensor data extension: the JSON part's length in bytes.
inline constexpr char kHeaderLengthHeader[] = "Inference-Header-Content-Length";
// The deepest nesting of arrays and objects a request body may have.
inline constexpr int kMaxJsonDepth = 16;

// Which outputs the answer carries as binary data, decided from the request.
struct BinaryOutputs {
  bool output = false;
  bool weights = false;
};

// An answer body: JSON, then (when json_length is set) the binary outputs.
struct RestBody {
  std::string bytes;
  std::optional<size_t> json_length = {};  // The Inference-Header-Content-Length to send.
};

// The JSON part's length from the header's value `value` for a body of `body_size` bytes.
// InvalidArgument naming the header unless it is a decimal integer in 0..body_size.
absl::StatusOr<size_t> ParseHeaderLength(std::string_view value, size_t body_size);

// Parses an infer body for the model and version of the URL (`version` "" = the serving one)
// into *request (overwritten) and *binary. `json_length` is the parsed
// Inference-Header-Content-Length (nullopt: the whole body is JSON). InvalidArgument naming the
// field (`inputs[1].shape`, `inputs["input"].data`, `parameters["causal"]`) with the expected and
// the received value for malformed JSON (with its byte offset), nesting deeper than
// kMaxJsonDepth, unknown keys, wrong JSON types, data that is not what the datatype holds, and
// binary sizes that do not add up to the body. The model's own checks come later
// (oip::ParseModelInferRequest).
absl::Status ParseInferRequest(std::string_view model_name, std::string_view version,
                               std::string_view body, std::optional<size_t> json_length,
                               inference::ModelInferRequest* request, BinaryOutputs* binary);

// The answer to an infer whose response is `response` (from oip::FillModelInferResponse, typed
// or raw), with the outputs `binary` names as binary data. Numbers are written in their shortest
// form that reads back as the same FP32 value.
RestBody WriteInferResponse(const inference::ModelInferResponse& response,
                            const BinaryOutputs& binary);

// GET /v2: {"name", "version", "extensions"}.
std::string ServerMetadataJson(const inference::ServerMetadataResponse& metadata);
// GET /v2/models/{name}: {"name", "versions", "platform", "inputs", "outputs"}.
std::string ModelMetadataJson(const inference::ModelMetadataResponse& metadata);
// {"error": message}: the protocol's error body.
std::string ErrorJson(std::string_view message);

// The HTTP status for an error of `code` (400 for invalid input, 404 for unknown models, 429
// when full, 503 while unavailable, 504 past a deadline, 500 for the server's own faults).
int HttpStatusOf(absl::StatusCode code);

}  // namespace attnserve::server::oip_rest

#endif  // ATTNSERVE_SERVER_CONVERSION_OIP_REST_REST_CONVERSION_H_
