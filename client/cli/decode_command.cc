#include "client/cli/decode_command.h"

#include <algorithm>
#include <optional>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/load_stats.h"
#include "client/cli/npy.h"
#include "client/cli/random_values.h"
#include "client/cli/tensor_text.h"

namespace attnserve::cli {
namespace {

using Clock = load::LoadClock;

// A [rows, d_model] tensor from `path` (checked) or `rows` random rows from `seed`.
absl::StatusOr<client::Tensor> RowsFrom(const std::string& path, int64_t rows, int64_t d_model,
                                        uint64_t seed, const char* what) {
  client::Tensor tensor;
  if (!path.empty()) {
    absl::StatusOr<client::Tensor> read = ReadNpy(path);
    if (!read.ok()) return read.status();
    tensor = *std::move(read);
    if (tensor.shape.size() != 2 || tensor.shape[0] < 1 || tensor.shape[1] != d_model) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": expected a ", what, " of shape [rows, ", d_model,
                       "] (rows >= 1), got ", ShapeText(tensor.shape)));
    }
    return tensor;
  }
  tensor.shape = {rows, d_model};
  tensor.data = RandomValues(static_cast<size_t>(rows * d_model), seed);
  return tensor;
}

absl::Status Validate(const DecodeCommandOptions& options) {
  if (options.prompt_path.empty() == (options.prompt_rows == 0)) {
    return absl::InvalidArgumentError("give exactly one of --prompt FILE.npy and --prompt-rows T");
  }
  if (options.prompt_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompt-rows: expected T >= 1, got ", options.prompt_rows));
  }
  if (!options.memory_path.empty() && options.memory_rows != 0) {
    return absl::InvalidArgumentError("give at most one of --memory FILE.npy and --memory-rows S");
  }
  if (options.memory_rows < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--memory-rows: expected S >= 1, got ", options.memory_rows));
  }
  if (options.steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--steps: expected >= 0, got ", options.steps));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeCommand(client::Client& client, const DecodeCommandOptions& options,
                           std::ostream& out) {
  if (absl::Status valid = Validate(options); !valid.ok()) return valid;
  absl::StatusOr<client::ModelInfo> info = client.GetModel(options.model);
  if (!info.ok()) return info.status();
  const int64_t d = info->d_model;
  absl::StatusOr<client::Tensor> prompt =
      RowsFrom(options.prompt_path, options.prompt_rows, d, options.seed, "prompt");
  if (!prompt.ok()) return prompt.status();
  std::optional<client::Tensor> memory;
  if (!options.memory_path.empty() || options.memory_rows > 0) {
    absl::StatusOr<client::Tensor> read =
        RowsFrom(options.memory_path, options.memory_rows, d, options.seed + 1, "memory");
    if (!read.ok()) return read.status();
    memory = *std::move(read);
  }
  const std::vector<float> step_rows =
      RandomValues(static_cast<size_t>(options.steps * d), options.seed + 2);

  client::DecodeOpen open{.session = "cli", .model = options.model};
  if (memory) open.memory = memory->view();
  absl::StatusOr<std::unique_ptr<client::DecodeSession>> session = client.OpenDecodeSession(
      open, {.wire_dtype = options.wire_dtype, .answer_wire_dtype = options.wire_dtype});
  if (!session.ok()) return session.status();
  out << "model " << (*session)->opened().model << " (version "
      << (*session)->opened().model_version << "), "
      << (memory ? absl::StrCat("cross-attention over ", memory->shape[0], " memory rows")
                 : std::string("causal self-attention"))
      << "\n";

  const Clock::time_point prefill_start = Clock::now();
  absl::StatusOr<client::Tensor> prompt_out = (*session)->Step(prompt->view());
  const double prefill_ms = load::MillisBetween(prefill_start, Clock::now());
  if (!prompt_out.ok()) return prompt_out.status();

  client::Tensor steps_out{.data = {}, .shape = {options.steps, d}};
  std::vector<double> step_ms;
  for (int64_t i = 0; i < options.steps; ++i) {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<client::Tensor> row = (*session)->Step(
        {std::span<const float>(step_rows.data() + i * d, static_cast<size_t>(d)), {1, d}});
    step_ms.push_back(load::MillisBetween(start, Clock::now()));
    if (!row.ok()) return row.status();
    steps_out.data.insert(steps_out.data.end(), row->data.begin(), row->data.end());
  }
  if (absl::Status closed = (*session)->Close(); !closed.ok()) return closed;

  if (options.output_path.empty()) {
    PrintSummary(*prompt_out, "prompt output", out);
    if (options.steps > 0) PrintSummary(steps_out, "step outputs", out);
  } else {
    client::Tensor all{.data = prompt_out->data, .shape = {prompt->shape[0] + options.steps, d}};
    all.data.insert(all.data.end(), steps_out.data.begin(), steps_out.data.end());
    if (absl::Status written = WriteNpy(options.output_path, all.data, all.shape); !written.ok()) {
      return written;
    }
    out << "outputs " << ShapeText(all.shape) << " (prompt then steps) written to "
        << options.output_path << "\n";
  }
  out << absl::StrFormat("prefill: %d rows in %.3f ms\n", prompt->shape[0], prefill_ms);
  if (!step_ms.empty()) {
    double sum = 0;
    for (double ms : step_ms) sum += ms;
    std::sort(step_ms.begin(), step_ms.end());
    out << absl::StrFormat(
        "steps: %d one-row steps, latency p50 %.3f ms, p99 %.3f ms, mean %.3f ms\n", options.steps,
        load::Percentile(step_ms, 0.5), load::Percentile(step_ms, 0.99),
        sum / static_cast<double>(step_ms.size()));
  }
  return absl::OkStatus();
}

}  // namespace attnserve::cli
