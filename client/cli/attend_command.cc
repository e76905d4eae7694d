#include "client/cli/attend_command.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/npy.h"
#include "client/cli/random_values.h"
#include "client/cli/tensor_text.h"

namespace attnserve::cli {

absl::Status AttendCommand(client::Client& client, const AttendCommandOptions& options,
                           std::ostream& out) {
  if (options.input_path.empty() == (options.random_length == 0)) {
    return absl::InvalidArgumentError("give exactly one of --input FILE.npy and --random T");
  }
  client::Tensor input;
  if (!options.input_path.empty()) {
    absl::StatusOr<client::Tensor> read = ReadNpy(options.input_path);
    if (!read.ok()) return read.status();
    input = *std::move(read);
    if (input.shape.size() != 2 && input.shape.size() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.input_path, ": expected a [T, D] or [B, T, D] array, got shape ",
                       ShapeText(input.shape)));
    }
  } else {
    if (options.random_length < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--random: expected T >= 1, got ", options.random_length));
    }
    absl::StatusOr<client::ModelInfo> info = client.GetModel(options.model);
    if (!info.ok()) return info.status();
    input.shape = {options.random_length, info->d_model};
    input.data =
        RandomValues(static_cast<size_t>(options.random_length * info->d_model), options.seed);
  }

  client::AttendOptions attend;
  attend.mask = options.causal ? client::Mask::kCausal : client::Mask::kNone;
  attend.return_weights = options.weights || !options.weights_path.empty();
  attend.deadline = options.deadline;
  attend.wire_dtype = options.wire_dtype;
  attend.answer_wire_dtype = options.wire_dtype;
  absl::StatusOr<client::AttendResult> result = client.Attend(options.model, input.view(), attend);
  if (!result.ok()) return result.status();

  out << "model " << result->model << " (version " << result->model_version << ")\n";
  if (options.output_path.empty()) {
    PrintSummary(result->output, "output", out);
  } else {
    absl::Status written = WriteNpy(options.output_path, result->output.data, result->output.shape);
    if (!written.ok()) return written;
    out << "output " << ShapeText(result->output.shape) << " written to " << options.output_path
        << "\n";
  }
  if (result->weights.has_value()) {
    if (options.weights_path.empty()) {
      PrintSummary(*result->weights, "weights", out);
    } else {
      absl::Status written =
          WriteNpy(options.weights_path, result->weights->data, result->weights->shape);
      if (!written.ok()) return written;
      out << "weights " << ShapeText(result->weights->shape) << " written to "
          << options.weights_path << "\n";
    }
  }
  out << absl::StrFormat(
      "timing: queue %d us, compute %d us, batch of %d sequences / %d tokens; latency %.3f ms\n",
      result->timing.queue_us, result->timing.compute_us, result->timing.batch_sequences,
      result->timing.batch_tokens, static_cast<double>(result->latency.count()) / 1000.0);
  return absl::OkStatus();
}

}  // namespace attnserve::cli
