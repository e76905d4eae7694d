// Text forms of tensors for attnserve-cli's reports: a shape as "[5, 16]" and a short summary
// (shape, the first values of the first rows) that fits a terminal.
//
// Stateless functions, thread-safe.
#ifndef ATTNSERVE_CLIENT_CLI_TENSOR_TEXT_H_
#define ATTNSERVE_CLIENT_CLI_TENSOR_TEXT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "attnserve/client/types.h"

namespace attnserve::cli {

std::string ShapeText(const std::vector<int64_t>& shape);

// "`what` [shape]" then the first values of the first rows (rows = the last dimension's runs).
void PrintSummary(const client::Tensor& tensor, const std::string& what, std::ostream& out);

}  // namespace attnserve::cli

#endif  // ATTNSERVE_CLIENT_CLI_TENSOR_TEXT_H_
