// Session and StepItem: the decoding runtime's internal state of one session and of one accepted
// step. Internal to server/decoding.
//
// Thread-safety: the fields marked "mu" are guarded by the runtime's mutex; those marked "loop"
// are touched only by the runtime's loop thread (the KV cache is never used concurrently); the
// rest are set at Open and never change.
#ifndef ATTNSERVE_SERVER_DECODING_SESSION_H_
#define ATTNSERVE_SERVER_DECODING_SESSION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/kv_cache/kv_block_pool.h"
#include "core/model/model.h"
#include "server/decoding/decode_types.h"

namespace attnserve::decoding {

struct Session {
  SessionId id = 0;
  OwnerKey owner = 0;
  std::shared_ptr<const model::Model> model;
  bool cross = false;
  int64_t d_model = 0;

  // mu: whether the memory is loaded; the last time a step was accepted or answered; rows queued.
  bool ready = false;
  int64_t last_active_us = 0;
  int64_t queued_rows = 0;
  // mu: the number of the last iteration that answered one of its steps (-1: none).
  int64_t answered_iteration = -1;

  // loop: the pool of its version (null until attached) and its cache; the memory until loaded.
  core::KvBlockPool* pool = nullptr;
  core::KvSequence cache;
  std::vector<float> memory;
  ReadyCallback on_ready;
  std::function<void(CloseReason reason)> on_closed;  // SessionSpec::on_closed.
};

// One accepted step: the scheduler's item (tokens() = its rows).
struct StepItem {
  std::shared_ptr<Session> session;
  std::vector<float> rows;
  int64_t num_rows = 0;
  std::vector<float> output;  // Filled chunk by chunk.
  int64_t start_length = 0;   // The cache length before its first chunk (rollback on failure).
  int64_t accepted_us = 0;
  StepCallback done;  // Null once answered.

  int64_t tokens() const { return num_rows; }
};

using StepScheduler = batching::IterationScheduler<StepItem>;

}  // namespace attnserve::decoding

#endif  // ATTNSERVE_SERVER_DECODING_SESSION_H_
