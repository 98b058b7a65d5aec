// An owning, zero-initialised, cache-line-aligned array (or scratch,
// uninitialized, its block recycled: recycled_blocks.hpp).
#pragma once

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
    void operator()(T* p) const noexcept {
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
  aligned_buffer(std::size_t n, uninitialized_t) : size_(n) {
    static_assert(std::is_trivial_v<T>);
    if (n != 0) data_.reset(static_cast<T*>(::operator new[](n * sizeof(T), std::align_val_t{storage_alignment})));
  }
  // Scratch (uninitialized) whose block goes back to the thread's
  // recycled_blocks when the buffer goes, for the next call to take.
  struct recycled_t {};
  static constexpr recycled_t recycled{};
  aligned_buffer(std::size_t n, recycled_t) : size_(n) {
    static_assert(std::is_trivial_v<T>);
    if (n != 0)
      data_ = std::unique_ptr<T[], deleter>(static_cast<T*>(recycled_blocks::take(n * sizeof(T))), deleter{n * sizeof(T)});
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
