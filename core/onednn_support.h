// Process-wide oneDNN plumbing shared by the core: the CPU engine, error conversion, and the
// library facts (version, ISA) that logs and metrics report.
#ifndef ATTNSERVE_CORE_ONEDNN_SUPPORT_H_
#define ATTNSERVE_CORE_ONEDNN_SUPPORT_H_

#include <string>

#include <dnnl.hpp>

#include "absl/status/status.h"

namespace attnserve::core {

// The single CPU engine every primitive and memory in the process uses. Thread-safe.
const dnnl::engine& CpuEngine();

// Converts a oneDNN exception into an Internal status with `context` and oneDNN's message.
absl::Status OneDnnError(const dnnl::error& e, const char* context);

// "2.6.3", from the library actually loaded.
std::string OneDnnVersion();

// The instruction set oneDNN dispatches to on this machine, e.g. "avx512_core_bf16".
std::string OneDnnIsa();

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_ONEDNN_SUPPORT_H_
