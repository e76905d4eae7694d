// Closed-loop load over gRPC's callback client API: `concurrency` requests stay in flight, each
// answer immediately sends the next one, until a LoadBudget refuses. gRPC's own callback threads
// drive everything; the calling thread only waits.
//
//   - Unary (RunUnaryLoad): `concurrency` slots, each a chain of Attend calls; slot i uses
//     channel i % channels.
//   - Stream (RunStreamLoad): `streams` AttendStream calls (stream i on channel i % channels),
//     the concurrency split evenly between them: each stream keeps its share of messages
//     outstanding (sent, not yet answered) and sends one more per answer. Messages go out one
//     write at a time per stream (gRPC allows one outstanding write); answers are matched to
//     their send time by request_id, since the server may answer out of order. A stream
//     half-closes once its budget is spent and every answer is in.
//
// Latency is measured from the moment a request is handed to gRPC (unary) or queued for writing
// on its stream, to the moment its answer is delivered; only OK answers count towards it.
#ifndef ATTNSERVE_TESTS_BENCHMARKS_LOAD_CLIENT_H_
#define ATTNSERVE_TESTS_BENCHMARKS_LOAD_CLIENT_H_

#include <chrono>
#include <memory>
#include <vector>

#include "attnserve/v1/attention.grpc.pb.h"
#include "client/cli/load_stats.h"

namespace attnserve::load {

using Stub = v1::AttentionService::Stub;

// Runs until `budget` refuses and every request it granted has been answered (or failed).
// `request` must outlive the call; `timeout` bounds each unary call.
void RunUnaryLoad(const std::vector<std::unique_ptr<Stub>>& stubs, const v1::AttendRequest& request,
                  int concurrency, std::chrono::milliseconds timeout, LoadBudget* budget,
                  LoadRecorder* recorder);

// Same, over `streams` AttendStream calls; `timeout` bounds each whole stream.
void RunStreamLoad(const std::vector<std::unique_ptr<Stub>>& stubs,
                   const v1::AttendRequest& request, int concurrency, int streams,
                   std::chrono::milliseconds timeout, LoadBudget* budget, LoadRecorder* recorder);

}  // namespace attnserve::load

#endif  // ATTNSERVE_TESTS_BENCHMARKS_LOAD_CLIENT_H_
