// Process-wide oneDNN plumbing shared by the core: the CPU engine, error conversion, and the
// library facts (version, ISA) that logs and metrics report.
#ifndef ATTNSERVE_CORE_FORWARD_ONEDNN_SUPPORT_H_
#define ATTNSERVE_CORE_FORWARD_ONEDNN_SUPPORT_H_

#include <dnnl.hpp>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/forward/attention_config.h"

namespace attnserve::core {

// The single CPU engine every primitive and memory in the process uses. Thread-safe.
const dnnl::engine& CpuEngine();

// Converts a oneDNN exception into an Internal status with `context` and oneDNN's message.
absl::Status OneDnnError(const dnnl::error& e, const char* context);

// A primitive's arguments, built once when the primitive is created. The memory objects must
// outlive it; swap their data handles between calls.
using ExecArgs = std::vector<dnnl_exec_arg_t>;
ExecArgs MakeExecArgs(std::initializer_list<std::pair<int, const dnnl::memory*>> args);

// Runs `primitive` through the C API with a pre-built argument array. The C++ overload that takes
// an unordered_map copies it into a new vector on every call; this one allocates nothing in
// attnserve's code. Throws dnnl::error like the C++ API.
void Execute(const dnnl::primitive& primitive, const dnnl::stream& stream, const ExecArgs& args);

// "2.6.3", from the library actually loaded.
std::string OneDnnVersion();

// The instruction set oneDNN dispatches to on this machine, e.g. "avx512_core_bf16".
std::string OneDnnIsa();

// Whether oneDNN's ISA has native bf16 arithmetic (avx512_core_bf16 or avx512_core_amx); below
// that oneDNN emulates bf16 matmuls, slower than fp32. Honours ONEDNN_MAX_CPU_ISA /
// DNNL_MAX_CPU_ISA, which oneDNN reads once, at its first use in the process.
bool HasNativeBf16();
// Whether oneDNN 2.6 has bf16 matmul kernels at all here (avx512_core and up, emulated below
// avx512_core_bf16); below avx512_core a bf16 layer cannot be built.
bool HasBf16Kernels();

// OK when `compute_type` can run at full speed here, or when `allow_emulation` and oneDNN can
// emulate it; otherwise FailedPrecondition naming the ISA found and the remedies. `what`
// prefixes the message.
absl::Status CheckComputeTypeSupported(ComputeType compute_type, bool allow_emulation,
                                       const std::string& what);

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_FORWARD_ONEDNN_SUPPORT_H_
