// `attnserve-cli decode`: one decoding session (attnserve.v1 Decode, through the library's
// DecodeSession): a prompt from a .npy file or random rows, optionally cross-attention memory
// (.npy or random), then `steps` one-row steps of random rows; prints the outputs (or writes them
// to a .npy) and the timings: prefill time and the step latency p50/p99.
//
// Random values are RandomValues(rows · d_model, seed) for the prompt, seed + 1 for the memory and
// seed + 2 for the steps' rows (step i is row i), so a run can be recomputed.
//
// Stateless apart from `client` (thread-safe). Returns OK or the error to print (exit status 1):
// InvalidArgument for bad options or input files, the server's error for a failed open or step.
#ifndef ATTNSERVE_CLIENT_CLI_DECODE_COMMAND_H_
#define ATTNSERVE_CLIENT_CLI_DECODE_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "attnserve/client/client.h"

namespace attnserve::cli {

struct DecodeCommandOptions {
  std::string model;        // "" = the server's default model.
  std::string prompt_path;  // A .npy [T, D]; or else:
  int64_t prompt_rows = 0;  // T random rows of the model's width.
  std::string memory_path;  // Optional cross-attention memory, a .npy [S, D]; or else:
  int64_t memory_rows = 0;  // S random rows (0 = self-attention).
  int64_t steps = 16;       // One-row steps after the prompt (>= 0).
  uint64_t seed = 1;
  client::WireDtype wire_dtype = client::WireDtype::kFloat32;  // Raw encoding, both ways.
  // Write the outputs of the prompt then of every step, [T + steps, D], to this .npy; empty =
  // print a summary of each.
  std::string output_path;
};

absl::Status DecodeCommand(client::Client& client, const DecodeCommandOptions& options,
                           std::ostream& out);

}  // namespace attnserve::cli

#endif  // ATTNSERVE_CLIENT_CLI_DECODE_COMMAND_H_
