// AlignedBuffer: a grow-only, 64-byte-aligned scratch array of floats.
//
// Not thread-safe. Reserve() may discard the contents; once the largest size has been seen it
// never allocates again, which keeps the compute path free of heap traffic after warm-up.
#ifndef ATTNSERVE_CORE_UTIL_ALIGNED_BUFFER_H_
#define ATTNSERVE_CORE_UTIL_ALIGNED_BUFFER_H_

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace attnserve::core {

class AlignedBuffer {
 public:
  // 64 bytes: one cache line, one AVX-512 register.
  static constexpr size_t kAlignment = 64;

  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t count) { Reserve(count); }

  // Returns storage for at least `count` floats. Contents are unspecified after a growth.
  // Throws std::bad_alloc only when the system is out of memory.
  float* Reserve(size_t count) {
    if (count > capacity_) {
      const size_t bytes = (count * sizeof(float) + kAlignment - 1) / kAlignment * kAlignment;
      void* p = std::aligned_alloc(kAlignment, bytes);
      if (p == nullptr) throw std::bad_alloc();
      data_.reset(static_cast<float*>(p));
      capacity_ = bytes / sizeof(float);
    }
    return data_.get();
  }

  float* data() const { return data_.get(); }
  size_t capacity() const { return capacity_; }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  size_t capacity_ = 0;
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_UTIL_ALIGNED_BUFFER_H_
