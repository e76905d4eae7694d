// AttentionTile and its cache: one f32 tile runs every batch, row, key and stride geometry of a
// (heads, d_k) pair, and its scaled Q·Kᵀ and P·V steps match a double-precision product on each;
// bf16 tiles stay one per geometry; tiles planned for different OpenMP team sizes are kept apart.
#include "core/forward/attention_tile.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/forward/onednn_support.h"
#include "core/util/aligned_buffer.h"
#include "tests/core/attention_test_support.h"

namespace attnserve::core {
namespace {

constexpr int64_t kHeads = 3, kHeadDim = 8;

// A self-describing f32 geometry: `batch` sequences of `rows` queries over `keys` keys, each
// operand's rows `pad` elements wider than the heads need (so the strides are not the dense
// ones), sequences one after another.
TileGeometry F32(int64_t batch, int64_t rows, int64_t keys, int64_t pad) {
  const int64_t ld = kHeads * kHeadDim + pad;
  return {.batch = batch,
          .heads = kHeads,
          .rows = rows,
          .keys = keys,
          .head_dim = kHeadDim,
          .q_ld = ld,
          .kv_ld = ld,
          .out_ld = ld,
          .q_batch_stride = rows * ld,
          .kv_batch_stride = keys * ld,
          .out_batch_stride = rows * ld};
}

// Runs both steps of `g` on random operands and checks them against double products: scores =
// Q_h·K_hᵀ/√d_k per sequence and head, then out = S_h·V_h with the scores as probabilities (the
// steps do not care whether they sum to one).
void ExpectStepsMatchDoubleProducts(AttentionTileCache& cache, const TileGeometry& g,
                                    uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "batch " << g.batch << ", rows " << g.rows << ", keys "
                                    << g.keys << ", ld " << g.q_ld);
  const std::vector<float> q =
      attnserve::testing::UniformValues(static_cast<size_t>(g.batch * g.q_batch_stride), seed);
  const std::vector<float> kv =
      attnserve::testing::UniformValues(static_cast<size_t>(g.batch * g.kv_batch_stride), seed + 1);
  std::vector<float> out(static_cast<size_t>(g.batch * g.out_batch_stride), 0.0f);
  std::vector<float> scores(static_cast<size_t>(g.score_elements()));
  AlignedBuffer scratchpad(1), head_major(1);
  auto tile = cache.Get(g, scratchpad, head_major);
  ASSERT_TRUE(tile.ok()) << tile.status();
  ASSERT_TRUE((*tile)->Serves(g));
  dnnl::stream stream(CpuEngine());
  // K and V share one buffer here, as they share the fused projection's rows in the executor.
  (*tile)->Scores(stream, g, q.data(), kv.data(), scores.data(), scratchpad.data(),
                  head_major.data());
  (*tile)->Values(stream, g, scores.data(), kv.data(), out.data(), scratchpad.data(),
                  head_major.data());

  const double scale = 1.0 / std::sqrt(static_cast<double>(g.head_dim));
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t h = 0; h < g.heads; ++h) {
      const int64_t plane = (b * g.heads + h) * g.rows * g.keys;
      for (int64_t r = 0; r < g.rows; ++r) {
        const float* q_row = &q[b * g.q_batch_stride + r * g.q_ld + h * g.head_dim];
        for (int64_t s = 0; s < g.keys; ++s) {
          const float* k_row = &kv[b * g.kv_batch_stride + s * g.kv_ld + h * g.head_dim];
          double dot = 0;
          for (int64_t i = 0; i < g.head_dim; ++i) dot += double{q_row[i]} * k_row[i];
          ASSERT_NEAR(scores[plane + r * g.keys + s], dot * scale, 1e-5)
              << "score b=" << b << " h=" << h << " r=" << r << " s=" << s;
        }
        for (int64_t i = 0; i < g.head_dim; ++i) {
          double sum = 0;
          for (int64_t s = 0; s < g.keys; ++s) {
            sum += double{scores[plane + r * g.keys + s]} *
                   kv[b * g.kv_batch_stride + s * g.kv_ld + h * g.head_dim + i];
          }
          ASSERT_NEAR(out[b * g.out_batch_stride + r * g.out_ld + h * g.head_dim + i], sum, 1e-4)
              << "out b=" << b << " h=" << h << " r=" << r << " i=" << i;
        }
      }
    }
  }
}

TEST(AttentionTileTest, OneF32TileRunsEveryGeometryOfItsHeadsAndHeadDim) {
  AttentionTileCache cache(512);
  uint64_t seed = 1;
  for (const TileGeometry& g : {F32(1, 5, 5, 0), F32(2, 7, 13, 0), F32(1, 1, 40, 3),
                                F32(3, 17, 4, 8), F32(1, 130, 129, 1), F32(2, 5, 5, 0)}) {
    ExpectStepsMatchDoubleProducts(cache, g, seed += 2);
  }
  EXPECT_EQ(cache.size(), 1u);

  TileGeometry other_heads = F32(1, 5, 5, 0);
  other_heads.heads = 2;
  ExpectStepsMatchDoubleProducts(cache, other_heads, 100);
  EXPECT_EQ(cache.size(), 2u);
}

TEST(AttentionTileTest, Bf16TilesAreOnePerGeometry) {
  if (!HasBf16Kernels()) GTEST_SKIP() << "no bf16 kernels on " << OneDnnIsa();
  AttentionTileCache cache(512);
  AlignedBuffer scratchpad(1), head_major(1);
  TileGeometry a = F32(1, 5, 5, 0);
  a.bf16 = true;
  TileGeometry b = a;
  b.keys = 6;
  b.kv_batch_stride = 6 * b.kv_ld;
  auto tile_a = cache.Get(a, scratchpad, head_major);
  auto tile_b = cache.Get(b, scratchpad, head_major);
  ASSERT_TRUE(tile_a.ok() && tile_b.ok());
  EXPECT_NE(*tile_a, *tile_b);
  EXPECT_FALSE((*tile_a)->Serves(b));
  EXPECT_EQ(cache.size(), 2u);
}

TEST(AttentionTileTest, TilesForDifferentTeamSizesAreKeptApart) {
  if (omp_get_max_threads() < 2) GTEST_SKIP() << "needs an OpenMP team of two or more";
  AttentionTileCache cache(512);
  AlignedBuffer scratchpad(1), head_major(1);
  const TileGeometry g = F32(1, 5, 5, 0);
  ASSERT_TRUE(cache.Get(g, scratchpad, head_major).ok());
  // As the executor's per-head region does: each member plans for a team of one.
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    {
      omp_set_num_threads(1);
      AlignedBuffer inner_scratchpad(1), inner_head_major(1);
      EXPECT_TRUE(cache.Get(g, inner_scratchpad, inner_head_major).ok());
    }
  }
  EXPECT_EQ(cache.size(), 2u);
}

}  // namespace
}  // namespace attnserve::core
