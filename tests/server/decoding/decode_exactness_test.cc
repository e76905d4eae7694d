// A session's outputs through the decoding runtime equal (≤ 1e-5) the core's own step-by-step
// results, one full forward of the whole sequence through core::AttentionExecutor, and the
// double-precision reference — for self- and cross-attention, with other sessions' prefill
// chunks and decode steps in the same iterations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "core/kv_cache/cached_attention.h"
#include "server/decoding/decode_runtime.h"
#include "tests/core/attention_test_support.h"
#include "tests/core/kv_cache/kv_test_support.h"
#include "tests/reference/reference_attention.h"
#include "tests/server/decoding/decode_test_support.h"

namespace attnserve::testing {
namespace {

using decoding::DecodeRuntime;
using decoding::SessionId;

// One session's plan: a prompt of `prompt` rows, then `steps` one-row steps; `memory` rows of
// encoder memory make it cross-attention.
struct Plan {
  int64_t prompt;
  int64_t steps;
  int64_t memory;
};

// The core alone: the prompt in one cached forward, then one-row steps.
std::vector<float> CoreStepByStep(const core::AttentionLayer& layer, const std::vector<float>& x,
                                  const std::vector<float>& memory, int64_t prompt) {
  auto pool = core::KvBlockPool::Create(
      layer.config(), {.block_tokens = 16, .budget_bytes = 4 << 20, .max_sequence_tokens = 4096});
  EXPECT_TRUE(pool.ok()) << pool.status();
  core::CachedAttentionExecutor executor;
  core::KvSequence seq;
  core::KvSequence* caches[] = {&seq};
  const bool cross = !memory.empty();
  if (cross) {
    const std::vector<int64_t> offsets{0, static_cast<int64_t>(memory.size()) / kD};
    EXPECT_TRUE(executor.LoadMemory(layer, **pool, {memory, offsets}, caches).ok());
  }
  const int64_t rows = static_cast<int64_t>(x.size()) / kD;
  std::vector<float> out(x.size());
  for (int64_t r = 0; r < rows;) {
    const int64_t n = r == 0 ? prompt : 1;
    const std::vector<int64_t> offsets{0, n};
    const core::CachedAttentionInputs in{.query = {std::span(x).subspan(r * kD, n * kD), offsets},
                                         .caches = caches,
                                         .cross_attention = cross,
                                         .mask = {.causal = !cross}};
    const absl::Status s =
        executor.Forward(layer, **pool, in, {.output = std::span(out).subspan(r * kD, n * kD)});
    EXPECT_TRUE(s.ok()) << s;
    r += n;
  }
  (*pool)->Release(seq);
  return out;
}

// The double reference over the whole sequence.
double ReferenceError(const TestModel& m, const std::vector<float>& x,
                      const std::vector<float>& memory, const std::vector<float>& got) {
  const std::vector<int64_t> offsets{0, static_cast<int64_t>(x.size()) / kD};
  const std::vector<int64_t> memory_offsets{0, static_cast<int64_t>(memory.size()) / kD};
  core::AttentionInputs in{.query = {x, offsets}, .mask = {.causal = memory.empty()}};
  if (!memory.empty()) in.memory = core::RaggedBatch{memory, memory_offsets};
  absl::StatusOr<reference::ReferenceOutputs> ref = reference::Attention(m.config, m.weights, in);
  EXPECT_TRUE(ref.ok()) << ref.status();
  if (!ref.ok()) return INFINITY;
  return SummariseError(got, ref->output).max_abs_error;
}

TEST(DecodeExactnessTest, InterleavedSessionsEqualCoreFullForwardAndReference) {
  const TestModel m = MakeModel("m", 1, 7);
  RecordingListener listener;
  auto runtime =
      DecodeRuntime::Create({.scheduling = {.max_iteration_tokens = 64, .prefill_chunk_tokens = 16},
                             .compute_threads = 1},
                            batching::RealClock::Default(), &listener);
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  DecodeRuntime& rt = **runtime;

  // Two self-attention sessions with prompts longer than a chunk, one that only decodes, and a
  // cross-attention session.
  const std::vector<Plan> plans = {{40, 6, 0}, {23, 6, 0}, {1, 6, 0}, {5, 6, 19}};
  std::vector<std::vector<float>> xs, memories;
  std::vector<SessionId> ids;
  for (size_t i = 0; i < plans.size(); ++i) {
    xs.push_back(UniformValues((plans[i].prompt + plans[i].steps) * kD, 100 + i));
    memories.push_back(UniformValues(plans[i].memory * kD, 200 + i));
    ids.push_back(OpenReady(rt, m.model, 0, memories[i]));
  }
  std::vector<std::vector<float>> outputs(plans.size());
  auto collect = [&](std::vector<Answer>& answers) {
    for (size_t i = 0; i < answers.size(); ++i) {
      const auto& result = answers[i].Get();
      ASSERT_TRUE(result.ok()) << "session " << i << ": " << result.status();
      outputs[i].insert(outputs[i].end(), result->begin(), result->end());
    }
  };
  {
    // Every prompt queued before the first iteration: their chunks share iterations.
    std::vector<Answer> answers(plans.size());
    rt.Pause();
    for (size_t i = 0; i < plans.size(); ++i) {
      ASSERT_TRUE(Append(rt, ids[i], Rows(xs[i], 0, plans[i].prompt), &answers[i]).ok());
    }
    rt.Resume();
    collect(answers);
  }
  for (int64_t step = 0; step < 6; ++step) {
    std::vector<Answer> answers(plans.size());
    rt.Pause();
    for (size_t i = 0; i < plans.size(); ++i) {
      ASSERT_TRUE(Append(rt, ids[i], Rows(xs[i], plans[i].prompt + step, 1), &answers[i]).ok());
    }
    rt.Resume();
    collect(answers);
  }

  for (size_t i = 0; i < plans.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "session " << i);
    const std::vector<float> full =
        FullForward(*m.model->layer, xs[i], memories[i].empty(), memories[i]);
    EXPECT_LE(MaxAbsDiff(outputs[i], full), kExact);
    EXPECT_LE(MaxAbsDiff(outputs[i],
                         CoreStepByStep(*m.model->layer, xs[i], memories[i], plans[i].prompt)),
              kExact);
    EXPECT_LE(ReferenceError(m, xs[i], memories[i], outputs[i]), kExact);
  }
  // The prompts were cut into chunks of 16 that ran next to each other and to decode steps, and
  // every step round was one iteration holding every session (self and cross: two forwards).
  int64_t shared_prefill = 0, decode_rounds = 0;
  for (const decoding::IterationReport& report : listener.iterations()) {
    EXPECT_EQ(report.failed, 0);
    if (report.prefill_tokens > 16 && report.decode_tokens > 0) ++shared_prefill;
    if (report.decode_tokens == 4 && report.prefill_tokens == 0) {
      ++decode_rounds;
      EXPECT_EQ(report.forwards, 2);
    }
  }
  EXPECT_GE(shared_prefill, 1);
  EXPECT_EQ(decode_rounds, 6);
  const decoding::DecodeStats stats = rt.Stats();
  EXPECT_EQ(stats.prefill_tokens, 40 + 23 + 5);
  EXPECT_EQ(stats.decode_tokens, 1 + 4 * 6);
}

// A model whose config says kv_cache_dtype int8 decodes over an int8 cache, beside an fp32 model
// on the same weights in the same iterations: its self- and cross-attention outputs stay within
// 1e-2 (relative) of the fp32 cache's, which equal the full forward, and differ from them (the
// int8 rows were read).
TEST(DecodeExactnessTest, AnInt8CacheModelDecodesBesideAnFp32OneWithinItsBound) {
  const TestModel m = MakeModel("m", 1, 9);
  auto int8_model = std::make_shared<model::Model>(*m.model);
  int8_model->name = "m8";
  int8_model->config.kv_cache_dtype = model::KvCacheDtype::kInt8;
  RecordingListener listener;
  auto runtime =
      DecodeRuntime::Create({.compute_threads = 1}, batching::RealClock::Default(), &listener);
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  DecodeRuntime& rt = **runtime;
  constexpr int64_t kPrompt = 20, kSteps = 12;
  const std::vector<float> x = UniformValues((kPrompt + kSteps) * kD, 31);
  const std::vector<float> memory = UniformValues(17 * kD, 32);
  // Sessions: fp32 self, int8 self, fp32 cross, int8 cross.
  const std::vector<std::shared_ptr<const model::Model>> models = {m.model, int8_model, m.model,
                                                                   int8_model};
  std::vector<SessionId> ids;
  for (size_t i = 0; i < models.size(); ++i) {
    ids.push_back(OpenReady(rt, models[i], 0, i < 2 ? std::vector<float>() : memory));
  }
  std::vector<std::vector<float>> outputs(models.size());
  for (int64_t step = 0; step <= kSteps; ++step) {
    const int64_t first = step == 0 ? 0 : kPrompt + step - 1, rows = step == 0 ? kPrompt : 1;
    std::vector<Answer> answers(models.size());
    rt.Pause();
    for (size_t i = 0; i < models.size(); ++i) {
      ASSERT_TRUE(Append(rt, ids[i], Rows(x, first, rows), &answers[i]).ok());
    }
    rt.Resume();
    for (size_t i = 0; i < models.size(); ++i) {
      const auto& result = answers[i].Get();
      ASSERT_TRUE(result.ok()) << "session " << i << ": " << result.status();
      outputs[i].insert(outputs[i].end(), result->begin(), result->end());
    }
  }
  for (size_t pair : {0, 2}) {
    SCOPED_TRACE(pair == 0 ? "self-attention" : "cross-attention");
    const std::vector<float>& fp32 = outputs[pair];
    const std::vector<float>& int8 = outputs[pair + 1];
    const std::vector<float> full =
        FullForward(*m.model->layer, x, pair == 0, pair == 0 ? std::vector<float>() : memory);
    EXPECT_LE(MaxAbsDiff(fp32, full), kExact);
    EXPECT_LE(RelativeError(int8, fp32), 1e-2);
    EXPECT_GT(MaxAbsDiff(int8, fp32), 1e-6);
  }
}

// A 512-row prompt is cut into chunks of at most prefill_chunk_tokens, one per iteration, and
// two decoding sessions get a step answered in every one of those iterations.
TEST(DecodeExactnessTest, LongPromptIsChunkedWhileOtherSessionsDecodeEveryIteration) {
  const TestModel m = MakeModel("m", 1, 8);
  RecordingListener listener;
  auto runtime =
      DecodeRuntime::Create({.scheduling = {.max_iteration_tokens = 40, .prefill_chunk_tokens = 32},
                             .compute_threads = 1},
                            batching::RealClock::Default(), &listener);
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  DecodeRuntime& rt = **runtime;
  // 16 chunks alternate with decode-only iterations (31 iterations): the decoders' 40 steps
  // outlast the prompt, so every iteration of it has their steps waiting.
  constexpr int64_t kPrompt = 512, kSteps = 40;
  const std::vector<float> prompt = UniformValues(kPrompt * kD, 1);
  const SessionId long_id = OpenReady(rt, m.model);

  // Each decoding session appends its next step from the previous step's answer (as a client
  // that generates token by token), so it always has one step waiting.
  struct Decoder {
    SessionId id = 0;
    std::vector<float> x;
    std::vector<float> out;
    int64_t answered = 0;
    Notification finished;
    absl::Status error;
  };
  std::vector<std::unique_ptr<Decoder>> decoders;
  std::function<void(Decoder*)> next;
  next = [&](Decoder* d) {
    decoding::StepRequest request{.session = d->id,
                                  .rows = Rows(d->x, d->answered, 1),
                                  .done = [&, d](absl::StatusOr<std::vector<float>> r) {
                                    if (!r.ok()) {
                                      d->error = r.status();
                                      d->finished.Notify();
                                      return;
                                    }
                                    d->out.insert(d->out.end(), r->begin(), r->end());
                                    if (++d->answered == kSteps) {
                                      d->finished.Notify();
                                    } else {
                                      next(d);
                                    }
                                  }};
    const absl::Status s = rt.Append(&request);
    if (!s.ok()) {
      d->error = s;
      d->finished.Notify();
    }
  };
  for (int i = 0; i < 2; ++i) {
    auto d = std::make_unique<Decoder>();
    d->id = OpenReady(rt, m.model);
    d->x = UniformValues(kSteps * kD, 50 + i);
    decoders.push_back(std::move(d));
  }
  Answer long_answer;
  rt.Pause();
  ASSERT_TRUE(Append(rt, long_id, prompt, &long_answer).ok());
  for (auto& d : decoders) next(d.get());
  rt.Resume();
  const auto& long_result = long_answer.Get();
  ASSERT_TRUE(long_result.ok()) << long_result.status();
  for (auto& d : decoders) {
    ASSERT_TRUE(d->finished.WaitForNotificationWithTimeout(kWait));
    ASSERT_TRUE(d->error.ok()) << d->error;
    EXPECT_LE(MaxAbsDiff(d->out, FullForward(*m.model->layer, d->x, true)), kExact);
  }
  EXPECT_LE(MaxAbsDiff(*long_result, FullForward(*m.model->layer, prompt, true)), kExact);

  int64_t prefill_iterations = 0;
  bool last_had_prefill = false;
  for (const decoding::IterationReport& report : listener.iterations()) {
    // A step that waited through a chunk is not delayed by another one.
    EXPECT_FALSE(last_had_prefill && report.prefill_tokens > 0) << "two chunk iterations in a row";
    last_had_prefill = report.prefill_tokens > 0;
    if (report.prefill_tokens == 0) continue;
    ++prefill_iterations;
    EXPECT_LE(report.prefill_tokens, 32);
    EXPECT_EQ(report.decode_tokens, 2) << "a decode step waited behind the prompt";
  }
  EXPECT_EQ(prefill_iterations, kPrompt / 32);
}

}  // namespace
}  // namespace attnserve::testing
