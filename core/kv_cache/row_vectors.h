// Internal to the paged decode kernel (paged_attention.cc): elements of K/V rows widened to fp32,
// one at a time (ToFloat) or 16·kG at a time in vector registers (LoadGroup, StoreGroup), and the
// horizontal sums that turn a key's vector of partial products into its dot product. Every helper
// is always inlined, so that it is compiled into each ISA clone of the kernel that calls it (one
// left out of line would be compiled once, for baseline SSE2).
//
// Pure functions; thread-safe. Include only from the kernel's .cc files.
#ifndef ATTNSERVE_CORE_KV_CACHE_ROW_VECTORS_H_
#define ATTNSERVE_CORE_KV_CACHE_ROW_VECTORS_H_

#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace attnserve::core::row_vectors {

// bf16 → fp32 is exact: the 16 bits become the top half of the float (a zero-extend and a shift,
// which vectorise as vpmovzxwd + vpslld).
[[gnu::always_inline]] inline float Widen(uint16_t x) {
  return std::bit_cast<float>(static_cast<uint32_t>(x) << 16);
}

// An element of a bf16 or int8 row as fp32 (int8 before its row's scale).
[[gnu::always_inline]] inline float ToFloat(float x) { return x; }
[[gnu::always_inline]] inline float ToFloat(uint16_t x) { return Widen(x); }
[[gnu::always_inline]] inline float ToFloat(int8_t x) { return static_cast<float>(x); }

// 16 floats as one value: a zmm register in the AVX-512 clone, two ymm or four xmm in the others
// (GCC vector extensions are lowered per target; shuffles use __builtin_shufflevector, which GCC
// 12 and Clang both have: the fuzzers build with Clang). The fixed-width kernel is written on
// these rather than `omp simd` loops, whose reductions GCC ends with 15 dependent scalar adds per
// key and whose accumulators it keeps on the stack (a store-to-load chain per key).
// The helpers returning them are always inlined, so GCC's warning that such values change the
// calling convention between clones (-Wpsabi, reported where the clones are emitted, hence for
// the whole including file) does not apply; they take them by reference (GCC notes by-value 64-byte
// parameters in the baseline build whatever the pragma says).
#pragma GCC diagnostic ignored "-Wpsabi"
using Vec16 = float __attribute__((vector_size(64)));
using Vec16u32 = uint32_t __attribute__((vector_size(64)));
using Vec16u16 = uint16_t __attribute__((vector_size(32)));
using Vec16i16 = int16_t __attribute__((vector_size(32)));
using Vec16i32 = int32_t __attribute__((vector_size(64)));
constexpr int64_t kVecFloats = 16;

[[gnu::always_inline]] inline Vec16 Load16(const float* p) {
  Vec16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// bf16 widened exactly, as Widen above.
[[gnu::always_inline]] inline Vec16 Load16(const uint16_t* p) {
  Vec16u16 h;
  std::memcpy(&h, p, sizeof h);
  return reinterpret_cast<Vec16>(__builtin_convertvector(h, Vec16u32) << 16);
}

// 16·kG consecutive elements as kG vectors, in the order that is cheapest to widen: vector j,
// lane l holds element kG·l + j. kG 1 is natural order. kG 2 ("paired") suits bf16: a pair of
// bf16 is one 32-bit lane, widened by a shift and a mask, where natural order needs four widening
// moves and two inserts per 32 elements. kG 4 suits int8: four int8 are one 32-bit lane, each
// sign-extended by shifting its byte to the top and back. A row's query and output use its
// cache's order (the dot products and sums do not depend on it); a segment of another type in
// the same row (the step's own fp32 key) is rearranged as it is read.
template <int kG>
struct Group {
  Vec16 v[kG];
};

template <int kG, typename T>
[[gnu::always_inline]] inline Group<kG> LoadGroup(const T* p) {
  Group<kG> g;
  if constexpr (kG == 1 && !std::is_same_v<T, int8_t>) {
    g.v[0] = Load16(p);
  } else if constexpr (kG == 2 && std::is_same_v<T, float>) {
    const Vec16 low = Load16(p), high = Load16(p + kVecFloats);
    g.v[0] = __builtin_shufflevector(low, high, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                     28, 30);
    g.v[1] = __builtin_shufflevector(low, high, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27,
                                     29, 31);
  } else if constexpr (kG == 2 && std::is_same_v<T, uint16_t>) {
    Vec16u32 both;
    std::memcpy(&both, p, sizeof both);
    g.v[0] = reinterpret_cast<Vec16>(both << 16);
    g.v[1] = reinterpret_cast<Vec16>(both & 0xffff0000u);
  } else if constexpr (kG == 2 && std::is_same_v<T, int8_t>) {
    // 16 int16 lanes sign-extended to int32 (vpmovsxwd); the even byte shifted up and back.
    Vec16i16 both;
    std::memcpy(&both, p, sizeof both);
    const Vec16i32 wide = __builtin_convertvector(both, Vec16i32);
    g.v[0] = __builtin_convertvector((wide << 24) >> 24, Vec16);
    g.v[1] = __builtin_convertvector(wide >> 8, Vec16);
  } else if constexpr (kG == 4 && std::is_same_v<T, int8_t>) {
    // GCC 12 scalarises a direct int8 -> int32 or float vector conversion (an insert per element:
    // the kernel ran at a quarter of bf16's speed); shifts of 32-bit lanes do not.
    Vec16i32 quads;
    std::memcpy(&quads, p, sizeof quads);
    g.v[0] = __builtin_convertvector((quads << 24) >> 24, Vec16);
    g.v[1] = __builtin_convertvector((quads << 16) >> 24, Vec16);
    g.v[2] = __builtin_convertvector((quads << 8) >> 24, Vec16);
    g.v[3] = __builtin_convertvector(quads >> 24, Vec16);
  } else {
    // The other combinations only meet a row's odd segment (or its query and output): element by
    // element.
    for (int j = 0; j < kG; ++j) {
      for (int64_t l = 0; l < kVecFloats; ++l) g.v[j][l] = ToFloat(p[kG * l + j]);
    }
  }
  return g;
}

// Writes a group back as 16·kG consecutive floats (LoadGroup<kG>(const float*) undone).
template <int kG>
[[gnu::always_inline]] inline void StoreGroup(const Group<kG>& g, float* p) {
  if constexpr (kG == 1) {
    std::memcpy(p, &g.v[0], sizeof g.v[0]);
  } else if constexpr (kG == 2) {
    const Vec16 low = __builtin_shufflevector(g.v[0], g.v[1], 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5,
                                              21, 6, 22, 7, 23);
    const Vec16 high = __builtin_shufflevector(g.v[0], g.v[1], 8, 24, 9, 25, 10, 26, 11, 27, 12, 28,
                                               13, 29, 14, 30, 15, 31);
    std::memcpy(p, &low, sizeof low);
    std::memcpy(p + kVecFloats, &high, sizeof high);
  } else {
    for (int j = 0; j < kG; ++j) {
      for (int64_t l = 0; l < kVecFloats; ++l) p[kG * l + j] = g.v[j][l];
    }
  }
}

// Σ lanes as a tree: four shuffle-add steps instead of a chain of 15 adds.
[[gnu::always_inline]] inline float HorizontalSum(const Vec16& lanes) {
  Vec16 v = lanes;
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1);
  v += __builtin_shufflevector(v, v, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0);
  return v[0];
}

// Σ lanes of a, b, c and d at once, in lanes 0, 4, 8 and 12 of the result: four keys' sums share
// one shuffle-add tree (13 operations instead of 4 × 8).
[[gnu::always_inline]] inline Vec16 HorizontalSum4(const Vec16& a, const Vec16& b, const Vec16& c,
                                                   const Vec16& d) {
  const Vec16 ab =
      __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
      __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  const Vec16 cd =
      __builtin_shufflevector(c, d, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
      __builtin_shufflevector(c, d, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  // Lanes 0-3: a's four partial sums, 4-7: b's, 8-11: c's, 12-15: d's.
  Vec16 t =
      __builtin_shufflevector(ab, cd, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
      __builtin_shufflevector(ab, cd, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  t += __builtin_shufflevector(t, t, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  t += __builtin_shufflevector(t, t, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  return t;
}

// Σ lanes of sixteen vectors, the sum of vector i in lane i; `lanes(i)` gives vector i. The tree
// is HorizontalSum's and HorizontalSum4's (lane l + lane l+8, then +4, +2, +1), so a key's score is
// the same whichever of the three summed it. Pairs are combined as they come (vector 2k with 2k+1,
// then those results pairwise), so at most five partial results are live: 45 operations for sixteen
// keys, where HorizontalSum4 takes 52 and leaves each sum in a lane of its own vector.
template <typename Lanes>
[[gnu::always_inline]] inline Vec16 HorizontalSum16(Lanes&& lanes) {
  // Two vectors' sums over lane pairs l, l+8: the first's eight in lanes 0-7, the second's in 8-15.
  const auto eights = [&](int64_t i) __attribute__((always_inline)) {
    const Vec16 a = lanes(i), b = lanes(i + 1);
    return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30,
                                   31);
  };
  // Four vectors' sums: four partial sums each, in lanes 4k..4k+3.
  const auto fours = [&](int64_t i) __attribute__((always_inline)) {
    const Vec16 c = eights(i), d = eights(i + 2);
    return __builtin_shufflevector(c, d, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(c, d, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30,
                                   31);
  };
  // Eight vectors' sums: two partial sums each, in lanes 2k and 2k+1.
  const auto twos = [&](int64_t i) __attribute__((always_inline)) {
    const Vec16 e = fours(i), f = fours(i + 4);
    return __builtin_shufflevector(e, f, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(e, f, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30,
                                   31);
  };
  const Vec16 g = twos(0), h = twos(8);
  return __builtin_shufflevector(g, h, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(g, h, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

// The largest lane of m, whose lanes are not NaN.
[[gnu::always_inline]] inline float HorizontalMax(const Vec16& m) {
  Vec16 v = m, t;
  t = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v = t > v ? t : v;
  t = __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);
  v = t > v ? t : v;
  t = __builtin_shufflevector(v, v, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1);
  v = t > v ? t : v;
  t = __builtin_shufflevector(v, v, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0);
  v = t > v ? t : v;
  return v[0];
}

}  // namespace attnserve::core::row_vectors

#endif  // ATTNSERVE_CORE_KV_CACHE_ROW_VECTORS_H_
