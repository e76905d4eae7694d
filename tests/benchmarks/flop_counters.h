// The GFLOP/s counters every attnserve_core_bench row that does arithmetic reports, so that the
// forward passes and the machine's matmul ceiling read the same way.
#ifndef ATTNSERVE_TESTS_BENCHMARKS_FLOP_COUNTERS_H_
#define ATTNSERVE_TESTS_BENCHMARKS_FLOP_COUNTERS_H_

#include <benchmark/benchmark.h>

namespace attnserve {

// `flops` per iteration. "FLOPS" prints with SI prefixes (e.g. 41.2G/s); "GFLOPs" is the same rate
// as a plain number of GFLOP/s for JSON/CSV consumers.
inline void SetFlopCounters(benchmark::State& state, double flops) {
  state.counters["FLOPS"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOPs"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace attnserve

#endif  // ATTNSERVE_TESTS_BENCHMARKS_FLOP_COUNTERS_H_
