#include "client/cli/tensor_text.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace attnserve::cli {
namespace {

// How many leading values of each printed row are shown: enough to eyeball, short enough for
// one terminal line.
constexpr size_t kShownValues = 6;
constexpr size_t kShownRows = 3;

}  // namespace

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

void PrintSummary(const client::Tensor& tensor, const std::string& what, std::ostream& out) {
  out << what << " " << ShapeText(tensor.shape) << "\n";
  const size_t width = tensor.shape.empty() ? 0 : static_cast<size_t>(tensor.shape.back());
  if (width == 0) return;
  const size_t rows = tensor.data.size() / width;
  for (size_t row = 0; row < std::min(rows, kShownRows); ++row) {
    std::string line = absl::StrFormat("  row %d:", row);
    for (size_t i = 0; i < std::min(width, kShownValues); ++i) {
      absl::StrAppendFormat(&line, " %+.6f", tensor.data[row * width + i]);
    }
    if (width > kShownValues) line += " ...";
    out << line << "\n";
  }
  if (rows > kShownRows) out << "  ... (" << rows - kShownRows << " more rows)\n";
}

}  // namespace attnserve::cli
