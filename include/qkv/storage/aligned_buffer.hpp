// An owning, zero-initialised, cache-line-aligned array (or scratch,
// uninitialized, its block recycled: recycled_blocks.hpp).
#pragma once

#include "allocation_meter.hpp"
#include "recycled_blocks.hpp"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace qkv::detail {

template <class T>
class aligned_buffer {
  struct deleter {
    std::size_t recycled_bytes = 0;  // 0: not from recycled_blocks
    std::size_t metered_bytes = 0;   // what allocation_meter counts of it
    void operator()(T* p) const noexcept {
      allocation_meter::sub(metered_bytes);
      if (recycled_bytes != 0) recycled_blocks::give(p, recycled_bytes);
      else ::operator delete[](p, std::align_val_t{storage_alignment});
    }
  };

 public:
  aligned_buffer() noexcept = default;
  // Zero-filled.
  explicit aligned_buffer(std::size_t n) : aligned_buffer(n, uninitialized) { std::fill_n(data(), n, T{}); }

  // For scratch space that is written before it is read.
  struct uninitialized_t {};
  static constexpr uninitialized_t uninitialized{};
  aligned_buffer(std::size_t n, uninitialized_t) : aligned_buffer(n, unmetered) {
    if (n != 0) allocation_meter::add(n * sizeof(T)), data_.get_deleter().metered_bytes = n * sizeof(T);
  }
  // The same, not counted by allocation_meter (thread_scratch counts its own).
  struct unmetered_t {};
  static constexpr unmetered_t unmetered{};
  aligned_buffer(std::size_t n, unmetered_t) : size_(n) {
    static_assert(std::is_trivial_v<T>);
    if (n != 0) data_.reset(static_cast<T*>(::operator new[](n * sizeof(T), std::align_val_t{storage_alignment})));
  }
  // Scratch (uninitialized) whose block goes back to the thread's
  // recycled_blocks when the buffer goes, for the next call to take.
  struct recycled_t {};
  static constexpr recycled_t recycled{};
  aligned_buffer(std::size_t n, recycled_t) : size_(n) {
    static_assert(std::is_trivial_v<T>);
    if (n != 0) {
      data_ = std::unique_ptr<T[], deleter>(static_cast<T*>(recycled_blocks::take(n * sizeof(T))),
                                            deleter{n * sizeof(T), n * sizeof(T)});
      allocation_meter::add(n * sizeof(T));
    }
  }
  aligned_buffer(const aligned_buffer& o) : aligned_buffer(o.size_) { std::copy_n(o.data(), size_, data()); }
  aligned_buffer(aligned_buffer&& o) noexcept : data_(std::move(o.data_)), size_(std::exchange(o.size_, 0)) {}
  aligned_buffer& operator=(const aligned_buffer& o) {
    if (this != &o) *this = aligned_buffer(o);
    return *this;
  }
  aligned_buffer& operator=(aligned_buffer&& o) noexcept {
    data_ = std::move(o.data_);
    size_ = std::exchange(o.size_, 0);
    return *this;
  }

  T* data() noexcept { return data_.get(); }
  const T* data() const noexcept { return data_.get(); }
  std::size_t size() const noexcept { return size_; }

 private:
  std::unique_ptr<T[], deleter> data_;
  std::size_t size_ = 0;
};

}  // namespace qkv::detail
