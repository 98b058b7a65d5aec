// Masks applied to a score matrix in place, before its softmax. Memory
// bound and branch-light; left to the compiler.
#pragma once

#include "strided.hpp"

#include <cstddef>
#include <limits>

namespace qkv::kernels {

// s(i, j) = −∞ where j > i + (m − n), m = cols, n = rows.
template <class T>
void mask_causal(strided<T> s) {
  const auto n = static_cast<std::ptrdiff_t>(s.rows);
  const auto m = static_cast<std::ptrdiff_t>(s.cols);
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    const std::ptrdiff_t first_masked = i + (m - n) + 1;
    for (std::ptrdiff_t j = first_masked < 0 ? 0 : first_masked; j < m; ++j) {
      s(static_cast<std::size_t>(i), static_cast<std::size_t>(j)) = -std::numeric_limits<T>::infinity();
    }
  }
}

// s(i, j) = −∞ outside i' − left ≤ j ≤ i' + right, i' = i + (m − n).
template <class T>
void mask_window(strided<T> s, std::size_t left, std::size_t right) {
  const auto n = static_cast<std::ptrdiff_t>(s.rows);
  const auto m = static_cast<std::ptrdiff_t>(s.cols);
  // Past m + n either bound keeps every key from every row.
  const auto l = static_cast<std::ptrdiff_t>(left < s.rows + s.cols ? left : s.rows + s.cols);
  const auto r = static_cast<std::ptrdiff_t>(right < s.rows + s.cols ? right : s.rows + s.cols);
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    const std::ptrdiff_t ip = i + (m - n);
    for (std::ptrdiff_t j = 0; j < m; ++j)
      if (j < ip - l || j > ip + r) s(static_cast<std::size_t>(i), static_cast<std::size_t>(j)) = -std::numeric_limits<T>::infinity();
  }
}

// s(i, j) = −∞ where keep(i, j) is false.
template <class T>
void mask_where_false(strided<T> s, strided<const bool> keep) {
  for (std::size_t i = 0; i < s.rows; ++i) {
    for (std::size_t j = 0; j < s.cols; ++j) {
      if (!keep(i, j)) s(i, j) = -std::numeric_limits<T>::infinity();
    }
  }
}

}  // namespace qkv::kernels
