// A client::InferClient over the Open Inference Protocol's HTTP/REST binding, for
// `attnserve-cli bench --protocol rest|rest-json`: the same load as ModelInfer over gRPC, sent as
// POST /v2/models/{model}/infer to an attnserve's --http-address.
//
// kBinary sends the input with the binary tensor data extension (raw FP32 after the JSON header)
// and asks for the output the same way; kJson sends and receives JSON numbers (shortest FP32
// round-trip text). Each call runs on a worker thread with its own kept-alive connection;
// workers are added while every one is busy (up to kMaxRestConnections), so N outstanding calls
// use N connections. Plain HTTP only.
//
// Thread-safe. Callbacks run on a worker thread; the destructor waits for calls in flight.
#ifndef ATTNSERVE_CLIENT_CLI_REST_INFER_CLIENT_H_
#define ATTNSERVE_CLIENT_CLI_REST_INFER_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "attnserve/client/infer_client.h"

namespace attnserve::cli {

enum class RestBody { kBinary, kJson };

inline constexpr int kMaxRestConnections = 1024;

// `target` is host:port of the REST port. InvalidArgument naming --rest-target when it is not
// host:port.
absl::StatusOr<std::unique_ptr<client::InferClient>> MakeRestInferClient(const std::string& target,
                                                                         RestBody body);

}  // namespace attnserve::cli

#endif  // ATTNSERVE_CLIENT_CLI_REST_INFER_CLIENT_H_
