// AlignedBuffer: a 64-byte-aligned scratch array of floats that grows to the largest size asked
// for and gives it back when recent use no longer needs it.
//
// Not thread-safe. Reserve() may discard the contents; once the largest size has been seen it
// never allocates again, which keeps the compute path free of heap traffic after warm-up.
// EndWindow(), called by the owner every so many uses, frees storage more than twice the size
// the window's largest Reserve() asked for: a server's batch scratch would otherwise stay at the
// size of the largest batch since start (a rare burst of thousands of rows: tens of MiB per
// buffer) for the rest of the process's life.
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
    if (count > window_peak_) window_peak_ = count;
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

  // Ends a window of uses: frees the storage if it holds at least kMinReleaseBytes and more than
  // twice the largest Reserve() since the previous call (the next Reserve() allocates what is
  // needed then), and starts the next window. Between the halving and the doubling, steady use
  // never reallocates. Returns whether it freed.
  static constexpr size_t kMinReleaseBytes = size_t{1} << 20;
  bool EndWindow() {
    const size_t peak = window_peak_;
    window_peak_ = 0;
    if (capacity_ * sizeof(float) < kMinReleaseBytes || capacity_ <= 2 * peak) return false;
    data_.reset();
    capacity_ = 0;
    return true;
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data_;
  size_t capacity_ = 0;
  size_t window_peak_ = 0;  // Largest Reserve() count since the last EndWindow().
};

// Counts an owner's uses of its buffers and says when a window ends (when to call EndWindow()):
// every `uses_per_window` uses; never if it is 0 or less. Not thread-safe.
class ScratchWindow {
 public:
  explicit ScratchWindow(int uses_per_window) : uses_per_window_(uses_per_window) {}

  // Counts one use; true when it completes a window (the count then starts again).
  bool CountUse() {
    if (uses_per_window_ <= 0 || ++uses_ < uses_per_window_) return false;
    uses_ = 0;
    return true;
  }

 private:
  int uses_per_window_;
  int uses_ = 0;
};

}  // namespace attnserve::core

#endif  // ATTNSERVE_CORE_UTIL_ALIGNED_BUFFER_H_
