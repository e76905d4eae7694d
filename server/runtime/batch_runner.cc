#include "server/runtime/batch_runner.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <utility>

#include "absl/status/status.h"
#include "core/forward/attention_batch.h"

namespace attnserve::server {
namespace {

// The sequences of several tasks packed into one ragged batch. A single task's own buffers are
// used in place; several tasks' rows are copied once into shared buffers.
class PackedBatch {
 public:
  explicit PackedBatch(const std::vector<AttendTask*>& tasks) {
    const AttendWork& first = tasks.front()->work();
    d_model_ = first.model->config.attention.d_model;
    for (const AttendTask* task : tasks) {
      const AttendWork& work = task->work();
      AppendOffsets(work.query_lengths, &query_offsets_);
      if (work.cross_attention) AppendOffsets(work.memory_lengths, &memory_offsets_);
    }
    if (tasks.size() == 1) {
      query_ = first.query;
      memory_ = first.memory;
      mask_ = first.explicit_mask;
    } else {
      query_ = Concat(
          tasks, &owned_query_, [](const AttendWork& w) -> auto& { return w.query; });
      memory_ = Concat(
          tasks, &owned_memory_, [](const AttendWork& w) -> auto& { return w.memory; });
      mask_ = Concat(
          tasks, &owned_mask_, [](const AttendWork& w) -> auto& { return w.explicit_mask; });
    }
    inputs_.query = {.data = query_, .offsets = query_offsets_};
    if (first.cross_attention) {
      inputs_.memory = core::RaggedBatch{.data = memory_, .offsets = memory_offsets_};
    }
    inputs_.mask = {.causal = first.causal, .explicit_mask = mask_};
    inputs_.head_mask = {first.head_mask.data(), first.head_mask.size()};
  }

  const core::AttentionInputs& inputs() const { return inputs_; }
  int64_t rows() const { return inputs_.query.rows(); }
  int64_t sequences() const { return inputs_.query.num_sequences(); }
  int64_t d_model() const { return d_model_; }

 private:
  static void AppendOffsets(const std::vector<int64_t>& lengths, std::vector<int64_t>* offsets) {
    if (offsets->empty()) offsets->push_back(0);
    for (int64_t length : lengths) offsets->push_back(offsets->back() + length);
  }
  template <typename T, typename Field>
  static std::span<const T> Concat(const std::vector<AttendTask*>& tasks, std::vector<T>* out,
                                   Field field) {
    size_t total = 0;
    for (const AttendTask* task : tasks) total += field(task->work()).size();
    out->reserve(total);
    for (const AttendTask* task : tasks) {
      const auto& part = field(task->work());
      out->insert(out->end(), part.begin(), part.end());
    }
    return *out;
  }

  int64_t d_model_ = 0;
  std::vector<int64_t> query_offsets_, memory_offsets_;
  std::vector<float> owned_query_, owned_memory_;
  std::vector<uint8_t> owned_mask_;
  std::span<const float> query_, memory_;
  std::span<const uint8_t> mask_;
  core::AttentionInputs inputs_;
};

// Floating-point work of one forward pass, in MFLOP: the projections (QKV, or Q plus KV over the
// memory, and W_O) and the two attention products.
int64_t EstimatedMflop(const core::AttentionConfig& config, const core::AttentionInputs& in) {
  const double d = static_cast<double>(config.d_model);
  const double rows = static_cast<double>(in.query.rows());
  const double memory_rows = in.memory ? static_cast<double>(in.memory->rows()) : 0.0;
  double flops = 2.0 * rows * d * d * (in.memory ? 1.0 : 3.0) + 2.0 * memory_rows * d * 2.0 * d;
  if (config.HasOutputProjection()) flops += 2.0 * rows * d * d;
  flops += 4.0 * static_cast<double>(core::ScoreElements(in)) * d;
  return static_cast<int64_t>(flops / 1e6);
}

}  // namespace

BatchRunner::BatchRunner(const BatchRunnerOptions& options, batching::Clock* clock,
                         BatchListener listener)
    : options_(options),
      clock_(clock),
      listener_(std::move(listener)),
      budget_(options.compute_threads > 0 ? options.compute_threads : AvailableCores()) {}

core::AttentionExecutor& BatchRunner::ThreadExecutor(int threads) {
  // One executor per thread and team size: an executor caches oneDNN primitives and scratch and
  // is not thread-safe, and oneDNN primitives are built for the team size they run with.
  // Batch threads live as long as the scheduler.
  thread_local std::vector<std::unique_ptr<core::AttentionExecutor>> executors;
  if (executors.size() <= static_cast<size_t>(threads)) executors.resize(threads + 1);
  std::unique_ptr<core::AttentionExecutor>& executor = executors[threads];
  if (executor == nullptr) {
    executor = std::make_unique<core::AttentionExecutor>(
        core::ExecutorOptions{.compute_threads = threads});
  }
  return *executor;
}

void BatchRunner::Run(Batch batch) {
  std::vector<AttendTask*> tasks;
  tasks.reserve(batch.tasks.size());
  for (auto& task : batch.tasks) tasks.push_back(task.get());
  absl::Status status = RunTogether(tasks, batch.enqueue_us, /*retry=*/false);
  if (status.ok()) return;
  if (tasks.size() == 1) {
    tasks.front()->Finish(std::move(status));
    return;
  }
  // One bad request must not fail its neighbours: run each alone and answer it on its own.
  for (size_t i = 0; i < tasks.size(); ++i) {
    absl::Status alone = RunTogether({tasks[i]}, {batch.enqueue_us[i]}, /*retry=*/true);
    if (!alone.ok()) tasks[i]->Finish(std::move(alone));
  }
}

absl::Status BatchRunner::RunTogether(const std::vector<AttendTask*>& tasks,
                                      const std::vector<int64_t>& enqueue_us, bool retry) {
  PackedBatch packed(tasks);
  const core::AttentionLayer& layer = *tasks.front()->work().model->layer;
  const int64_t heads = layer.config().num_heads;
  const bool want_weights = tasks.front()->work().return_weights;
  // The batch's answers, shared by its results: each request's rows are handed over as a view,
  // and copied once, into its response. Not zeroed: the core writes every element.
  struct Buffers {
    std::unique_ptr<float[]> output, weights;
  };
  auto buffers = std::make_shared<Buffers>();
  const size_t output_size = static_cast<size_t>(packed.rows() * packed.d_model());
  const size_t weights_size =
      want_weights ? static_cast<size_t>(core::WeightsSize(layer.config(), packed.inputs())) : 0;
  buffers->output = std::make_unique_for_overwrite<float[]>(output_size);
  if (want_weights) buffers->weights = std::make_unique_for_overwrite<float[]>(weights_size);
  const std::span<float> output(buffers->output.get(), output_size);
  const std::span<float> weights(buffers->weights.get(), weights_size);

  const bool parallel =
      EstimatedMflop(layer.config(), packed.inputs()) >= options_.parallel_min_mflop;
  int64_t start_us, end_us;
  absl::Status status;
  {
    const ComputeGrant grant(budget_, parallel ? budget_.threads() : 1);
    start_us = clock_->NowMicros();
    status = ThreadExecutor(grant.threads())
                 .Forward(layer, packed.inputs(), {.output = output, .weights = weights});
    end_us = clock_->NowMicros();
  }
  std::vector<int64_t> queue_us(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    queue_us[i] = std::max<int64_t>(0, start_us - enqueue_us[i]);
  }
  // A warm-up pass runs alone: its batch key holds a model version that does not serve yet.
  if (listener_ && !tasks.front()->work().warm_up) {
    listener_({.model = tasks.front()->work().model->name,
               .sequences = packed.sequences(),
               .tokens = packed.rows(),
               .compute_us = end_us - start_us,
               .queue_us = retry ? std::span<const int64_t>() : queue_us});
  }
  if (!status.ok()) return status;

  const AttendTiming timing{.compute_us = end_us - start_us,
                            .batch_sequences = packed.sequences(),
                            .batch_tokens = packed.rows()};
  size_t output_at = 0, weights_at = 0;
  int64_t sequence_at = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const AttendWork& work = tasks[i]->work();
    AttendResult result{.storage = buffers, .timing = timing};
    result.output = output.subspan(output_at, work.query.size());
    output_at += work.query.size();
    if (want_weights) {
      const int64_t end = sequence_at + work.sequences();
      const auto size =
          static_cast<size_t>(heads * core::ScoreElements(packed.inputs(), sequence_at, end));
      result.weights = weights.subspan(weights_at, size);
      weights_at += size;
    }
    sequence_at += work.sequences();
    result.timing.queue_us = queue_us[i];
    tasks[i]->Finish(std::move(result));
  }
  return absl::OkStatus();
}

}  // namespace attnserve::server
