// ragged_view<T, H, D>: B sequences of different lengths packed end to end
// in user memory, token-major ([tokens, H, D], row-major), with B + 1
// offsets: the layout of FlashAttention's cu_seqlens and vLLM's
// query_start_loc. As an operand it is a batch of {B, H} matrices, the
// matrix at {b, h} being sequence b's rows of head h, so every node and
// strategy that takes tensors takes it (eval/slice.hpp), each sequence
// attending within itself. The offsets' memory must outlive the view.
#pragma once

#include "../expr/expression.hpp"
#include "matrix_view.hpp"
#include "ragged_shape.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <type_traits>

namespace qkv {

template <class T, std::size_t H, std::size_t D>
class ragged_view {
  using bare = std::remove_const_t<T>;
  static_assert(value_element<bare>, "qkv: ragged_view<T, H, D> needs T = float, double, bf16 or f16, optionally const");

 public:
  using value_type = bare;
  using element_type = T;
  static constexpr bool qkv_expression = true;
  static constexpr bool qkv_tensor = true;
  static constexpr bool qkv_ragged = true;
  static constexpr bool qkv_is_view = true;
  static constexpr std::size_t static_rank = 4;
  static constexpr std::size_t static_rows = dyn;
  static constexpr std::size_t static_cols = D;
  static constexpr std::size_t static_heads = H;
  static constexpr batch_extents static_batch{dyn, H};

  // offsets: B + 1 non-decreasing entries from 0 (else std::invalid_argument);
  // extents {heads, dim}, checked against static H and D (else shape_error).
  ragged_view(T* ptr, std::span<const std::int32_t> offsets, ragged_extents extents)
      : ptr_(ptr), layout_{offsets, 0, 0} {
    detail::check_offsets(offsets, "ragged_view");
    const ragged_extents x = detail::checked_ragged_extents<H, D>(extents, "ragged_view");
    layout_.heads = x[0], layout_.dim = x[1];
    if (ptr == nullptr && layout_.tokens() * layout_.row_stride() != 0)
      throw std::invalid_argument("qkv: ragged_view over a null pointer");
  }

  // Offsets and extents already checked (a ragged's own view).
  struct trusted_t {};
  static constexpr trusted_t trusted{};
  ragged_view(T* ptr, std::span<const std::int32_t> offsets, ragged_extents extents, trusted_t) noexcept
      : ptr_(ptr), layout_{offsets, extents[0], extents[1]} {}

  // A view of a ragged or of another view (ragged_view<const float, 8, 64> v = r;).
  template <class L>
    requires(!std::is_same_v<std::remove_cvref_t<L>, ragged_view> && requires { std::remove_cvref_t<L>::qkv_ragged; } &&
             (std::is_lvalue_reference_v<L> || std::remove_cvref_t<L>::qkv_is_view) &&
             std::is_convertible_v<decltype(std::declval<L&>().data()), T*>)
  ragged_view(L&& r) : ragged_view(r.data(), r.offsets(), {r.heads(), r.cols()}) {}

  T& operator()(std::size_t t, std::size_t h, std::size_t c) const noexcept { return ptr_[layout_.offset(t, h, c)]; }
  T& at(std::size_t t, std::size_t h, std::size_t c) const {
    layout_.check_index(t, h, c);
    return (*this)(t, h, c);
  }

  // Sequence b's rows of head h, checked; batch_matrix({b, h}) unchecked,
  // for the strategies.
  matrix_view<T, dyn, D> matrix_at(std::size_t b, std::size_t h) const {
    layout_.check_batch_index({b, h});
    return batch_matrix({b, h});
  }
  matrix_view<T, dyn, D> batch_matrix(batch_extents b) const {
    return {ptr_ + layout_.matrix_offset(b), layout_.length(b[0]), layout_.dim, layout_.row_stride(), 1};
  }

  // B, the number of sequences.
  std::size_t batch() const noexcept { return layout_.batch_count(); }
  std::size_t length(std::size_t b) const { return layout_.length(checked_sequence(b)); }
  std::span<const std::int32_t> offsets() const noexcept { return layout_.offsets; }
  std::size_t heads() const noexcept { return layout_.heads; }
  std::size_t tokens() const noexcept { return layout_.tokens(); }
  // For the nodes: all tokens as rows (each sequence's own rows are its
  // matrices'), D columns; its batch extents are {B, H} (shape/batch.hpp).
  std::size_t rows() const noexcept { return layout_.tokens(); }
  std::size_t cols() const noexcept { return layout_.dim; }
  std::array<std::size_t, 4> extents() const noexcept { return layout_.extents(); }
  std::size_t extent(std::size_t k) const { return layout_.extents().at(k); }
  std::size_t stride(std::size_t k) const { return layout_.strides().at(k); }
  std::size_t size() const noexcept { return layout_.tokens() * layout_.row_stride(); }
  T* data() const noexcept { return ptr_; }

 private:
  std::size_t checked_sequence(std::size_t b) const {
    if (b >= batch())
      throw std::out_of_range("qkv: sequence " + std::to_string(b) + " of a ragged of " + std::to_string(batch()));
    return b;
  }

  T* ptr_;
  detail::ragged_layout layout_;
};

}  // namespace qkv
