// `attnserve-cli attend`: one Attend call with an input from a .npy file or random values, the
// output (and optionally the per-head weights) written to .npy files or summarised on `out`.
//
// Stateless apart from `client` (thread-safe). Returns OK or the error to print (exit status 1):
// InvalidArgument for bad options or input files, the server's error for a failed call.
#ifndef ATTNSERVE_CLIENT_CLI_ATTEND_COMMAND_H_
#define ATTNSERVE_CLIENT_CLI_ATTEND_COMMAND_H_

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "attnserve/client/client.h"

namespace attnserve::cli {

struct AttendCommandOptions {
  std::string model;          // "" = the server's default model.
  std::string input_path;     // A .npy [T, D] or [B, T, D]; or else:
  int64_t random_length = 0;  // T random rows of the model's width (RandomValues(T·D, seed)).
  uint64_t seed = 1;
  bool causal = false;
  bool weights = false;  // Ask for the per-head attention weights.
  client::WireDtype wire_dtype = client::WireDtype::kFloat32;  // Raw encoding, both ways.
  std::string output_path;                // Write the output here (.npy); empty = print a summary.
  std::string weights_path;               // Write the weights here (.npy); implies `weights`.
  std::chrono::milliseconds deadline{0};  // 0 = the client's default.
};

absl::Status AttendCommand(client::Client& client, const AttendCommandOptions& options,
                           std::ostream& out);

}  // namespace attnserve::cli

#endif  // ATTNSERVE_CLIENT_CLI_ATTEND_COMMAND_H_
