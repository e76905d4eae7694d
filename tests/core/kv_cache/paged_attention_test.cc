// The decode kernel (AttendRow) on its own, against a naive double-precision softmax(q·Kᵀ)·V over
// the same element values (bf16 rows widened exactly, int8 rows times their scale, also exact;
// for the integer dot-product kernel of all-int8 rows, the query rounded to int16 as it reads it,
// and its outputs within the bound of its 8-bit value weights),
// the portable kernel and, where the CPU has it, the integer one (int8_dot_kernel.h):
// every head-width path (32, 64 and 128 in vector registers, 48 in the general loop), fp32, bf16
// and int8 rows, a bf16 or int8 cache followed by one fp32
// key (a step's own key, read in the cache's order), segments whose lengths are not multiples of
// the four keys scored together, causal limits, explicit masks and the rows' edge cases.
#include "core/kv_cache/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/forward/bf16_conversion.h"
#include "core/kv_cache/int8_dot_kernel.h"
#include "core/kv_cache/int8_rows.h"
#include "gtest/gtest.h"

namespace attnserve::testing {
namespace {

using core::AttendRow;
using core::KvElementType;
using core::KvSegment;
using core::PrefetchTarget;
using core::PrefetchTargetFor;
using core::RowAttention;

constexpr int64_t kLd = 3;  // Rows sit kLd · head_dim apart, as a head's rows in a block do.

// One run of keys stored as `type`, with the values the kernel must read (bf16 widened exactly).
struct KeyRun {
  KvElementType type;
  int64_t count;
  std::vector<float> k{}, v{};                 // [count, kLd · head_dim] as fp32 storage...
  std::vector<uint16_t> k16{}, v16{};          // ...or as bf16 storage...
  std::vector<int8_t> k8{}, v8{};              // ...or as int8 storage,
  std::vector<uint16_t> k_scale{}, v_scale{};  // with a scale per row.
  std::vector<float> k_exact{}, v_exact{};     // [count, head_dim]: what the kernel reads.
  // int8 only: the rows as an int8 cache block lays them out (int8_rows.h), `count` rounded up to
  // a multiple of 16; the rows past `count` and their scales are garbage that must not be read
  // into the output.
  std::vector<int8_t> k_block{}, v_block{};
  std::vector<uint16_t> k_block_scale{}, v_block_scale{};
};

// How SegmentOf hands an int8 run to the kernel.
enum class Int8Layout {
  kCacheBlock,   // As an int8 cache block (what the cache gives the kernel).
  kStridedRows,  // As rows kLd · head_dim apart.
};

KeyRun MakeRun(KvElementType type, int64_t count, int64_t dim, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  KeyRun run{.type = type, .count = count};
  const int64_t ld = kLd * dim;
  run.k.resize(count * ld);
  run.v.resize(count * ld);
  for (float& x : run.k) x = normal(rng);
  for (float& x : run.v) x = normal(rng);
  if (type == KvElementType::kBFloat16) {
    run.k16.resize(run.k.size());
    run.v16.resize(run.v.size());
    core::RoundToBf16(run.k.data(), static_cast<int64_t>(run.k.size()), run.k16.data());
    core::RoundToBf16(run.v.data(), static_cast<int64_t>(run.v.size()), run.v16.data());
    core::WidenBf16(run.k16.data(), static_cast<int64_t>(run.k16.size()), run.k.data());
    core::WidenBf16(run.v16.data(), static_cast<int64_t>(run.v16.size()), run.v.data());
  }
  if (type == KvElementType::kInt8) {
    run.k8.resize(run.k.size());
    run.v8.resize(run.v.size());
    for (int64_t r = 0; r < count; ++r) {
      // Only a row's first `dim` values are the head's; the rest of the stride is another head's.
      run.k_scale.push_back(core::QuantizeInt8Row(&run.k[r * ld], dim, &run.k8[r * ld]));
      run.v_scale.push_back(core::QuantizeInt8Row(&run.v[r * ld], dim, &run.v8[r * ld]));
      core::DequantizeInt8Row(&run.k8[r * ld], run.k_scale[r], dim, &run.k[r * ld]);
      core::DequantizeInt8Row(&run.v8[r * ld], run.v_scale[r], dim, &run.v[r * ld]);
    }
  }
  for (int64_t r = 0; r < count; ++r) {
    run.k_exact.insert(run.k_exact.end(), run.k.begin() + r * ld, run.k.begin() + r * ld + dim);
    run.v_exact.insert(run.v_exact.end(), run.v.begin() + r * ld, run.v.begin() + r * ld + dim);
  }
  return run;
}

// Lays out run.k8 / run.v8 and their scales as an int8 cache block, garbage past `count`.
void LayOutBlock(KeyRun& run, int64_t dim) {
  const int64_t block_rows = (run.count + 15) / 16 * 16;
  std::mt19937 rng(static_cast<unsigned>(run.count));
  std::uniform_int_distribution<int> byte(-128, 127);
  for (auto* block : {&run.k_block, &run.v_block}) {
    block->resize(block_rows * dim);
    for (int8_t& x : *block) x = static_cast<int8_t>(byte(rng));
  }
  for (int64_t r = 0; r < run.count; ++r) {
    core::StoreInt8KeyRow(&run.k8[r * kLd * dim], block_rows, dim, r, run.k_block.data());
    core::StoreInt8ValueRow(&run.v8[r * kLd * dim], block_rows, dim, r, run.v_block.data());
  }
  constexpr uint16_t kNanScale = 0x7fc0;
  run.k_block_scale = run.k_scale;
  run.v_block_scale = run.v_scale;
  run.k_block_scale.resize(block_rows, kNanScale);
  run.v_block_scale.resize(block_rows, kNanScale);
}

// The run as the kernel reads it; an int8 run's block is laid out from its rows as they are now.
KvSegment SegmentOf(KeyRun& run, int64_t dim, Int8Layout layout = Int8Layout::kCacheBlock) {
  KvSegment segment{
      .k = run.k.data(), .v = run.v.data(), .count = run.count, .ld = kLd * dim, .type = run.type};
  if (run.type == KvElementType::kBFloat16) {
    segment.k = run.k16.data();
    segment.v = run.v16.data();
  } else if (run.type == KvElementType::kInt8 && layout == Int8Layout::kStridedRows) {
    segment.k = run.k8.data();
    segment.v = run.v8.data();
    segment.k_scale = run.k_scale.data();
    segment.v_scale = run.v_scale.data();
  } else if (run.type == KvElementType::kInt8) {
    LayOutBlock(run, dim);
    segment.k = run.k_block.data();
    segment.v = run.v_block.data();
    segment.ld = dim;
    segment.k_scale = run.k_block_scale.data();
    segment.v_scale = run.v_block_scale.data();
    segment.int8_block_rows = static_cast<int64_t>(run.k_block_scale.size());
  }
  return segment;
}

// softmax(scale · q·Kᵀ over the open keys below `limit`) · V in double; zeros if none is open.
std::vector<double> Reference(const std::vector<KeyRun>& runs, const std::vector<float>& q,
                              double scale, int64_t limit, const std::vector<uint8_t>& mask) {
  const auto dim = static_cast<int64_t>(q.size());
  std::vector<double> scores, values;
  int64_t key = 0;
  for (const KeyRun& run : runs) {
    for (int64_t r = 0; r < run.count; ++r, ++key) {
      if (key >= limit || (!mask.empty() && mask[key] == 0)) continue;
      double s = 0.0;
      for (int64_t i = 0; i < dim; ++i) s += double{q[i]} * run.k_exact[r * dim + i];
      scores.push_back(scale * s);
      values.insert(values.end(), run.v_exact.begin() + r * dim,
                    run.v_exact.begin() + (r + 1) * dim);
    }
  }
  std::vector<double> out(dim, 0.0);
  if (scores.empty()) return out;
  double max = scores[0], sum = 0.0;
  for (double s : scores) max = std::max(max, s);
  for (double& s : scores) sum += (s = std::exp(s - max));
  for (size_t j = 0; j < scores.size(); ++j) {
    for (int64_t i = 0; i < dim; ++i) out[i] += scores[j] / sum * values[j * dim + i];
  }
  return out;
}

// The query as the integer dot-product kernel reads it: rounded to the int16 grid whose step is
// its largest |element| / 32767 (int8_dot_kernel.h), independently of the kernel's arithmetic.
std::vector<float> RoundedToInt16Grid(const std::vector<float>& q) {
  double max = 0.0;
  for (float x : q) max = std::max(max, std::fabs(double{x}));
  std::vector<float> rounded(q.size());
  const double step = static_cast<float>(max / 32767.0);  // The kernel's fp32 scale.
  for (size_t i = 0; i < q.size(); ++i) {
    rounded[i] = static_cast<float>(std::nearbyint(q[i] * (32767.0 / max)) * step);
  }
  return rounded;
}

// What the integer kernel's weighing of int8 values (int8_dot_kernel.h) may add to out[i]: each
// row's weight, probability · scale, is rounded on a grid of 1/255 of the largest weight among the
// rows it is weighed with, all rows of one segment, so by at most half a step of the segment's
// largest. `largest_error` bounds the sum of those moves times |int8 value|; `rms_error` is the
// root mean square over the elements of the error's expected spread (each rounding uniform within
// ±half a step). Rows below `limit`, with the kernel's own probabilities.
struct WeightRounding {
  std::vector<double> largest_error;
  double rms_error = 0.0;
};

WeightRounding WeightRoundingOf(const std::vector<KeyRun>& runs,
                                const std::vector<float>& probabilities, int64_t limit,
                                int64_t dim) {
  WeightRounding bound{.largest_error = std::vector<double>(dim, 0.0)};
  double variance = 0.0;
  int64_t key = 0;
  for (const KeyRun& run : runs) {
    const int64_t n = std::clamp<int64_t>(limit - key, 0, run.count);
    if (run.type == KvElementType::kInt8) {
      double largest = 0.0;
      for (int64_t r = 0; r < n; ++r) {
        largest =
            std::max(largest, double{probabilities[key + r]} * core::Int8Scale(run.v_scale[r]));
      }
      const double step = largest / 255.0;
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t i = 0; i < dim; ++i) {
          const double value = run.v8[r * kLd * dim + i];
          bound.largest_error[i] += step / 2.0 * std::fabs(value);
          variance += step * step / 12.0 * value * value / static_cast<double>(dim);
        }
      }
    }
    key += run.count;
  }
  bound.rms_error = std::sqrt(variance);
  return bound;
}

double RmsDifference(const std::vector<float>& out, const std::vector<double>& expected) {
  double sum = 0.0;
  for (size_t i = 0; i < out.size(); ++i) sum += (out[i] - expected[i]) * (out[i] - expected[i]);
  return std::sqrt(sum / static_cast<double>(out.size()));
}

struct KernelCase {
  int64_t head_dim;
  KvElementType cache_type;
  bool own_fp32_key;  // A last run of one fp32 key (the step's own K/V).
};

class PagedAttentionTest : public ::testing::TestWithParam<KernelCase> {};

TEST_P(PagedAttentionTest, EqualsDoublePrecisionReference) {
  const KernelCase c = GetParam();
  const int64_t dim = c.head_dim;
  std::mt19937 rng(static_cast<unsigned>(dim * 7 + c.own_fp32_key));
  // Block-sized runs and short ones: 4-key groups with 0-3 keys left over.
  std::vector<KeyRun> runs;
  for (int64_t count : {16, 16, 7, 1, 6}) runs.push_back(MakeRun(c.cache_type, count, dim, rng));
  if (c.own_fp32_key) runs.push_back(MakeRun(KvElementType::kFloat32, 1, dim, rng));
  int64_t keys = 0;
  for (const KeyRun& run : runs) keys += run.count;
  std::vector<float> q(dim);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : q) x = normal(rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  std::vector<uint8_t> mask(keys);
  for (int64_t j = 0; j < keys; ++j) mask[j] = j % 5 != 2;

  for (const Int8Layout layout : {Int8Layout::kCacheBlock, Int8Layout::kStridedRows}) {
    if (layout == Int8Layout::kStridedRows && c.cache_type != KvElementType::kInt8) continue;
    std::vector<KvSegment> segments;
    for (KeyRun& run : runs) segments.push_back(SegmentOf(run, dim, layout));
    // The integer kernel takes rows of 64- and 128-wide heads whose keys are all int8 blocks.
    const bool integer_kernel = core::HasInt8DotKernel() && c.cache_type == KvElementType::kInt8 &&
                                !c.own_fp32_key && (dim == 64 || dim == 128) &&
                                layout == Int8Layout::kCacheBlock;
    for (const bool int8_dot : {false, true}) {
      if (int8_dot && !integer_kernel) continue;
      const std::vector<float> q_read = int8_dot ? RoundedToInt16Grid(q) : q;
      for (const bool masked : {false, true}) {
        for (const int64_t limit : {keys, keys - 3, int64_t{17}, int64_t{1}}) {
          for (const PrefetchTarget prefetch : {PrefetchTarget::kL1, PrefetchTarget::kL2}) {
            SCOPED_TRACE(::testing::Message()
                         << (int8_dot ? "integer" : "portable") << " kernel, int8 "
                         << (layout == Int8Layout::kCacheBlock ? "blocks" : "rows") << ", masked "
                         << masked << ", limit " << limit << ", prefetch to L"
                         << (prefetch == PrefetchTarget::kL1 ? 1 : 2));
            const std::vector<uint8_t> row_mask = masked ? mask : std::vector<uint8_t>{};
            const RowAttention a{.segments = segments,
                                 .keys = keys,
                                 .head_dim = dim,
                                 .scale = scale,
                                 .visible_limit = limit,
                                 .explicit_row = masked ? mask.data() : nullptr,
                                 .prefetch = prefetch,
                                 .int8_dot = int8_dot};
            std::vector<float> probabilities(keys, -1.0f), out(dim, -1.0f);
            AttendRow(a, q.data(), probabilities.data(), out.data());
            const std::vector<double> expected = Reference(runs, q_read, scale, limit, row_mask);
            WeightRounding rounding{.largest_error = std::vector<double>(dim, 0.0)};
            if (int8_dot) rounding = WeightRoundingOf(runs, probabilities, limit, dim);
            for (int64_t i = 0; i < dim; ++i) {
              EXPECT_NEAR(out[i], expected[i], 1e-5 + rounding.largest_error[i]) << "element " << i;
            }
            // The roundings' errors are as spread as independent ones of their step: a coarser
            // grid (7 bits instead of 8) doubles this.
            EXPECT_LE(RmsDifference(out, expected), 1e-6 + 1.5 * rounding.rms_error);
            double sum = 0.0;
            for (int64_t j = 0; j < keys; ++j) {
              if (j >= limit || (masked && mask[j] == 0)) {
                EXPECT_EQ(probabilities[j], 0.0f) << j;
              }
              sum += probabilities[j];
            }
            EXPECT_NEAR(sum, 1.0, 1e-5);
          }
        }
      }
    }
  }
}

// Key r of `run` set to `values` (head_dim of them), stored as the run's type.
void SetKeyRow(KeyRun& run, int64_t r, const std::vector<float>& values) {
  const auto dim = static_cast<int64_t>(values.size());
  const int64_t at = r * kLd * dim;
  float* k = &run.k[at];
  std::copy(values.begin(), values.end(), k);
  if (run.type == KvElementType::kBFloat16) {
    core::RoundToBf16(k, dim, &run.k16[at]);
    core::WidenBf16(&run.k16[at], dim, k);
  } else if (run.type == KvElementType::kInt8) {
    run.k_scale[r] = core::QuantizeInt8Row(k, dim, &run.k8[at]);
    core::DequantizeInt8Row(&run.k8[at], run.k_scale[r], dim, k);
  }
  std::copy(k, k + dim, run.k_exact.begin() + r * dim);
}

// The row's largest score is the softmax's shift wherever its key sits (first, inside or last of
// a segment, among a segment's keys past a multiple of four, in a one-key segment): it is ~100
// above the others, beyond what the exponential of a positive difference survives (the kernels'
// exp is for non-positive inputs), so the row is right only if the kernel found it; it then takes
// the whole row.
TEST_P(PagedAttentionTest, FindsTheLargestScoreWhereverItsKeySits) {
  const KernelCase c = GetParam();
  const int64_t dim = c.head_dim;
  std::mt19937 rng(static_cast<unsigned>(dim * 3 + c.own_fp32_key));
  std::vector<KeyRun> runs;
  for (int64_t count : {16, 7, 1, 6}) runs.push_back(MakeRun(c.cache_type, count, dim, rng));
  if (c.own_fp32_key) runs.push_back(MakeRun(KvElementType::kFloat32, 1, dim, rng));
  std::vector<float> q(dim);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  double q_norm2 = 0.0;
  for (float& x : q) {
    x = normal(rng);
    q_norm2 += double{x} * x;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  std::vector<float> top_key(dim);
  for (int64_t i = 0; i < dim; ++i)
    top_key[i] = static_cast<float>(q[i] * 100.0 / (scale * q_norm2));
  int64_t keys = 0;
  for (const KeyRun& run : runs) keys += run.count;
  for (int64_t top = 0; top < keys; ++top) {
    SCOPED_TRACE(::testing::Message() << "largest score at key " << top);
    std::vector<KeyRun> with_top = runs;
    size_t run = 0;
    int64_t row = top;
    while (row >= with_top[run].count) row -= with_top[run++].count;
    SetKeyRow(with_top[run], row, top_key);
    std::vector<KvSegment> segments;
    for (KeyRun& r : with_top) segments.push_back(SegmentOf(r, dim));
    const RowAttention a{
        .segments = segments, .keys = keys, .head_dim = dim, .scale = scale, .visible_limit = keys};
    std::vector<float> probabilities(keys), out(dim);
    AttendRow(a, q.data(), probabilities.data(), out.data());
    EXPECT_NEAR(probabilities[top], 1.0f, 1e-6f);
    for (int64_t i = 0; i < dim; ++i) {
      const float v = with_top[run].v_exact[row * dim + i];
      EXPECT_NEAR(out[i], v, 1e-5f * (1.0f + std::fabs(v))) << "element " << i;
    }
  }
}

// A forward whose K/V cannot fit any L3 prefetches into L2; a small one into L1.
TEST(PrefetchTargetForTest, DependsOnWhetherTheKeysFitTheL3) {
  EXPECT_EQ(PrefetchTargetFor(0), PrefetchTarget::kL1);
  EXPECT_EQ(PrefetchTargetFor(int64_t{1} << 20), PrefetchTarget::kL1);
  EXPECT_EQ(PrefetchTargetFor(int64_t{1} << 40), PrefetchTarget::kL2);
}

// Blocked keys are never read into the output, whatever their values; a row with every key
// blocked answers zeros (not NaN).
TEST_P(PagedAttentionTest, BlockedKeysAndFullyBlockedRows) {
  const KernelCase c = GetParam();
  const int64_t dim = c.head_dim;
  std::mt19937 rng(5);
  KeyRun run = MakeRun(c.cache_type, 9, dim, rng);
  // Key 8 (past the causal limit) and key 3 (masked) hold NaN.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const int64_t bad : {3, 8}) {
    for (int64_t i = 0; i < dim; ++i) {
      run.k[bad * kLd * dim + i] = run.v[bad * kLd * dim + i] = nan;
      if (!run.k16.empty()) run.k16[bad * kLd * dim + i] = run.v16[bad * kLd * dim + i] = 0x7fc0;
    }
    // An int8 row with a NaN: zero values and a NaN scale (QuantizeInt8Row).
    if (!run.k_scale.empty()) run.k_scale[bad] = run.v_scale[bad] = 0x7fc0;
  }
  const KvSegment segment = SegmentOf(run, dim);
  std::vector<uint8_t> mask(9, 1);
  mask[3] = 0;
  std::vector<float> q(dim, 0.5f), probabilities(9), out(dim);
  RowAttention a{.segments = {&segment, 1},
                 .keys = 9,
                 .head_dim = dim,
                 .scale = 0.125f,
                 .visible_limit = 8,
                 .explicit_row = mask.data()};
  AttendRow(a, q.data(), probabilities.data(), out.data());
  for (float x : out) ASSERT_TRUE(std::isfinite(x));

  a.visible_limit = 0;
  AttendRow(a, q.data(), probabilities.data(), out.data());
  for (float x : out) EXPECT_EQ(x, 0.0f);
  for (float p : probabilities) EXPECT_EQ(p, 0.0f);
}

// A value row that held a NaN or an infinity when it was cached (an int8 row then has a NaN
// scale) makes the row's output NaN in both kernels, wherever it sits in a run of 16: the forward
// reports non-finite outputs instead of answering with a silently clamped value.
TEST(Int8DotKernelTest, ANonFiniteValueRowMakesTheOutputNaN) {
  for (const int64_t dim : {int64_t{64}, int64_t{128}}) {
    for (const int64_t bad_row : {int64_t{0}, int64_t{9}, int64_t{15}}) {
      std::mt19937 rng(static_cast<unsigned>(dim + bad_row));
      std::vector<KeyRun> runs;
      for (int b = 0; b < 3; ++b) runs.push_back(MakeRun(KvElementType::kInt8, 16, dim, rng));
      runs[1].v[bad_row * kLd * dim + 5] = std::numeric_limits<float>::quiet_NaN();
      runs[1].v_scale[bad_row] = core::QuantizeInt8Row(&runs[1].v[bad_row * kLd * dim], dim,
                                                       &runs[1].v8[bad_row * kLd * dim]);
      std::vector<KvSegment> segments;
      for (KeyRun& run : runs) segments.push_back(SegmentOf(run, dim));
      std::vector<float> q(dim, 0.1f), probabilities(48), out(dim);
      for (const bool int8_dot : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "d " << dim << ", bad row " << bad_row
                                          << (int8_dot ? ", integer" : ", portable") << " kernel");
        const RowAttention a{.segments = segments,
                             .keys = 48,
                             .head_dim = dim,
                             .scale = 0.125f,
                             .visible_limit = 48,
                             .int8_dot = int8_dot};
        AttendRow(a, q.data(), probabilities.data(), out.data());
        for (int64_t i = 0; i < dim; ++i) EXPECT_TRUE(std::isnan(out[i])) << i;
      }
    }
  }
}

// The integer kernel's edge cases against the portable kernel's answers: a zero query (every
// score 0: the mean of the values), a query holding NaN or an infinity (NaN output, which the
// forward reports), a subnormal one (too small to scale to int16), and a long row of many blocks
// (equal up to the query's int16 rounding).
TEST(Int8DotKernelTest, AgreesWithThePortableKernel) {
  if (!core::HasInt8DotKernel()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  for (const int64_t dim : {int64_t{64}, int64_t{128}}) {
    std::mt19937 rng(static_cast<unsigned>(dim));
    std::vector<KeyRun> runs;
    std::vector<KvSegment> segments;
    for (int b = 0; b < 40; ++b) runs.push_back(MakeRun(KvElementType::kInt8, 16, dim, rng));
    for (KeyRun& run : runs) segments.push_back(SegmentOf(run, dim));
    const int64_t keys = 40 * 16;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> random(dim);
    for (float& x : random) x = normal(rng);
    std::vector<float> with_nan = random, with_inf = random, subnormal(dim);
    for (int64_t i = 0; i < dim; ++i) subnormal[i] = static_cast<float>(i % 3 - 1) * 1e-39f;
    with_nan[dim / 2] = std::numeric_limits<float>::quiet_NaN();
    with_inf[3] = -std::numeric_limits<float>::infinity();
    for (const auto& [name, q] : {std::pair{"zero", std::vector<float>(dim, 0.0f)},
                                  std::pair{"random", random}, std::pair{"NaN", with_nan},
                                  std::pair{"-inf", with_inf}, std::pair{"subnormal", subnormal}}) {
      SCOPED_TRACE(::testing::Message() << "d " << dim << ", " << name << " query");
      std::vector<float> probabilities(keys), out(dim), portable_probabilities(keys), portable(dim);
      RowAttention a{.segments = segments,
                     .keys = keys,
                     .head_dim = dim,
                     .scale = 1.0f / std::sqrt(static_cast<float>(dim)),
                     .visible_limit = keys};
      AttendRow(a, q.data(), probabilities.data(), out.data());
      a.int8_dot = false;
      AttendRow(a, q.data(), portable_probabilities.data(), portable.data());
      const WeightRounding rounding = WeightRoundingOf(runs, probabilities, keys, dim);
      for (int64_t i = 0; i < dim; ++i) {
        if (std::isnan(portable[i])) {
          EXPECT_TRUE(std::isnan(out[i])) << i;
        } else {
          EXPECT_NEAR(out[i], portable[i], 2e-5 + rounding.largest_error[i]) << i;
        }
      }
      // The query's rounding moves a score by at most scale · max|q| / 65534 · Σ|k| (~4e-4 for
      // these rows), a probability by about twice that, relatively.
      for (int64_t j = 0; j < keys; ++j) {
        if (std::isnan(portable_probabilities[j])) continue;
        EXPECT_NEAR(probabilities[j], portable_probabilities[j],
                    1e-3 * portable_probabilities[j] + 1e-9)
            << j;
      }
    }
  }
}

std::string CaseName(const ::testing::TestParamInfo<KernelCase>& param_info) {
  const KernelCase& c = param_info.param;
  std::string name = "d";
  name += std::to_string(c.head_dim);
  name += c.cache_type == KvElementType::kBFloat16 ? "_bf16"
          : c.cache_type == KvElementType::kInt8   ? "_int8"
                                                   : "_fp32";
  if (c.own_fp32_key) name += "_with_fp32_key";
  return name;
}

INSTANTIATE_TEST_SUITE_P(Widths, PagedAttentionTest,
                         ::testing::Values(KernelCase{32, KvElementType::kFloat32, false},
                                           KernelCase{64, KvElementType::kFloat32, false},
                                           KernelCase{128, KvElementType::kFloat32, false},
                                           KernelCase{48, KvElementType::kFloat32, false},
                                           KernelCase{32, KvElementType::kBFloat16, true},
                                           KernelCase{64, KvElementType::kBFloat16, false},
                                           KernelCase{64, KvElementType::kBFloat16, true},
                                           KernelCase{128, KvElementType::kBFloat16, true},
                                           KernelCase{48, KvElementType::kBFloat16, true},
                                           KernelCase{32, KvElementType::kInt8, false},
                                           KernelCase{32, KvElementType::kInt8, true},
                                           KernelCase{64, KvElementType::kInt8, false},
                                           KernelCase{64, KvElementType::kInt8, true},
                                           KernelCase{128, KvElementType::kInt8, false},
                                           KernelCase{48, KvElementType::kInt8, true}),
                         CaseName);

}  // namespace
}  // namespace attnserve::testing
