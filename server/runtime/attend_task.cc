#include "server/runtime/attend_task.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

namespace attnserve::server {

std::string BatchKeyOf(const AttendWork& work) {
  // The model pointer identifies the version: a reload makes a new Model object.
  std::string key =
      absl::StrCat(reinterpret_cast<uintptr_t>(work.model.get()), "|",
                   work.cross_attention ? "x" : "s", work.causal ? "c" : "-",
                   work.explicit_mask.empty() ? "-" : "m", work.return_weights ? "w" : "-", "|");
  // An all-true head mask computes the same as none, so they may share a batch.
  bool any_off = false;
  for (bool head_on : work.head_mask) any_off |= !head_on;
  if (any_off) {
    for (bool head_on : work.head_mask) key.push_back(head_on ? '1' : '0');
  }
  return key;
}

AttendTask::AttendTask(AttendWork work, int64_t deadline_us, CancelledCheck cancelled,
                       DoneCallback done)
    : work_(std::move(work)),
      deadline_us_(deadline_us),
      cancelled_(std::move(cancelled)),
      done_(std::move(done)),
      batch_key_(BatchKeyOf(work_)) {}

AttendTask::~AttendTask() {
  if (done_) Finish(absl::InternalError("the request was discarded without an answer"));
}

absl::Status AttendTask::CheckAdmissible(int64_t now_us) const {
  if (now_us >= deadline_us_) {
    return absl::DeadlineExceededError(
        "the deadline passed while the request was queued; it was not computed");
  }
  if (cancelled_ && cancelled_()) {
    return absl::CancelledError("the caller cancelled the request; it was not computed");
  }
  return absl::OkStatus();
}

void AttendTask::Finish(absl::StatusOr<AttendResult> result) {
  if (!done_) return;
  DoneCallback done = std::move(done_);
  done_ = nullptr;
  done(work_, std::move(result));
}

}  // namespace attnserve::server
