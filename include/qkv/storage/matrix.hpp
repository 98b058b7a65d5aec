// matrix<T, R, C>: an owning, row-major, 64-byte-aligned matrix with static or
// dynamic extents.
#pragma once

#include "../expr/expression.hpp"
#include "../shape/check.hpp"
#include "../shape/extent.hpp"
#include "aligned_buffer.hpp"

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace qkv {

// Rows are contiguous (row_stride() == cols()), so data() is the usual
// row-major array; the first element is 64-byte aligned.
template <class T, std::size_t R, std::size_t C>
class matrix {
  static_assert(value_element<T> || std::is_same_v<T, bool>,
                "qkv: matrix<T, R, C> needs T = float, double, bf16 or f16 (or bool for a mask)");

 public:
  using value_type = T;
  static constexpr bool qkv_expression = true;
  static constexpr bool qkv_is_view = false;
  static constexpr std::size_t static_rows = R;
  static constexpr std::size_t static_cols = C;

  // Static extents: zero-filled. A dynamic extent starts at 0.
  matrix() : buf_(is_static(R) && is_static(C) ? R * C : 0) {}

  // matrix<T, dyn, C>(rows), zero-filled.
  explicit matrix(std::size_t rows)
    requires(R == dyn && C != dyn)
      : matrix(rows, C) {}

  // Any extents; a static extent must match the value given (else shape_error).
  matrix(std::size_t rows, std::size_t cols) : rows_(rows), cols_(cols), buf_(checked_size(rows, cols)) {}

  // matrix<float, 2, 3>{{1, 2, 3}, {4, 5, 6}}: the counts are checked while compiling.
  template <std::size_t... N>
    requires(sizeof...(N) > 0)
  matrix(const T (&... rows)[N]) : matrix(sizeof...(N), first_of<N...>()) {
    static_assert(((N == first_of<N...>()) && ...), "qkv: braced matrix: rows have different lengths");
    static_assert(R == dyn || sizeof...(N) == R, "qkv: braced matrix: the number of rows differs from R");
    static_assert(C == dyn || first_of<N...>() == C, "qkv: braced matrix: the row length differs from C");
    T* out = data();
    ((out = std::copy_n(rows, N, out)), ...);
  }

  // Evaluates an expression (matrix<float, 8, 4> O = softmax(S) * V;).
  template <expression E>
    requires(!std::is_same_v<std::remove_cvref_t<E>, matrix>)
  matrix(const E& e) : matrix(checked_rows(e), e.cols()) {
    static_assert(static_extents_agree<R, E::static_rows>, "qkv: matrix = e: the row extents differ");
    static_assert(static_extents_agree<C, E::static_cols>, "qkv: matrix = e: the column extents differ");
    static_assert(std::is_same_v<T, value_type_t<E>>, "qkv: matrix = e: the element types differ");
    // Only when the checks pass, so that a mismatch is one error, not several.
    if constexpr (extents_agree(R, E::static_rows) && extents_agree(C, E::static_cols) &&
                  std::is_same_v<T, value_type_t<E>>) {
      eval_into(*this, e);
    }
  }

  matrix(const matrix&) = default;
  matrix(matrix&&) noexcept = default;
  matrix& operator=(const matrix&) = default;
  matrix& operator=(matrix&&) noexcept = default;

  // O = e: a dynamic extent takes the expression's; aliasing (O = O * O) is safe.
  template <expression E>
    requires(!std::is_same_v<std::remove_cvref_t<E>, matrix>)
  matrix& operator=(const E& e) {
    static_assert(static_extents_agree<R, E::static_rows>, "qkv: matrix = e: the row extents differ");
    static_assert(static_extents_agree<C, E::static_cols>, "qkv: matrix = e: the column extents differ");
    if constexpr (extents_agree(R, E::static_rows) && extents_agree(C, E::static_cols)) {
      if (e.rows() == rows() && e.cols() == cols()) {
        eval_into(*this, e);
      } else {
        *this = matrix(e);
      }
    }
    return *this;
  }

  T& operator()(std::size_t i, std::size_t j) noexcept { return buf_.data()[i * cols() + j]; }
  const T& operator()(std::size_t i, std::size_t j) const noexcept { return buf_.data()[i * cols() + j]; }

  // Bounds-checked access.
  T& at(std::size_t i, std::size_t j) { return (check_index(i, j), (*this)(i, j)); }
  const T& at(std::size_t i, std::size_t j) const { return (check_index(i, j), (*this)(i, j)); }

  std::size_t rows() const noexcept { return rows_.value(); }
  std::size_t cols() const noexcept { return cols_.value(); }
  std::size_t row_stride() const noexcept { return cols(); }
  std::size_t size() const noexcept { return rows() * cols(); }
  T* data() noexcept { return buf_.data(); }
  const T* data() const noexcept { return buf_.data(); }

 private:
  template <std::size_t N0, std::size_t...>
  static constexpr std::size_t first_of() {
    return N0;
  }

  // e's rows, after checking e's extents against the static ones of this type.
  template <class E>
  static std::size_t checked_rows(const E& e) {
    if ((is_static(R) && R != e.rows()) || (is_static(C) && C != e.cols())) {
      throw shape_error("qkv: matrix = e: the shapes differ (" + type_shape() + " vs " +
                        detail::shape_string(e.rows(), e.cols()) + ")");
    }
    return e.rows();
  }

  static std::string type_shape() {
    return (is_static(R) ? std::to_string(R) : std::string("dyn")) + "x" +
           (is_static(C) ? std::to_string(C) : std::string("dyn"));
  }

  static std::size_t checked_size(std::size_t rows, std::size_t cols) {
    detail::require_extent(R, rows, "matrix rows");
    detail::require_extent(C, cols, "matrix columns");
    if (cols != 0 && rows > std::size_t(-1) / sizeof(T) / cols) throw std::length_error("qkv: matrix too large");
    return rows * cols;
  }

  void check_index(std::size_t i, std::size_t j) const {
    if (i >= rows() || j >= cols()) {
      throw std::out_of_range("qkv: index (" + std::to_string(i) + ", " + std::to_string(j) + ") outside a " +
                              detail::shape_string(rows(), cols()) + " matrix");
    }
  }

  [[no_unique_address]] extent<R> rows_{R == dyn ? 0 : R};
  [[no_unique_address]] extent<C> cols_{C == dyn ? 0 : C};
  detail::aligned_buffer<T> buf_;
};

}  // namespace qkv
