#include "server/service/drain_gate.h"

#include <utility>

namespace attnserve::server {

absl::Status DrainingError() {
  return absl::UnavailableError(
      "the server is draining before it shuts down and accepts no new requests; send the request "
      "again (another replica takes it)");
}

bool DrainGate::HoldIfDraining(Refusal& refusal) {
  if (!draining()) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!released_) {
      held_.push_back(std::move(refusal));
      open_calls_->MarkHeld();
      return true;
    }
  }
  refusal(DrainingError());
  return true;
}

void DrainGate::Release() {
  std::vector<Refusal> held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    held.swap(held_);
  }
  const absl::Status status = DrainingError();
  for (Refusal& refusal : held) {
    open_calls_->UnmarkHeld();
    refusal(status);
  }
}

}  // namespace attnserve::server
