// The bytes the library's evaluations hold beyond their operands, as
// qkv::benchmark measures them: every heap buffer (aligned_buffer), every
// recycled scratch block while taken, and each thread's scratch buffers at
// the size asked of them since the measurement began (they are kept between
// calls, so what a call uses is what it asks for, not what it allocates).
// Relaxed atomic counts: a few adds per buffer, none per element.
#pragma once

#include <atomic>
#include <cstddef>

namespace qkv::detail {

class allocation_meter {
 public:
  static void add(std::size_t bytes) noexcept {
    const long long now = live_.fetch_add(static_cast<long long>(bytes), std::memory_order_relaxed) +
                          static_cast<long long>(bytes);
    long long top = peak_.load(std::memory_order_relaxed);
    while (now > top && !peak_.compare_exchange_weak(top, now, std::memory_order_relaxed)) {
    }
  }
  static void sub(std::size_t bytes) noexcept {
    live_.fetch_sub(static_cast<long long>(bytes), std::memory_order_relaxed);
  }
  // A new measurement: the peak from what is held now, and each thread's
  // scratch counted afresh.
  static long long begin() noexcept {
    epoch_.fetch_add(1, std::memory_order_relaxed);
    const long long now = live_.load(std::memory_order_relaxed);
    peak_.store(now, std::memory_order_relaxed);
    return now;
  }
  static long long peak() noexcept { return peak_.load(std::memory_order_relaxed); }
  static unsigned epoch() noexcept { return epoch_.load(std::memory_order_relaxed); }

 private:
  static inline std::atomic<long long> live_{0}, peak_{0};
  static inline std::atomic<unsigned> epoch_{0};
};

}  // namespace qkv::detail
