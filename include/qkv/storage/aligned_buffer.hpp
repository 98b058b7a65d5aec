// An owning, zero-initialised, cache-line-aligned array.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace qkv::detail {

inline constexpr std::size_t storage_alignment = 64;  // a cache line, and one AVX-512 vector

template <class T>
class aligned_buffer {
  struct deleter {
    void operator()(T* p) const noexcept { ::operator delete[](p, std::align_val_t{storage_alignment}); }
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
