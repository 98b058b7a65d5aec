// matrix_view<T, R, C>: a non-owning view of user memory with a row stride
// (and a column stride, 1 unless given); T may be const.
#pragma once

#include "../expr/expression.hpp"
#include "../shape/check.hpp"
#include "../shape/extent.hpp"

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace qkv {

template <class T, std::size_t R, std::size_t C>
class matrix_view {
  using bare = std::remove_const_t<T>;
  static_assert(value_element<bare> || std::is_same_v<bare, bool> || std::is_same_v<bare, std::int32_t>,
                "qkv: matrix_view<T, R, C> needs T = float, double, bf16 or f16 (or bool for a mask, std::int32_t for a "
                "block table), optionally const");

 public:
  using value_type = bare;
  using element_type = T;
  static constexpr bool qkv_expression = true;
  static constexpr bool qkv_is_view = true;
  static constexpr std::size_t static_rows = R;
  static constexpr std::size_t static_cols = C;

  matrix_view(T* ptr, std::size_t rows, std::size_t cols) : matrix_view(ptr, rows, cols, cols) {}

  // row_stride is in elements, at least cols.
  matrix_view(T* ptr, std::size_t rows, std::size_t cols, std::size_t row_stride)
      : matrix_view(ptr, rows, cols, row_stride, 1) {}

  // Any strides, in elements: a column of a tensor, or the matrix of a
  // tensor_view whose last stride is not 1. Row stride ≥ cols is required
  // only when the column stride is 1.
  matrix_view(T* ptr, std::size_t rows, std::size_t cols, std::size_t row_stride, std::size_t col_stride)
      : ptr_(ptr), rows_(rows), cols_(cols), stride_(row_stride), col_stride_(col_stride) {
    detail::require_extent(R, rows, "matrix_view rows");
    detail::require_extent(C, cols, "matrix_view columns");
    if (col_stride == 1 && rows > 1 && row_stride < cols) {
      throw shape_error("qkv: matrix_view: row stride " + std::to_string(row_stride) + " is less than the " +
                        std::to_string(cols) + " columns");
    }
    if (ptr == nullptr && rows != 0 && cols != 0) throw std::invalid_argument("qkv: matrix_view over a null pointer");
  }

  // A view of a matrix or of another view: matrix_view<const float, dyn, 64> v = m;
  // Static extents are checked while compiling, dynamic ones at run time.
  template <leaf L>
    requires(!std::is_same_v<std::remove_cvref_t<L>, matrix_view> &&
             (std::is_lvalue_reference_v<L> || std::remove_cvref_t<L>::qkv_is_view) &&
             std::is_convertible_v<decltype(std::declval<L&>().data()), T*>)
  matrix_view(L&& m) : matrix_view(m.data(), m.rows(), m.cols(), m.row_stride(), col_stride_of(m)) {
    using M = std::remove_cvref_t<L>;
    static_assert(static_extents_agree<R, M::static_rows>, "qkv: matrix_view of a matrix: the row extents differ");
    static_assert(static_extents_agree<C, M::static_cols>, "qkv: matrix_view of a matrix: the column extents differ");
  }

  T& operator()(std::size_t i, std::size_t j) const noexcept { return ptr_[i * stride_ + j * col_stride_]; }
  T& at(std::size_t i, std::size_t j) const {
    if (i >= rows() || j >= cols()) {
      throw std::out_of_range("qkv: index (" + std::to_string(i) + ", " + std::to_string(j) + ") outside a " +
                              detail::shape_string(rows(), cols()) + " view");
    }
    return (*this)(i, j);
  }

  std::size_t rows() const noexcept { return rows_.value(); }
  std::size_t cols() const noexcept { return cols_.value(); }
  std::size_t row_stride() const noexcept { return stride_; }
  std::size_t col_stride() const noexcept { return col_stride_; }
  T* data() const noexcept { return ptr_; }

 private:
  template <class L>
  static std::size_t col_stride_of(const L& m) {
    if constexpr (requires { m.col_stride(); }) return m.col_stride();
    else return 1;
  }

  T* ptr_;
  [[no_unique_address]] extent<R> rows_;
  [[no_unique_address]] extent<C> cols_;
  std::size_t stride_;
  std::size_t col_stride_ = 1;
};

}  // namespace qkv
