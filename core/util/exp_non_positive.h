// ExpNonPositive: e^x for the x <= 0 of a softmax (scores minus their maximum), written so that
// loops over it vectorise; ExpShiftedSum, a softmax row's exponentials and their sum. Shared by the
// full forward's softmax (masked_softmax.cc) and the decode kernel's (kv_cache/paged_attention.cc),
// so both give a row the same probabilities. Pure function; thread-safe.
#ifndef ATTNSERVE_CORE_UTIL_EXP_NON_POSITIVE_H_
#define ATTNSERVE_CORE_UTIL_EXP_NON_POSITIVE_H_

#include <algorithm>
#include <bit>
#include <cstdint>

namespace attnserve::core {

// e^x for x <= 0 (and -∞), to ~2 ulp: Cephes' expf — x = n·ln2 + r, |r| <= ln2/2, a degree-6
// polynomial for e^r, and 2^n built in the exponent bits. Written without calls or branches so
// that the loops using it vectorise (glibc's vector expf needs -ffast-math). Below -87.3 the
// result would be subnormal and is returned as 0, so blocked keys (-∞) give exactly 0; NaN gives
// NaN. Always inlined: it must be compiled into every ISA clone of its callers.
[[gnu::always_inline]] inline float ExpNonPositive(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kRoundMagic = 12582912.0f;  // 1.5·2²³: adding it rounds to an integer.
  const float clamped = std::max(x, -87.0f);
  const float shifted = clamped * kLog2e + kRoundMagic;
  const float n = shifted - kRoundMagic;
  const int32_t exponent = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRoundMagic);
  const float r = (clamped - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((exponent + 127) << 23);
  return x < -87.0f ? 0.0f : p * scale;
}

// Replaces x[0, n) by ExpNonPositive(x[i] - max) and returns their sum. The sum is kept in 16
// independent lanes, one AVX-512 vector, so that the loop vectorises without -ffast-math (an
// `omp simd reduction` kept its partial sums in memory and ran 1.7x slower); the order of
// additions is fixed, so a row gets the same probabilities from every softmax that uses this (the
// full forward's and the decode kernels'). Always inlined, as ExpNonPositive.
[[gnu::always_inline]] inline float ExpShiftedSum(float* x, int64_t n, float max) {
  constexpr int64_t kLanes = 16;
  const int64_t full = n - n % kLanes;
  float lane_sum[kLanes] = {};
  for (int64_t j = 0; j < full; j += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      const float e = ExpNonPositive(x[j + l] - max);
      x[j + l] = e;
      lane_sum[l] += e;
    }
  }
  for (int64_t j = full; j < n; ++j) {
    const float e = ExpNonPositive(x[j] - max);
    x[j] = e;
    lane_sum[0] += e;
  }
  float sum = 0.0f;
  for (float partial : lane_sum) sum += partial;
  return sum;
}

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_UTIL_EXP_NON_POSITIVE_H_
