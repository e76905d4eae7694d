// DecodeComputeTeams: the decoding runtime's ComputeTeams (decode_types.h) over the server's
// ComputeBudget (compute_budget.h), so the decoding loop's forward passes and the Attend batches
// share one set of compute threads. The adapter lives here because server/decoding may not see
// server/runtime (tests/layering).
//
// Thread-safe (the budget is). Does not own the budget, which must outlive it.
#ifndef ATTNSERVE_SERVER_APP_DECODE_COMPUTE_TEAMS_H_
#define ATTNSERVE_SERVER_APP_DECODE_COMPUTE_TEAMS_H_

#include "server/decoding/decode_types.h"
#include "server/runtime/compute_budget.h"

namespace attnserve::server {

class DecodeComputeTeams final : public decoding::ComputeTeams {
 public:
  explicit DecodeComputeTeams(ComputeBudget* budget) : budget_(budget) {}
  int Acquire(int wanted) override { return budget_->Acquire(wanted); }
  void Release(int granted) override { budget_->Release(granted); }

 private:
  ComputeBudget* const budget_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_APP_DECODE_COMPUTE_TEAMS_H_
