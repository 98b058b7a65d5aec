// tensor<T, E...>: an owning, row-major, 64-byte-aligned tensor of rank 3 or
// 4. The last two extents are a matrix, the leading ones batch extents:
// tensor<float, dyn, 8, dyn, 64>(B, T) holds B sequences of 8 heads of T×64.
#pragma once

#include "../expr/expression.hpp"
#include "aligned_buffer.hpp"
#include "tensor_shape.hpp"
#include "tensor_view.hpp"

#include <array>
#include <cstddef>
#include <type_traits>

namespace qkv {

template <class T, std::size_t... E>
class tensor {
  using shape = detail::tensor_shape<E...>;
  static_assert(value_element<T> || std::is_same_v<T, bool>,
                "qkv: tensor<T, E...> needs T = float, double, bf16 or f16 (or bool for a mask)");

 public:
  using value_type = T;
  using extents_type = typename shape::extents_t;
  static constexpr bool qkv_expression = true;
  static constexpr bool qkv_tensor = true;
  static constexpr bool qkv_is_view = false;
  static constexpr std::size_t static_rank = shape::rank;
  static constexpr std::size_t static_rows = shape::static_rows;
  static constexpr std::size_t static_cols = shape::static_cols;
  static constexpr batch_extents static_batch = shape::static_batch;

  // Static extents: zero-filled. A dynamic extent starts at 0.
  tensor() : tensor(shape::from_dynamic({})) {}

  // The dynamic extents, in order (tensor<float, dyn, dyn, dyn, 64>(B, H, N)),
  // or every extent (static ones checked); zero-filled.
  template <class... I>
    requires(sizeof...(I) > 0 && (sizeof...(I) == shape::dynamic_count || sizeof...(I) == shape::rank) &&
             (std::is_convertible_v<I, std::size_t> && ...))
  explicit tensor(I... extents) : tensor(from_list(std::array<std::size_t, sizeof...(I)>{static_cast<std::size_t>(extents)...})) {}

  explicit tensor(const extents_type& extents)
      : extents_(shape::checked(extents, "tensor")), buf_(shape::size(extents_)) {}

  // Evaluates a batched expression: tensor<float, 2, 8, 128, 64> O = softmax(S) * V;
  template <expression X>
    requires(!std::is_same_v<std::remove_cvref_t<X>, tensor>)
  tensor(const X& e) : tensor(extents_of(e)) {
    check_rank<X>();
    if constexpr (detail::static_rank_of<X>() == shape::rank) eval_into(view(), e);
  }

  tensor(const tensor&) = default;
  tensor(tensor&&) noexcept = default;
  tensor& operator=(const tensor&) = default;
  tensor& operator=(tensor&&) noexcept = default;

  // O = e: dynamic extents take the expression's; aliasing is safe.
  template <expression X>
    requires(!std::is_same_v<std::remove_cvref_t<X>, tensor>)
  tensor& operator=(const X& e) {
    check_rank<X>();
    if constexpr (detail::static_rank_of<X>() == shape::rank) {
      if (extents_of(e) == extents_) eval_into(view(), e);
      else *this = tensor(e);
    }
    return *this;
  }

  template <class... I>
    requires(sizeof...(I) == shape::rank && (std::is_convertible_v<I, std::size_t> && ...))
  T& operator()(I... index) noexcept {
    return buf_.data()[shape::offset(strides(), {static_cast<std::size_t>(index)...})];
  }
  template <class... I>
    requires(sizeof...(I) == shape::rank && (std::is_convertible_v<I, std::size_t> && ...))
  const T& operator()(I... index) const noexcept {
    return buf_.data()[shape::offset(strides(), {static_cast<std::size_t>(index)...})];
  }
  template <class... I>
  T& at(I... index) {
    return view().at(index...);
  }
  template <class... I>
  const T& at(I... index) const {
    return view().at(index...);
  }

  // The matrix at one batch index: matrix_at(h) for rank 3, matrix_at(b, h) for rank 4.
  template <class... I>
  auto matrix_at(I... index) {
    return view().matrix_at(index...);
  }
  template <class... I>
  auto matrix_at(I... index) const {
    return view().matrix_at(index...);
  }
  matrix_view<const T, static_rows, static_cols> batch_matrix(batch_extents b) const { return view().batch_matrix(b); }

  tensor_view<T, E...> view() noexcept { return {buf_.data(), extents_, strides()}; }
  tensor_view<const T, E...> view() const noexcept { return {buf_.data(), extents_, strides()}; }

  std::size_t extent(std::size_t k) const { return extents_.at(k); }
  std::size_t stride(std::size_t k) const { return strides().at(k); }
  const extents_type& extents() const noexcept { return extents_; }
  extents_type strides() const noexcept { return shape::contiguous_strides(extents_); }
  std::size_t rows() const noexcept { return extents_[shape::rank - 2]; }
  std::size_t cols() const noexcept { return extents_[shape::rank - 1]; }
  batch_extents batch() const noexcept { return shape::batch(extents_); }
  std::size_t size() const noexcept { return buf_.size(); }
  T* data() noexcept { return buf_.data(); }
  const T* data() const noexcept { return buf_.data(); }

 private:
  template <std::size_t N>
  static extents_type from_list(const std::array<std::size_t, N>& given) {
    if constexpr (N == shape::rank) return given;
    else return shape::from_dynamic(given);
  }

  template <class X>
  static constexpr void check_rank() {
    static_assert(detail::static_rank_of<X>() == shape::rank,
                  "qkv: tensor = e: the ranks differ (e is a matrix expression, or of the other rank)");
  }

  // e's extents in this rank's order.
  template <class X>
  static extents_type extents_of(const X& e) {
    extents_type x{};
    const batch_extents b = detail::batch_of(e);
    if constexpr (shape::rank == 4) x = {b[0], b[1], e.rows(), e.cols()};
    else x = {b[1], e.rows(), e.cols()};
    return x;
  }

  extents_type extents_;
  detail::aligned_buffer<T> buf_;
};

}  // namespace qkv
