// ragged<T, H, D>: an owning, zero-filled, 64-byte-aligned batch of B
// sequences of different lengths packed end to end (ragged_view.hpp has
// the layout); eval of an expression on ragged operands gives one, with the
// offsets of its queries.
#pragma once

#include "../expr/expression.hpp"
#include "aligned_buffer.hpp"
#include "ragged_shape.hpp"
#include "ragged_view.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

namespace qkv {

template <class T, std::size_t H, std::size_t D>
class ragged {
  static_assert(value_element<T>, "qkv: ragged<T, H, D> needs T = float, double, bf16 or f16");

 public:
  using value_type = T;
  static constexpr bool qkv_expression = true;
  static constexpr bool qkv_tensor = true;
  static constexpr bool qkv_ragged = true;
  static constexpr bool qkv_is_view = false;
  static constexpr std::size_t static_rank = 4;
  static constexpr std::size_t static_rows = dyn;
  static constexpr std::size_t static_cols = D;
  static constexpr std::size_t static_heads = H;
  static constexpr batch_extents static_batch{dyn, H};

  // No sequences.
  ragged() : ragged(std::vector<std::int32_t>{0}, {H == dyn ? 0 : H, D == dyn ? 0 : D}) {}

  // offsets: B + 1 non-decreasing entries from 0 (else std::invalid_argument),
  // copied; extents {heads, dim}, checked against static H and D.
  ragged(std::span<const std::int32_t> offsets, ragged_extents extents)
      : offsets_(offsets.begin(), offsets.end()), extents_(detail::checked_ragged_extents<H, D>(extents, "ragged")) {
    detail::check_offsets(offsets_, "ragged");
    buf_ = detail::aligned_buffer<T>(view().size());
  }

  ragged(const ragged&) = default;
  ragged(ragged&&) noexcept = default;
  ragged& operator=(const ragged&) = default;
  ragged& operator=(ragged&&) noexcept = default;

  T& operator()(std::size_t t, std::size_t h, std::size_t c) noexcept { return view()(t, h, c); }
  const T& operator()(std::size_t t, std::size_t h, std::size_t c) const noexcept { return view()(t, h, c); }
  T& at(std::size_t t, std::size_t h, std::size_t c) { return view().at(t, h, c); }
  const T& at(std::size_t t, std::size_t h, std::size_t c) const { return view().at(t, h, c); }

  auto matrix_at(std::size_t b, std::size_t h) { return view().matrix_at(b, h); }
  auto matrix_at(std::size_t b, std::size_t h) const { return view().matrix_at(b, h); }
  matrix_view<const T, dyn, D> batch_matrix(batch_extents b) const { return view().batch_matrix(b); }

  ragged_view<T, H, D> view() noexcept { return {buf_.data(), offsets_, extents_, ragged_view<T, H, D>::trusted}; }
  ragged_view<const T, H, D> view() const noexcept {
    return {buf_.data(), offsets_, extents_, ragged_view<const T, H, D>::trusted};
  }

  std::size_t batch() const noexcept { return offsets_.size() - 1; }
  std::size_t length(std::size_t b) const { return view().length(b); }
  std::span<const std::int32_t> offsets() const noexcept { return offsets_; }
  std::size_t heads() const noexcept { return extents_[0]; }
  std::size_t tokens() const noexcept { return static_cast<std::size_t>(offsets_.back()); }
  std::size_t rows() const noexcept { return tokens(); }
  std::size_t cols() const noexcept { return extents_[1]; }
  std::array<std::size_t, 4> extents() const noexcept { return view().extents(); }
  std::size_t extent(std::size_t k) const { return view().extent(k); }
  std::size_t stride(std::size_t k) const { return view().stride(k); }
  std::size_t size() const noexcept { return buf_.size(); }
  T* data() noexcept { return buf_.data(); }
  const T* data() const noexcept { return buf_.data(); }

 private:
  std::vector<std::int32_t> offsets_;
  ragged_extents extents_;
  detail::aligned_buffer<T> buf_;
};

}  // namespace qkv
