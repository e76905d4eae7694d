// `attnserve-cli ghz-data`: the JSON call data ghz sends to attnserve.v1.AttentionService/Attend
// (or AttendStream), or the messages of one Decode stream, built as real v1::AttendRequest (or
// v1::DecodeRequest) messages and printed with protobuf's own
// JSON printer, so the text is exactly proto3's JSON mapping (int64 shape dimensions as strings,
// `raw` as base64, lowerCamelCase names) and ghz can parse it through server reflection.
//
// Stateless, thread-safe. InvalidArgument for bad options.
#ifndef ATTNSERVE_CLIENT_CLI_GHZ_DATA_H_
#define ATTNSERVE_CLIENT_CLI_GHZ_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace attnserve::cli {

struct GhzDataOptions {
  std::string model;
  std::vector<int64_t> shape;  // [T, D] (or [B, T, D]).
  int count = 1;               // 1: one JSON object; more: an array of `count` objects.
  uint64_t seed = 1;           // Object i holds RandomValues(product(shape), seed + i).
  bool raw = false;            // The input as base64 little-endian float32 bytes.
  bool raw_output = false;     // Ask the server for raw output (smaller answers).
  bool pretty = false;         // Indented output.
  // Decode mode (> 0): the array of DecodeRequests ghz sends on each Decode stream, `count`
  // ignored: message 0 opens sessions "s0".."s<K-1>" and prefills each with `shape` [C, D] rows
  // (seed + k), then `decode_steps` messages of one one-row step per session (seed + 1000 + i),
  // then one message closing them all. Session names are per stream, so every call may reuse them.
  int decode_sessions = 0;
  int decode_steps = 16;
};

// The whole payload, ending in a newline.
absl::StatusOr<std::string> MakeGhzData(const GhzDataOptions& options);

// "16,512" or "4x16x512" into dimensions (each >= 1); InvalidArgument naming `text` otherwise.
absl::StatusOr<std::vector<int64_t>> ParseShapeList(const std::string& text);

}  // namespace attnserve::cli

#endif  // ATTNSERVE_CLIENT_CLI_GHZ_DATA_H_
