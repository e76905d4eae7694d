#include "tools/model_commands.h"

#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/forward/attention_batch.h"
#include "core/forward/attention_executor.h"
#include "core/forward/attention_weights.h"
#include "core/model/model.h"
#include "core/model/model_config.h"
#include "core/model/model_writer.h"

namespace attnserve::tools {
namespace {

std::string Describe(const core::AttentionConfig& c) {
  return absl::StrCat("d_model ", c.d_model, ", ", c.num_heads, " heads, ",
                      std::string(core::VariantName(c.variant)), c.bias ? ", bias" : ", no bias",
                      ", ", c.ParameterCount(), " parameters");
}

absl::Status CheckGenerateOptions(const GenerateOptions& options) {
  if (!model::IsValidModelName(options.name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--name \"", options.name,
                     "\": expected a folder name (non-empty, no '/', not starting with '.')"));
  }
  if (options.dtype != model::TensorDtype::kF32 && options.dtype != model::TensorDtype::kF16 &&
      options.dtype != model::TensorDtype::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("--dtype: expected f32, f16 or bf16, got ",
                                                   std::string(model::DtypeName(options.dtype))));
  }
  return options.config.Validate();
}

// Runs `m` once on two short sequences (7 and 5 rows of values in [-1, 1]), so that `check` also
// proves the weights produce finite outputs on this machine's kernels. Returns the time taken,
// which includes creating the oneDNN primitives for these shapes.
absl::StatusOr<absl::Duration> TrialForward(const model::Model& m) {
  const int64_t d = m.config.attention.d_model;
  const std::vector<int64_t> offsets = {0, 7, 12};
  std::vector<float> input(12 * d), output(12 * d);
  for (size_t i = 0; i < input.size(); ++i) {
    input[i] = static_cast<float>((i * 7919) % 2001) / 1000.f - 1.f;
  }
  core::AttentionExecutor executor;
  const absl::Time start = absl::Now();
  absl::Status status = executor.Forward(*m.layer, {.query = {.data = input, .offsets = offsets}},
                                         {.output = output});
  if (!status.ok()) return status;
  return absl::Now() - start;
}

}  // namespace

absl::Status GenerateModel(const GenerateOptions& options, std::ostream& out) {
  if (absl::Status s = CheckGenerateOptions(options); !s.ok()) return s;
  const std::filesystem::path folder = options.repository / options.name;
  std::error_code ec;
  const bool exists = std::filesystem::exists(folder / model::kConfigFileName, ec);
  if (ec) return absl::InternalError(absl::StrCat(folder.string(), ": ", ec.message()));
  if (exists && !options.overwrite) {
    return absl::AlreadyExistsError(
        absl::StrCat(folder.string(), " already holds a model; pass --force to replace it"));
  }

  model::ModelConfig config;
  config.attention = options.config;
  if (absl::Status s = model::WriteModelFolder(
          folder, config, core::MakeRandomWeights(options.config, options.seed), options.naming,
          options.dtype,
          {{"format", "attnserve"},
           {"naming", std::string(model::NamingName(options.naming))},
           {"seed", absl::StrCat(options.seed)}});
      !s.ok()) {
    return s;
  }
  out << "wrote " << folder.string() << ": " << Describe(options.config) << ", "
      << model::NamingName(options.naming) << " naming, " << model::DtypeName(options.dtype)
      << ", seed " << options.seed << "\n";
  return absl::OkStatus();
}

absl::Status CheckModel(const std::filesystem::path& folder, std::ostream& out) {
  absl::StatusOr<std::shared_ptr<const model::Model>> loaded = model::LoadModelFolder(folder);
  if (!loaded.ok()) return loaded.status();
  const model::Model& m = **loaded;
  out << "model " << m.name << " (" << folder.string() << "): OK\n"
      << "  config: " << Describe(m.config.attention) << ", compute "
      << core::ComputeTypeName(m.config.attention.compute_type) << "\n"
      << "  weights: " << m.weight_naming << " naming, " << m.file_dtype
      << (m.config.weights_sha256 ? ", SHA-256 verified"
                                  : ", not verified (config.json has no weights_sha256)")
      << "\n"
      << "  config.json: "
      << absl::StrReplaceAll(absl::StripTrailingAsciiWhitespace(model::ModelConfigToJson(m.config)),
                             {{"\n", "\n  "}})
      << "\n";
  // The load above validated the file; this second read only lists it.
  absl::StatusOr<model::SafetensorsFile> file =
      model::SafetensorsFile::Open(folder / model::kWeightsFileName);
  if (!file.ok()) return file.status();
  out << absl::StrFormat("  %-20s %-5s %-14s %12s\n", "tensor", "dtype", "shape", "bytes");
  for (const model::TensorView& t : file->index().tensors) {
    out << absl::StrFormat("  %-20s %-5s %-14s %12d\n", t.name, std::string(DtypeName(t.dtype)),
                           model::FormatShape(t.shape), t.bytes.size());
  }
  absl::StatusOr<absl::Duration> trial = TrialForward(m);
  if (!trial.ok()) {
    return absl::Status(
        trial.status().code(),
        absl::StrCat(folder.string(), ": trial forward pass failed: ", trial.status().message()));
  }
  out << absl::StrFormat(
      "  trial forward (2 sequences, 12 rows): outputs finite, %.1f ms with primitive creation\n",
      absl::ToDoubleMilliseconds(*trial));
  return absl::OkStatus();
}

absl::Status ListModels(const repository::ModelRepositoryOptions& options, std::ostream& out) {
  absl::StatusOr<std::unique_ptr<repository::ModelRepository>> repo =
      repository::ModelRepository::Open(options);
  if (!repo.ok()) return repo.status();
  int failed = 0;
  for (const repository::ModelState& state : (*repo)->States()) {
    if (state.serving) {
      out << state.name << "  v" << state.serving->version << "  "
          << Describe(state.serving->config.attention) << "  (" << state.serving->source << ")\n";
    }
    if (!state.last_error.ok()) {
      ++failed;
      out << state.name << "  FAILED: " << state.last_error.message() << "\n";
    }
  }
  if (failed > 0) {
    return absl::FailedPreconditionError(absl::StrCat(failed, " model(s) failed to load"));
  }
  return absl::OkStatus();
}

}  // namespace attnserve::tools
