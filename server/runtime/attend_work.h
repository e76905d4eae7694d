// AttendWork / AttendResult: one validated Attend request and its answer, in core types.
//
// conversion.h turns an AttendRequest into an AttendWork (validating every field) and an
// AttendResult back into an AttendResponse; the batch runner works only on these types, so the
// protobuf never reaches compute. Plain value types; not thread-safe to mutate concurrently.
#ifndef ATTNSERVE_SERVER_RUNTIME_ATTEND_WORK_H_
#define ATTNSERVE_SERVER_RUNTIME_ATTEND_WORK_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "core/model/model.h"
#include "core/util/float_format.h"

namespace attnserve::server {

// A validated request: B ≥ 1 sequences with their padding already removed.
struct AttendWork {
  // The model version that validated the request; it computes it even if a reload happens in
  // between.
  std::shared_ptr<const model::Model> model;

  // Query rows of every sequence, packed without padding: Σ T_i rows × d_model, finite.
  std::vector<float> query;
  // T_i ≥ 1 per sequence (B entries).
  std::vector<int64_t> query_lengths;

  // Cross-attention only (empty otherwise): Σ S_i rows × d_model packed, and S_i ≥ 1 per
  // sequence (B entries).
  bool cross_attention = false;
  std::vector<float> memory;
  std::vector<int64_t> memory_lengths;

  bool causal = false;
  // Empty, or one row-major [T_i, S_i] block per sequence (padding removed), concatenated in
  // sequence order; 0 = blocked, 1 = visible.
  std::vector<uint8_t> explicit_mask;
  // Empty (every head on), or num_heads flags.
  absl::InlinedVector<bool, 16> head_mask;
  bool return_weights = false;

  // How to shape the answer: the request's rank (2 → [T, d], 3 → [B, T, d]) and its padded
  // sizes. Rows past a sequence's length come back as zeros.
  bool batched = false;
  int64_t padded_query_length = 0;   // T of the input tensor
  int64_t padded_memory_length = 0;  // S of the memory tensor (or T for self-attention)
  bool raw_output = false;
  // With raw_output: the encoding of the answer's raw bytes (output and weights).
  FloatFormat raw_output_format = FloatFormat::kFloat32;
  std::string request_id;
  // The server's own warm-up pass (model_router.cc), not a client's request: kept out of metrics.
  bool warm_up = false;

  int64_t sequences() const { return static_cast<int64_t>(query_lengths.size()); }
  // Memory the request's inputs hold while it waits: query, memory and explicit mask.
  int64_t bytes() const {
    return static_cast<int64_t>((query.size() + memory.size()) * sizeof(float) +
                                explicit_mask.size());
  }
  int64_t tokens() const {
    return static_cast<int64_t>(query.size()) / model->config.attention.d_model;
  }
  // The float payload of the answer, padded as the request was (output, plus weights when
  // return_weights): what the answer will hold, known before it is computed. Validation has
  // bounded it by max_response_bytes, so it does not overflow.
  int64_t response_bytes() const {
    const int64_t batch = sequences();
    const int64_t output = batch * padded_query_length * model->config.attention.d_model;
    const int64_t weights = return_weights ? batch * model->config.attention.num_heads *
                                                 padded_query_length * padded_memory_length
                                           : 0;
    return (output + weights) * static_cast<int64_t>(sizeof(float));
  }
};

// Where the time of one request went, as reported back in AttendResponse.timing.
struct AttendTiming {
  int64_t queue_us = 0;    // enqueue to batch start
  int64_t compute_us = 0;  // the whole batch's forward pass
  int64_t batch_sequences = 0;
  int64_t batch_tokens = 0;
};

// The answer to one AttendWork, still packed without padding. The spans view the whole batch's
// buffers, which `storage` keeps alive: a batch's output is handed to its requests without a copy
// per request, and copied once, into each response.
struct AttendResult {
  // Σ T_i rows × d_model.
  std::span<const float> output = {};
  // Empty unless return_weights: per sequence [num_heads, T_i, S_i], concatenated.
  std::span<const float> weights = {};
  std::shared_ptr<const void> storage = nullptr;
  AttendTiming timing = {};
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RUNTIME_ATTEND_WORK_H_
