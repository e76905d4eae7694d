// KvElementType: the element type a paged KV cache stores K and V in, and the type of a run of keys
// the decode kernel reads (paged_attention.h). bf16 is the top 16 bits of an IEEE fp32 (widened
// exactly by a 16-bit shift), so a bf16 cache holds twice the tokens per byte and a decode step,
// which is bound by reading K and V, reads half the bytes. int8 halves them again: each token's
// row of one head is stored as int8 with one scale (Int8Scale), so that value ≈ int8 · scale.
//
// Plain values; thread-safe.
#ifndef ATTNSERVE_CORE_KV_CACHE_KV_ELEMENT_TYPE_H_
#define ATTNSERVE_CORE_KV_CACHE_KV_ELEMENT_TYPE_H_

#include <cstdint>

namespace attnserve::core {

enum class KvElementType : uint8_t {
  kFloat32,   // float.
  kBFloat16,  // uint16_t holding the top half of a float, rounded to nearest even.
  // int8_t in [-127, 127], times a per-(token, head) scale stored as a bf16 (uint16_t).
  kInt8,
};

// 4, 2 or 1.
constexpr int64_t ElementBytes(KvElementType type) {
  switch (type) {
    case KvElementType::kBFloat16:
      return 2;
    case KvElementType::kInt8:
      return 1;
    default:
      return 4;
  }
}

// "float32", "bfloat16" or "int8".
constexpr const char* KvElementTypeName(KvElementType type) {
  switch (type) {
    case KvElementType::kBFloat16:
      return "bfloat16";
    case KvElementType::kInt8:
      return "int8";
    default:
      return "float32";
  }
}

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_KV_CACHE_KV_ELEMENT_TYPE_H_
