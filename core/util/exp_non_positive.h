// ExpNonPositive: e^x for the x <= 0 of a softmax (scores minus their maximum), written so that
// loops over it vectorise; ExpShiftedSum, a softmax row's exponentials and their sum. Shared by the
// full forward's softmax (masked_softmax.cc) and the decode kernel's (kv_cache/paged_attention.cc),
// so both give a row the same probabilities. Pure function; thread-safe.
#ifndef ATTNSERVE_CORE_UTIL_EXP_NON_POSITIVE_H_
#define ATTNSERVE_CORE_UTIL_EXP_NON_POSITIVE_H_

#include <bit>
#include <cstdint>
#include <cstring>

namespace attnserve::core {

// kWidth floats (int32) as one value: 16 are one zmm register with AVX-512, 8 one ymm with AVX2.
// A row is processed as 16 lanes, in 16 / kWidth vectors. GCC 12 lowers the comparisons and
// selects of a 16-float vector element by element for AVX2 (and leaves a scalar loop over 16
// lanes scalar there: the AVX2 softmax ran at ~10 ns an element), so AVX2 takes two 8-float
// vectors; both widths add the same lanes in the same order.
// (Typedefs of a class template: GCC drops the attribute of an alias template.)
template <int kWidth>
struct ExpVectors {
  typedef float Lanes __attribute__((vector_size(kWidth * sizeof(float))));
  typedef int32_t Ints __attribute__((vector_size(kWidth * sizeof(int32_t))));
};
template <int kWidth>
using ExpLanes = typename ExpVectors<kWidth>::Lanes;
template <int kWidth>
using ExpLaneInts = typename ExpVectors<kWidth>::Ints;

// e^x for x <= 0 (and -∞), to ~2 ulp, lane by lane: Cephes' expf — x = n·ln2 + r, |r| <= ln2/2,
// a degree-6 polynomial for e^r, and 2^n built in the exponent bits. Below -87.3 the result would
// be subnormal and is returned as 0, so blocked keys (-∞) give exactly 0; NaN gives NaN (glibc's
// vector expf needs -ffast-math). Always inlined: it must be compiled into every ISA clone of its
// callers. Vectors by reference: one returned by value draws GCC's -Wpsabi note in the clones
// without the vector's width.
template <int kWidth>
[[gnu::always_inline]] inline void ExpNonPositive(const ExpLanes<kWidth>& x, ExpLanes<kWidth>& e) {
  using Lanes = ExpLanes<kWidth>;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kRoundMagic = 12582912.0f;  // 1.5·2²³: adding it rounds to an integer.
  const Lanes floor = Lanes{} - 87.0f;
  const Lanes clamped = x < floor ? floor : x;  // std::max(x, -87): NaN stays NaN.
  const Lanes shifted = clamped * kLog2e + kRoundMagic;
  const Lanes n = shifted - kRoundMagic;
  const ExpLaneInts<kWidth> exponent =
      reinterpret_cast<ExpLaneInts<kWidth>>(shifted) - std::bit_cast<int32_t>(kRoundMagic);
  const Lanes r = (clamped - n * 0.693359375f) - n * -2.12194440e-4f;
  Lanes p = Lanes{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const Lanes scale = reinterpret_cast<Lanes>((exponent + 127) << 23);
  e = x < floor ? Lanes{} : p * scale;
}

// ExpShiftedSum below, on vectors of kWidth floats.
template <int kWidth>
[[gnu::always_inline]] inline float ExpShiftedSumOf(float* x, int64_t n, float max) {
  using Lanes = ExpLanes<kWidth>;
  constexpr int64_t kLanes = 16, kParts = kLanes / kWidth;
  const int64_t full = n - n % kLanes;
  Lanes sums[kParts] = {};  // Lanes 0-7 and 8-15, or 0-15.
  for (int64_t j = 0; j < full; j += kLanes) {
#pragma GCC unroll 2
    for (int64_t part = 0; part < kParts; ++part) {
      Lanes v;
      std::memcpy(&v, x + j + part * kWidth, sizeof v);
      ExpNonPositive<kWidth>(v - max, v);
      std::memcpy(x + j + part * kWidth, &v, sizeof v);
      sums[part] += v;
    }
  }
  float lanes[kLanes];
  std::memcpy(lanes, sums, sizeof lanes);
  float sum = lanes[0];
  for (int64_t j = full; j < n; ++j) {  // The same operations, in lane 0.
    Lanes e;
    ExpNonPositive<kWidth>(Lanes{} + (x[j] - max), e);
    x[j] = e[0];
    sum += x[j];
  }
  for (int64_t l = 1; l < kLanes; ++l) sum += lanes[l];
  return sum;
}

// Replaces x[0, n) by ExpNonPositive(x[i] - max) and returns their sum. The sum is kept in 16
// independent lanes (lane l adds elements l, l + 16, ...; the last n % 16 go to lane 0) and the
// lanes are added in order at the end: the order of additions is fixed, so a row gets the same
// probabilities from every softmax that uses this (the full forward's and the decode kernels').
// Always inlined, as ExpNonPositive: each ISA clone holds both widths and runs the one its CPU
// computes as vectors (a branch on a constant).
[[gnu::always_inline]] inline float ExpShiftedSum(float* x, int64_t n, float max) {
  static const bool kAvx512 = __builtin_cpu_supports("avx512f");
  return kAvx512 ? ExpShiftedSumOf<16>(x, n, max) : ExpShiftedSumOf<8>(x, n, max);
}

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_UTIL_EXP_NON_POSITIVE_H_
