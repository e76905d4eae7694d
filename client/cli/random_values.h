// Deterministic pseudo-random inputs for attnserve-cli (attend --random, bench, ghz-data): the
// same seed gives the same values on every machine and build, so runs and ghz payloads can be
// reproduced and tests can recompute what the CLI sent.
//
// Pure functions, thread-safe.
#ifndef ATTNSERVE_CLIENT_CLI_RANDOM_VALUES_H_
#define ATTNSERVE_CLIENT_CLI_RANDOM_VALUES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace attnserve::cli {

// SplitMix64: advances `state` and returns the next 64 random bits. Chosen over <random>'s
// distributions because their output is implementation-defined.
uint64_t SplitMix64(uint64_t& state);

// `count` values uniform in [-1, 1) from `seed`.
std::vector<float> RandomValues(size_t count, uint64_t seed);

}  // namespace attnserve::cli

#endif  // ATTNSERVE_CLIENT_CLI_RANDOM_VALUES_H_
