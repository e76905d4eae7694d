#include "server/conversion/attnserve_v1/decode_conversion.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/util/echo.h"
#include "server/conversion/attnserve_v1/conversion_internal.h"

namespace attnserve::server {
namespace {

using conversion_internal::Invalid;

// A hostile stream may hold many sessions: errors list only the first few tags.
constexpr size_t kMaxShownTags = 8;

std::string Item(absl::string_view field, int index) {
  return absl::StrCat(field, "[", index, "]");
}

std::string OpenTags(const DecodeSessionTags& tags) {
  std::vector<std::string> names;
  for (const auto& [tag, session] : tags) {
    if (!session.closed) names.push_back(absl::StrCat("\"", EchoForMessage(tag), "\""));
  }
  if (names.empty()) return "none are open";
  std::sort(names.begin(), names.end());
  const size_t shown = std::min(names.size(), kMaxShownTags);
  std::string text =
      absl::StrCat("open: ", absl::StrJoin(names.begin(), names.begin() + shown, ", "));
  if (names.size() > shown) absl::StrAppend(&text, ", ... (", names.size(), " in all)");
  return text;
}

}  // namespace

absl::StatusOr<decoding::SessionSpec> ParseDecodeOpen(const v1::DecodeRequest& request, int index,
                                                      std::shared_ptr<const model::Model> model,
                                                      decoding::OwnerKey owner,
                                                      const DecodeSessionTags& tags) {
  const v1::DecodeOpen& open = request.opens(index);
  const std::string item = Item("opens", index);
  if (open.session().empty()) {
    return Invalid(item, ".session: expected a non-empty tag naming the session, got \"\"");
  }
  if (const auto it = tags.find(open.session()); it != tags.end() && !it->second.closed) {
    return Invalid(item, ".session: expected a tag not open on this stream, got \"",
                   EchoForMessage(open.session()), "\" (already open)");
  }
  if (open.expected_version() != 0 && open.expected_version() != model->version) {
    return absl::FailedPreconditionError(
        absl::StrCat(item, ".expected_version: expected the served version ", model->version,
                     " of model \"", model->name, "\", got ", open.expected_version()));
  }
  decoding::SessionSpec spec;
  spec.owner = owner;
  if (open.has_memory()) {
    absl::StatusOr<std::vector<float>> memory = conversion_internal::DecodeRows(
        absl::StrCat(item, ".memory"), open.memory(), model->config.attention.d_model, "d_model");
    if (!memory.ok()) return memory.status();
    spec.memory = *std::move(memory);
  }
  spec.model = std::move(model);
  return spec;
}

absl::StatusOr<DecodeStreamSession> FindDecodeSession(const v1::DecodeRequest& request,
                                                      absl::string_view field, int index,
                                                      const DecodeSessionTags& tags) {
  const std::string& tag =
      field == "steps" ? request.steps(index).session() : request.closes(index).session();
  const auto it = tags.find(tag);
  if (it != tags.end() && it->second.closed) {
    return absl::NotFoundError(absl::StrCat(
        Item(field, index), ".session: session \"", EchoForMessage(tag),
        "\" was closed by the server (", std::string(decoding::CloseReasonName(*it->second.closed)),
        "); open it again"));
  }
  if (it != tags.end()) return it->second;
  return Invalid(Item(field, index), ".session: expected a session open on this stream (",
                 OpenTags(tags), "), got \"", EchoForMessage(tag), "\"");
}

absl::StatusOr<decoding::StepRequest> ParseDecodeStep(const v1::DecodeRequest& request, int index,
                                                      const DecodeStreamSession& session) {
  const v1::DecodeStep& step = request.steps(index);
  const std::string item = Item("steps", index);
  if (!step.has_rows()) {
    return Invalid(item, ".rows: expected a [rows, d_model] tensor, got none");
  }
  if (auto s = conversion_internal::CheckOutputDtype(absl::StrCat(item, ".raw_output_dtype"),
                                                     step.raw_output(), step.raw_output_dtype());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::vector<float>> rows = conversion_internal::DecodeRows(
      absl::StrCat(item, ".rows"), step.rows(), session.model->config.attention.d_model, "d_model");
  if (!rows.ok()) return rows.status();
  decoding::StepRequest out;
  out.session = session.id;
  out.rows = *std::move(rows);
  return out;
}

DecodeOutputFormat DecodeStepOutputFormat(const v1::DecodeRequest& request, int index) {
  const v1::DecodeStep& step = request.steps(index);
  DecodeOutputFormat format;
  format.raw_output = step.raw_output();
  format.raw_format =
      conversion_internal::FormatOf(step.raw_output_dtype()).value_or(FloatFormat::kFloat32);
  return format;
}

void FillDecodeStepOutput(std::span<const float> rows, int64_t d_model, DecodeOutputFormat format,
                          v1::DecodeStepResult* result) {
  v1::Tensor* output = result->mutable_output();
  output->Clear();
  output->add_shape(d_model > 0 ? static_cast<int64_t>(rows.size()) / d_model : 0);
  output->add_shape(d_model);
  conversion_internal::AssignFloats(rows, format.raw_output, format.raw_format, output);
}

void FillDecodeError(const absl::Status& status, v1::ErrorStatus* error) {
  conversion_internal::FillErrorStatus(status, error);
}

}  // namespace attnserve::server
