#include "client/cli/model_commands.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attnserve::cli {
namespace {

// Left-aligned columns as wide as their widest cell, two spaces apart.
void PrintTable(const std::vector<std::vector<std::string>>& rows, std::ostream& out) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line.append(widths[i] - row[i].size() + 2, ' ');
    }
    out << line << "\n";
  }
}

const char* YesNo(bool value) { return value ? "yes" : "no"; }

}  // namespace

absl::Status ListModelsCommand(client::Client& client, std::ostream& out) {
  absl::StatusOr<std::vector<client::ModelInfo>> models = client.ListModels();
  if (!models.ok()) return models.status();
  std::vector<std::vector<std::string>> rows = {{"NAME", "VERSION", "D_MODEL", "HEADS", "VARIANT",
                                                 "BIAS", "DTYPE", "PARAMS", "MAX_SEQ", "SOURCE"}};
  for (const client::ModelInfo& model : *models) {
    rows.push_back({model.is_default ? model.name + " *" : model.name, absl::StrCat(model.version),
                    absl::StrCat(model.d_model), absl::StrCat(model.num_heads), model.variant,
                    YesNo(model.bias), model.dtype, absl::StrCat(model.parameter_count),
                    absl::StrCat(model.max_sequence_length), model.source});
  }
  PrintTable(rows, out);
  out << models->size() << (models->size() == 1 ? " model" : " models")
      << " (* = the default model)\n";
  return absl::OkStatus();
}

absl::Status InfoCommand(client::Client& client, const std::string& model, std::ostream& out) {
  absl::StatusOr<client::ModelInfo> info = client.GetModel(model);
  if (!info.ok()) return info.status();
  PrintTable({{"name:", info->name},
              {"version:", absl::StrCat(info->version)},
              {"default:", YesNo(info->is_default)},
              {"d_model:", absl::StrCat(info->d_model)},
              {"num_heads:", absl::StrCat(info->num_heads)},
              {"variant:", info->variant},
              {"bias:", YesNo(info->bias)},
              {"dtype:", info->dtype},
              {"kv_cache_dtype:", info->kv_cache_dtype},
              {"parameter_count:", absl::StrCat(info->parameter_count)},
              {"max_sequence_length:", absl::StrCat(info->max_sequence_length)},
              {"source:", info->source},
              {"max_batch_sequences:", absl::StrCat(info->batching.max_batch_sequences)},
              {"max_batch_tokens:", absl::StrCat(info->batching.max_batch_tokens)},
              {"max_queue_delay_us:", absl::StrCat(info->batching.max_queue_delay_us)},
              {"max_queue_size:", absl::StrCat(info->batching.max_queue_size)},
              {"max_queued_bytes:", absl::StrCat(info->batching.max_queued_bytes)},
              {"server_version:", info->server_version}},
             out);
  return absl::OkStatus();
}

absl::Status HealthCommand(client::Client& client, const std::string& service, bool quiet,
                           std::ostream& out) {
  const absl::Status status = client.Health(service);
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("not serving", service.empty() ? "" : " (" + service + ")",
                                     ": ", status.message()));
  }
  if (!quiet) out << "SERVING\n";
  return absl::OkStatus();
}

}  // namespace attnserve::cli
