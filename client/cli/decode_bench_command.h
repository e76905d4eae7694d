// `attnserve-cli bench --sessions N --context C --steps S`: a load test of decoding sessions
// (attnserve.v1 Decode) over the client library's DecodeStream.
//
// Opens `sessions` self-attention sessions spread evenly over `clients` streams (each stream is
// one client: its own gRPC call), prefills each with `context` random rows (one message per
// stream carrying its opens and prompts), then runs `steps` rounds: in each round every stream
// sends ONE message with a one-row step for each of its sessions and waits for its answer (closed
// loop per stream; the streams run concurrently). So --clients 1 is one client decoding a batch
// of N sequences, --clients N is N clients of one session each. A stream's next round is sent
// from its answer's callback on a gRPC thread, not by a thread of its own: the bench shares the
// server's cores, and 64 sender threads woken every round cost it half as much CPU again.
//
// With `long_prompt_rows` > 0, a separate stream opens one more session when the first stream
// starts round `long_prompt_at_round` and sends it a prompt of that many rows; the step latencies
// are then reported for the steps before it, the steps whose round trip overlapped it, and those
// after, so the prompt's effect on the other sessions is visible (the server cuts prompts into
// chunks).
//
// Reports the prefill time, decode tokens/s (OK one-row steps per second of the step phase),
// step messages/s, and the step latency (per message round trip: send to answer, ms) p50, p90,
// p99, max and mean; text or one JSON object on `out`. Bounded by `steps` and by `duration_s`
// (if > 0: no round starts after it). Returns OK when every item succeeded, else an error naming
// how many failed (the report is printed either way); InvalidArgument for bad options. Uses only
// `client` (thread-safe).
#ifndef ATTNSERVE_CLIENT_CLI_DECODE_BENCH_COMMAND_H_
#define ATTNSERVE_CLIENT_CLI_DECODE_BENCH_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "attnserve/client/client.h"

namespace attnserve::cli {

struct DecodeBenchOptions {
  std::string model;      // "" = the server's default model.
  int sessions = 64;      // Sessions in all (>= 1).
  int64_t context = 128;  // Prompt rows per session (>= 0; 0 = no prefill).
  // Most prompt bytes one prefill message carries (whole sessions; at least one). 16 MiB: a
  // quarter of the server's default --max-message-bytes, so 64 sessions of 2048-row prompts
  // (268 MB at d_model 512) go as 16 messages instead of one the server would refuse.
  int64_t prefill_message_bytes = int64_t{16} << 20;
  int64_t steps = 100;               // Rounds of one-row steps (>= 1).
  int clients = 1;                   // Streams the sessions are spread over (1..sessions).
  int64_t long_prompt_rows = 0;      // 0 = none.
  int64_t long_prompt_at_round = 0;  // The first stream's round that starts it (< steps).
  double duration_s = 0;             // > 0: no round starts after this many seconds.
  uint64_t seed = 1;                 // The random rows.
  client::WireDtype wire_dtype = client::WireDtype::kFloat32;  // Raw encoding, both ways.
  bool json = false;
};

absl::Status DecodeBenchCommand(client::Client& client, const DecodeBenchOptions& options,
                                std::ostream& out);

}  // namespace attnserve::cli

#endif  // ATTNSERVE_CLIENT_CLI_DECODE_BENCH_COMMAND_H_
