// The only thing kernels know of a matrix: a pointer, extents and strides
// (in elements). A transposed operand is the same memory with the strides
// swapped. K and V in a paged cache also have a page table: row i is row
// i % page_rows of page pages[i / page_rows], page_stride elements from
// data per page number. Only ptr() and operator() know of pages; a kernel
// that reads rows from data and row_stride takes no paged operand
// (paged_kv.hpp copies one contiguous first).
#pragma once

#include <cstddef>
#include <cstdint>

namespace qkv::kernels {

template <class T>
struct strided {
  T* data;
  std::size_t rows;
  std::size_t cols;
  std::ptrdiff_t row_stride;
  std::ptrdiff_t col_stride;
  const std::int32_t* pages = nullptr;  // none: data + i·row_stride
  std::size_t page_rows = 0;
  std::ptrdiff_t page_stride = 0;
  int page_shift = -1;  // log2 page_rows where it is a power of two: no division per row

  T& operator()(std::size_t i, std::size_t j) const noexcept { return *ptr(i, j); }
  // The address of element (i, j), also where forming a reference would not
  // do: the data of an empty operand may be null.
  T* ptr(std::size_t i, std::size_t j) const noexcept {
    if (pages != nullptr) {
      const std::size_t at = page_shift >= 0 ? i >> page_shift : i / page_rows;
      const std::size_t row = page_shift >= 0 ? i & (page_rows - 1) : i % page_rows;
      return data + (std::ptrdiff_t{pages[at]} * page_stride + static_cast<std::ptrdiff_t>(row) * row_stride +
                     static_cast<std::ptrdiff_t>(j) * col_stride);
    }
    return data + (static_cast<std::ptrdiff_t>(i) * row_stride + static_cast<std::ptrdiff_t>(j) * col_stride);
  }
  strided<const T> as_const() const noexcept { return {data, rows, cols, row_stride, col_stride, pages, page_rows, page_stride, page_shift}; }
  // (Not of a paged operand.)
  strided transposed() const noexcept { return {data, cols, rows, col_stride, row_stride}; }
};

}  // namespace qkv::kernels
