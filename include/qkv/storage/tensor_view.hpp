// tensor_view<T, E...>: a non-owning rank-3 or rank-4 view of user memory
// with a stride per extent, in elements. The strides let a layout be read as
// another without a copy: [B, T, H, D] storage (heads interleaved, as
// PyTorch and llama.cpp keep them) viewed as [B, H, T, D]:
//   tensor_view<const float, dyn, dyn, dyn, 64> q(p, {B, H, T, 64}, {T * H * 64, 64, H * 64, 1});
#pragma once

#include "../expr/expression.hpp"
#include "matrix_view.hpp"
#include "tensor_shape.hpp"

#include <cstddef>
#include <stdexcept>
#include <type_traits>

namespace qkv {

template <class T, std::size_t... E>
class tensor_view {
  using bare = std::remove_const_t<T>;
  using shape = detail::tensor_shape<E...>;
  static_assert(value_element<bare> || std::is_same_v<bare, bool>,
                "qkv: tensor_view<T, E...> needs T = float, double, bf16 or f16 (or bool for a mask), optionally const");

 public:
  using value_type = bare;
  using element_type = T;
  using extents_type = typename shape::extents_t;
  static constexpr bool qkv_expression = true;
  static constexpr bool qkv_tensor = true;
  static constexpr bool qkv_is_view = true;
  static constexpr std::size_t static_rank = shape::rank;
  static constexpr std::size_t static_rows = shape::static_rows;
  static constexpr std::size_t static_cols = shape::static_cols;
  static constexpr batch_extents static_batch = shape::static_batch;

  // Every extent, in order (static ones checked), and contiguous row-major strides.
  tensor_view(T* ptr, const extents_type& extents) : tensor_view(ptr, extents, shape::contiguous_strides(extents)) {}

  // Every extent and every stride, in elements.
  tensor_view(T* ptr, const extents_type& extents, const extents_type& strides)
      : ptr_(ptr), extents_(shape::checked(extents, "tensor_view")), strides_(strides) {
    if (ptr == nullptr && shape::size(extents) != 0) throw std::invalid_argument("qkv: tensor_view over a null pointer");
  }

  // A view of a tensor or of another view, e.g. tensor_view<const float, dyn, 8, dyn, 64> v = t;
  template <class L>
    requires(tensor_leaf<L> && !std::is_same_v<std::remove_cvref_t<L>, tensor_view> &&
             (std::is_lvalue_reference_v<L> || std::remove_cvref_t<L>::qkv_is_view) &&
             std::is_convertible_v<decltype(std::declval<L&>().data()), T*>)
  tensor_view(L&& t) : tensor_view(t.data(), extents_of(t), strides_of(t)) {
    static_assert(std::remove_cvref_t<L>::static_rank == shape::rank, "qkv: tensor_view of a tensor: the ranks differ");
  }

  template <class... I>
    requires(sizeof...(I) == shape::rank && (std::is_convertible_v<I, std::size_t> && ...))
  T& operator()(I... index) const noexcept {
    return ptr_[shape::offset(strides_, {static_cast<std::size_t>(index)...})];
  }
  template <class... I>
    requires(sizeof...(I) == shape::rank && (std::is_convertible_v<I, std::size_t> && ...))
  T& at(I... index) const {
    shape::check_index(extents_, {static_cast<std::size_t>(index)...});
    return (*this)(index...);
  }

  // The matrix at one batch index: matrix_at(h) for rank 3, matrix_at(b, h) for rank 4.
  template <class... I>
    requires(sizeof...(I) == shape::rank - 2 && (std::is_convertible_v<I, std::size_t> && ...))
  matrix_view<T, static_rows, static_cols> matrix_at(I... index) const {
    batch_extents b{0, 0};
    if constexpr (shape::rank == 4) b = {static_cast<std::size_t>(index)...};
    else b = {0, static_cast<std::size_t>(index)...};
    shape::check_batch_index(extents_, b);
    return batch_matrix(b);
  }

  // The same by an index into the batch extents {outer, inner} (outer 0 at
  // rank 3), unchecked: what the strategies use.
  matrix_view<T, static_rows, static_cols> batch_matrix(batch_extents b) const {
    return {ptr_ + shape::batch_offset(strides_, b), rows(), cols(), strides_[shape::rank - 2],
            strides_[shape::rank - 1]};
  }

  std::size_t extent(std::size_t k) const { return extents_.at(k); }
  std::size_t stride(std::size_t k) const { return strides_.at(k); }
  const extents_type& extents() const noexcept { return extents_; }
  const extents_type& strides() const noexcept { return strides_; }
  std::size_t rows() const noexcept { return extents_[shape::rank - 2]; }
  std::size_t cols() const noexcept { return extents_[shape::rank - 1]; }
  batch_extents batch() const noexcept { return shape::batch(extents_); }
  T* data() const noexcept { return ptr_; }

 private:
  template <class L>
  static extents_type extents_of(const L& t) {
    extents_type x{};
    for (std::size_t k = 0; k < shape::rank; ++k) x[k] = t.extent(k);
    return x;
  }
  template <class L>
  static extents_type strides_of(const L& t) {
    extents_type x{};
    for (std::size_t k = 0; k < shape::rank; ++k) x[k] = t.stride(k);
    return x;
  }

  T* ptr_;
  extents_type extents_;
  extents_type strides_;
};

}  // namespace qkv
