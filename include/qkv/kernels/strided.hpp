// The only thing kernels know of a matrix: a pointer, extents and strides
// (in elements). A transposed operand is the same memory with the strides
// swapped.
#pragma once

#include <cstddef>

namespace qkv::kernels {

template <class T>
struct strided {
  T* data;
  std::size_t rows;
  std::size_t cols;
  std::ptrdiff_t row_stride;
  std::ptrdiff_t col_stride;

  T& operator()(std::size_t i, std::size_t j) const noexcept { return *ptr(i, j); }
  // The address of element (i, j), also where forming a reference would not
  // do: the data of an empty operand may be null.
  T* ptr(std::size_t i, std::size_t j) const noexcept {
    return data + (static_cast<std::ptrdiff_t>(i) * row_stride + static_cast<std::ptrdiff_t>(j) * col_stride);
  }
  strided<const T> as_const() const noexcept { return {data, rows, cols, row_stride, col_stride}; }
  strided transposed() const noexcept { return {data, cols, rows, col_stride, row_stride}; }
};

}  // namespace qkv::kernels
