// `attnserve-cli bench`: a load generator over the client library.
//
// Closed loop (rate 0): `concurrency` requests are outstanding at all times; each answer lets the
// next request go. Open loop (rate > 0): requests are sent at their scheduled times (Poisson
// arrivals by default, or a fixed interval) whatever the answers, and a request's latency counts
// from its scheduled time, so a client or server falling behind shows in the latency instead of
// silently lowering the load (no coordinated omission).
//
// `protocol` picks the RPC of unary mode: attnserve.v1 Attend (Client::AttendAsync, the default)
// or the Open Inference Protocol's ModelInfer (InferClient::InferAsync, raw FP32 input) over gRPC
// or over its REST binding (binary or JSON bodies), the same load either way. ModelInfer answers
// carry no batch_tokens, so that figure is reported absent. The model is described by attnserve.v1
// GetModel in both cases (the server serves both protocols on one port; REST on another). Stream
// mode exists only in attnserve.v1: --stream with another protocol is refused.
//
// Unary mode sends with Client::AttendAsync (or InferAsync). Stream mode sends over `streams`
// AttendSessions: closed loop splits `concurrency` between them as their max_in_flight; open loop
// gives each `concurrency` as max_in_flight (a send blocks while that many are unanswered).
//
// With `warmup_requests` > 0, that many requests go first with the same load (same mode, streams,
// rate and concurrency, over sessions of their own) and are left out of the report; the measured
// phase then starts afresh (its lengths are those of a run without warm-up).
//
// Progress goes to `err` about once a second (one line rewritten with \r) unless `progress` is
// false; the report (text or one JSON object) to `out`. Returns OK when every request succeeded,
// otherwise an error naming how many failed (the report is printed either way); InvalidArgument
// for bad options. Uses `client` (and `infer` with the other protocols) only (thread-safe).
#ifndef ATTNSERVE_CLIENT_CLI_BENCH_COMMAND_H_
#define ATTNSERVE_CLIENT_CLI_BENCH_COMMAND_H_

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "attnserve/client/client.h"
#include "attnserve/client/infer_client.h"
#include "client/cli/load_pattern.h"

namespace attnserve::cli {

// The wire protocol of bench's unary requests.
enum class Protocol {
  kV1,        // attnserve.v1.AttentionService/Attend
  kOip,       // inference.GRPCInferenceService/ModelInfer
  kRest,      // POST /v2/models/{model}/infer, binary tensor data (rest_infer_client.h)
  kRestJson,  // the same with JSON bodies
};
// "v1", "oip", "rest" or "rest-json", as --protocol spells them.
const char* ProtocolName(Protocol protocol);
// Whether `protocol` sends through an InferClient (every protocol but attnserve.v1).
inline bool UsesInferClient(Protocol protocol) { return protocol != Protocol::kV1; }

struct BenchOptions {
  Protocol protocol = Protocol::kV1;
  std::string model;    // "" = the server's default model.
  int concurrency = 8;  // Outstanding requests (closed loop).
  double rate = 0;      // Requests/s; > 0 switches to open loop.
  Arrival arrival = Arrival::kPoisson;
  int64_t requests = 0;         // Stop after this many (0 = no count limit) ...
  double duration_s = 0;        // ... or after this long (0 = no time limit).
  int64_t warmup_requests = 0;  // Sent first, not counted.
  std::string seq_len = "16";   // SeqLenRange::Parse.
  uint64_t seed = 1;            // Input values and lengths.
  bool causal = false;
  // The raw encoding of each request's input and of its answer (AttendOptions::wire_dtype).
  client::WireDtype wire_dtype = client::WireDtype::kFloat32;
  bool stream = false;
  int streams = 1;
  bool json = false;
  bool progress = true;
  std::chrono::milliseconds deadline{0};  // Per request; 0 = the client's default.
};

// With neither `requests` nor `duration_s`, runs kDefaultBenchRequests requests.
inline constexpr int64_t kDefaultBenchRequests = 1000;

// `infer`: the ModelInfer client, needed unless Protocol::kV1 (else unused, may be null);
// InvalidArgument naming --protocol when it is missing, or with --stream.
absl::Status BenchCommand(client::Client& client, client::InferClient* infer,
                          const BenchOptions& options, std::ostream& out, std::ostream& err);

}  // namespace attnserve::cli

#endif  // ATTNSERVE_CLIENT_CLI_BENCH_COMMAND_H_
