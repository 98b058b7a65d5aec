// Masks applied to a score matrix in place, before its softmax. Memory
// bound and branch-light; left to the compiler.
#pragma once

#include "key_bounds.hpp"
#include "strided.hpp"

#include <cstddef>
#include <limits>

namespace qkv::kernels {

// s(i, j) = −∞ where row i does not see key j by the bounds b (causal,
// windows: key_bounds.hpp), m = cols, n = rows.
template <class T>
void mask_outside(strided<T> s, const key_bounds& b) {
  for (std::size_t i = 0; i < s.rows; ++i) {
    const std::size_t begin = key_begin(b, s.rows, s.cols, i), end = key_end(b, s.rows, s.cols, i);
    for (std::size_t j = 0; j < s.cols; ++j)
      if (j < begin || j >= end) s(i, j) = -std::numeric_limits<T>::infinity();
  }
}

// s(i, j) = −∞ where j > i + (m − n).
template <class T>
void mask_causal(strided<T> s) {
  key_bounds b;
  b.causal = true;
  mask_outside(s, b);
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
