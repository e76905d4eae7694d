// KvElementType: the element type a paged KV cache stores K and V in, and the type of a run of keys
// the decode kernel reads (paged_attention.h). bf16 is the top 16 bits of an IEEE fp32 (widened
// exactly by a 16-bit shift), so a bf16 cache holds twice the tokens per byte and a decode step,
// which is bound by reading K and V, reads half the bytes.
//
// Plain values; thread-safe.
#ifndef ATTNSERVE_CORE_KV_CACHE_KV_ELEMENT_TYPE_H_
#define ATTNSERVE_CORE_KV_CACHE_KV_ELEMENT_TYPE_H_

#include <cstdint>

namespace attnserve::core {

enum class KvElementType : uint8_t {
  kFloat32,   // float.
  kBFloat16,  // uint16_t holding the top half of a float, rounded to nearest even.
};

// 4 or 2.
constexpr int64_t ElementBytes(KvElementType type) {
  return type == KvElementType::kBFloat16 ? 2 : 4;
}

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_KV_CACHE_KV_ELEMENT_TYPE_H_
