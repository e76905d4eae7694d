// IterationScheduler<Item>: iteration-level scheduling (Orca, OSDI '22; vLLM's continuous
// batching) of work items that belong to keys, knowing nothing of what an item computes.
//
// Each key (e.g. one decoding session) has a FIFO of items; an item has tokens() >= 1 tokens.
// NextIteration() forms one iteration from the head item of every key:
//   1. decode steps first: every key whose head item has exactly one token left contributes
//      that token (round robin from after the key served first last time, should they not all
//      fit under max_iteration_tokens);
//   2. then prefill: keys whose head item has more than one token left get one chunk each, of
//      at most prefill_chunk_tokens (and what is left of the budget), round robin over the
//      prefilling keys starting after the last key that got a chunk, until the budget is spent —
//      except in an iteration that has decode steps right after one that had prefill chunks:
//      that one is decode only.
// So a key contributes at most one slice per iteration, a key's items run in order (an item is
// finished before the next one of its key starts), and no prefilling key waits for more than one
// round of the others. The decode-only rule bounds what prompts add to a step's latency by one
// chunk's compute: a step that arrives while chunks compute waits for them, then its own
// iteration carries none (without the rule it would carry the next chunks too, two in all).
// Prompts lose little: a decode-only iteration is short, and with no step waiting chunks run in
// every iteration.
//
// Item requirements: `int64_t tokens() const;` >= 1, constant while queued.
//
// Thread-safety: NOT thread-safe; the owner serialises every call (e.g. under its own mutex).
// Ownership: the scheduler owns queued items. A slice handed out for an item's last tokens
// carries the item (`finished`); earlier chunks only point to it (it stays queued until its last
// chunk is handed out, or Remove/RemoveKey takes it back).
#ifndef ATTNSERVE_SERVER_BATCHING_ITERATION_SCHEDULER_H_
#define ATTNSERVE_SERVER_BATCHING_ITERATION_SCHEDULER_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnserve::batching {

struct IterationSchedulerOptions {
  // The most tokens (rows) in one iteration, decode steps and prefill chunks together. >= 1.
  // Bounds an iteration's compute, so the time between two decode steps of a session.
  int64_t max_iteration_tokens = 512;
  // The most prefill tokens one key contributes to one iteration. 1 <= it <= max_iteration_tokens.
  // A long prompt is cut into chunks of this size, one per iteration, so the decode steps of the
  // other sessions are delayed by a chunk's compute per iteration. The defaults (256 / 512) were
  // measured against 64, 128 and 512 (docs/PERFORMANCE.md, BM_PromptDuringDecode).
  int64_t prefill_chunk_tokens = 256;
};

// OK, or InvalidArgument naming the first bad field, what it expects and what it got.
inline absl::Status ValidateIterationSchedulerOptions(const IterationSchedulerOptions& options) {
  if (options.max_iteration_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_iteration_tokens: expected >= 1, got ", options.max_iteration_tokens));
  }
  if (options.prefill_chunk_tokens < 1 ||
      options.prefill_chunk_tokens > options.max_iteration_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill_chunk_tokens: expected 1..max_iteration_tokens (",
                     options.max_iteration_tokens, "), got ", options.prefill_chunk_tokens));
  }
  return absl::OkStatus();
}

template <typename Item>
class IterationScheduler {
 public:
  // One key's share of an iteration: tokens [begin, begin + count) of `item`.
  struct Slice {
    uint64_t key = 0;
    Item* item = nullptr;
    int64_t begin = 0;
    int64_t count = 0;
    // Set (and == item) when this slice ends the item: the scheduler no longer holds it.
    std::unique_ptr<Item> finished;
    bool decode() const { return begin == 0 && count == 1 && finished != nullptr; }
  };

  // `options` must be valid (ValidateIterationSchedulerOptions).
  explicit IterationScheduler(const IterationSchedulerOptions& options) : options_(options) {}
  IterationScheduler(const IterationScheduler&) = delete;
  IterationScheduler& operator=(const IterationScheduler&) = delete;

  const IterationSchedulerOptions& options() const { return options_; }

  // Queues `item` (non-null, tokens() >= 1) behind the other items of `key`. Cannot fail.
  void Add(uint64_t key, std::unique_ptr<Item> item) {
    keys_[key].items.push_back(Queued{std::move(item), 0});
    ++items_;
  }

  // Items queued (an item partly handed out counts until its last chunk is).
  int64_t size() const { return items_; }
  bool empty() const { return items_ == 0; }
  // Items queued for `key`.
  int64_t KeySize(uint64_t key) const {
    auto it = keys_.find(key);
    return it == keys_.end() ? 0 : static_cast<int64_t>(it->second.items.size());
  }

  // Forms the next iteration (see the file comment); empty when nothing is queued. Decode slices
  // come first, then prefill chunks.
  std::vector<Slice> NextIteration() {
    std::vector<Slice> slices;
    ++iteration_;
    int64_t budget = options_.max_iteration_tokens;
    // Decode steps, round robin from after decode_next_.
    ForEachFrom(decode_next_, [&](uint64_t key, KeyQueue& queue) {
      if (budget == 0) return false;
      if (Remaining(queue.items.front()) == 1) {
        slices.push_back(Take(key, queue, 1));
        budget -= 1;
        decode_next_ = key;
      }
      return true;
    });
    // Prefill chunks, round robin from after prefill_next_, for keys not served above; none
    // right after an iteration with chunks when steps are waiting (the file comment says why).
    const bool decode_only = last_had_prefill_ && !slices.empty();
    last_had_prefill_ = false;
    ForEachFrom(prefill_next_, [&](uint64_t key, KeyQueue& queue) {
      if (budget == 0 || decode_only) return false;
      if (queue.served_in == iteration_ || queue.items.empty()) return true;
      const int64_t remaining = Remaining(queue.items.front());
      if (remaining > 1) {
        const int64_t count = std::min({remaining, options_.prefill_chunk_tokens, budget});
        slices.push_back(Take(key, queue, count));
        budget -= count;
        prefill_next_ = key;
        last_had_prefill_ = true;
      }
      return true;
    });
    // Drop keys whose last item was handed out.
    for (const Slice& slice : slices) {
      auto it = keys_.find(slice.key);
      if (it != keys_.end() && it->second.items.empty()) keys_.erase(it);
    }
    return slices;
  }

  // Takes back the head item of `key` (e.g. one whose chunk failed), or null if none is queued.
  std::unique_ptr<Item> Remove(uint64_t key) {
    auto it = keys_.find(key);
    if (it == keys_.end()) return nullptr;
    std::unique_ptr<Item> item = std::move(it->second.items.front().item);
    it->second.items.pop_front();
    --items_;
    if (it->second.items.empty()) keys_.erase(it);
    return item;
  }

  // Takes back every item of `key`, in order (the head one may be partly handed out).
  std::vector<std::unique_ptr<Item>> RemoveKey(uint64_t key) {
    std::vector<std::unique_ptr<Item>> items;
    auto it = keys_.find(key);
    if (it == keys_.end()) return items;
    for (Queued& queued : it->second.items) items.push_back(std::move(queued.item));
    items_ -= static_cast<int64_t>(items.size());
    keys_.erase(it);
    return items;
  }

 private:
  struct Queued {
    std::unique_ptr<Item> item;
    int64_t handed_out = 0;  // Tokens already in slices.
  };
  struct KeyQueue {
    std::deque<Queued> items;
    uint64_t served_in = 0;  // The last iteration that took a slice of this key.
  };

  static int64_t Remaining(const Queued& queued) {
    return queued.item->tokens() - queued.handed_out;
  }

  // Calls fn(key, queue) for every key, in key order starting after `after`, wrapping around,
  // until fn returns false.
  template <typename Fn>
  void ForEachFrom(uint64_t after, Fn fn) {
    auto start = keys_.upper_bound(after);
    for (auto it = start; it != keys_.end(); ++it) {
      if (!fn(it->first, it->second)) return;
    }
    for (auto it = keys_.begin(); it != start; ++it) {
      if (!fn(it->first, it->second)) return;
    }
  }

  Slice Take(uint64_t key, KeyQueue& queue, int64_t count) {
    queue.served_in = iteration_;
    Queued& head = queue.items.front();
    Slice slice;
    slice.key = key;
    slice.item = head.item.get();
    slice.begin = head.handed_out;
    slice.count = count;
    head.handed_out += count;
    if (head.handed_out == head.item->tokens()) {
      slice.finished = std::move(head.item);
      queue.items.pop_front();
      --items_;
    }
    return slice;
  }

  const IterationSchedulerOptions options_;
  std::map<uint64_t, KeyQueue> keys_;  // Only keys with queued items (between calls).
  int64_t items_ = 0;
  uint64_t iteration_ = 0;                // NextIteration calls so far.
  uint64_t decode_next_ = ~uint64_t{0};   // The last key given a decode slice.
  uint64_t prefill_next_ = ~uint64_t{0};  // The last key given a prefill chunk.
  bool last_had_prefill_ = false;         // The last iteration handed out a prefill chunk.
};

}  // namespace attnserve::batching

#endif  // ATTNSERVE_SERVER_BATCHING_ITERATION_SCHEDULER_H_
