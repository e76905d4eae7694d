#include "core/forward/onednn_support.h"

#include "absl/strings/str_cat.h"

namespace attnserve::core {

const dnnl::engine& CpuEngine() {
  static const dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

absl::Status OneDnnError(const dnnl::error& e, const char* context) {
  return absl::InternalError(
      absl::StrCat(context, ": oneDNN status ", static_cast<int>(e.status), ": ", e.what()));
}

ExecArgs MakeExecArgs(std::initializer_list<std::pair<int, const dnnl::memory*>> args) {
  ExecArgs result;
  result.reserve(args.size());
  for (const auto& [arg, memory] : args) result.push_back({arg, memory->get()});
  return result;
}

void Execute(const dnnl::primitive& primitive, const dnnl::stream& stream, const ExecArgs& args) {
  dnnl::error::wrap_c_api(dnnl_primitive_execute(primitive.get(), stream.get(),
                                                 static_cast<int>(args.size()), args.data()),
                          "could not execute a primitive");
}

std::string OneDnnVersion() {
  const dnnl_version_t* v = dnnl::version();
  return absl::StrCat(v->major, ".", v->minor, ".", v->patch);
}

std::string OneDnnIsa() {
  using isa = dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case isa::sse41:
      return "sse41";
    case isa::avx:
      return "avx";
    case isa::avx2:
      return "avx2";
    case isa::avx512_mic:
      return "avx512_mic";
    case isa::avx512_mic_4ops:
      return "avx512_mic_4ops";
    case isa::avx512_core:
      return "avx512_core";
    case isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case isa::avx512_core_amx:
      return "avx512_core_amx";
    case isa::avx2_vnni:
      return "avx2_vnni";
    default:
      return "default";
  }
}

bool HasNativeBf16() {
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
}

bool HasBf16Kernels() {
  using isa = dnnl::cpu_isa;
  const isa found = dnnl::get_effective_cpu_isa();
  return found == isa::avx512_core || found == isa::avx512_core_vnni ||
         found == isa::avx512_core_bf16 || found == isa::avx512_core_amx;
}

absl::Status CheckComputeTypeSupported(ComputeType compute_type, bool allow_emulation,
                                       const std::string& what) {
  if (compute_type != ComputeType::kBFloat16 || HasNativeBf16()) return absl::OkStatus();
  if (allow_emulation && HasBf16Kernels()) return absl::OkStatus();
  if (allow_emulation) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": compute_dtype bf16: oneDNN ", OneDnnVersion(),
                     " has no bf16 matmul on this CPU's ISA ", OneDnnIsa(),
                     " (needs avx512_core or later); use compute_dtype \"fp32\""));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      what,
      ": compute_dtype bf16 needs native bf16 (oneDNN ISA avx512_core_bf16 or "
      "avx512_core_amx), but this CPU's oneDNN ISA is ",
      OneDnnIsa(),
      ", where oneDNN would emulate bf16 slower than fp32; use compute_dtype \"fp32\", or allow "
      "emulation (--allow-bf16-emulation)"));
}

}  // namespace attnserve::core
