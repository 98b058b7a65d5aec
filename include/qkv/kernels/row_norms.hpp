// Per-row Euclidean norms, for the built-in cosine and neg_sq_l2
// similarities: computed once per row, before any score. Left to the
// compiler: O(n·d) beside the O(n·m·d) of the scores.
#pragma once

#include "strided.hpp"

#include <cmath>
#include <cstddef>

namespace qkv::kernels {

// out[i] = ‖x_i‖².
template <class T>
void row_sq_norms(strided<const T> x, T* out) {
  for (std::size_t i = 0; i < x.rows; ++i) {
    T s = T(0);
    for (std::size_t c = 0; c < x.cols; ++c) s += x(i, c) * x(i, c);
    out[i] = s;
  }
}

// x_i ← x_i / ‖x_i‖; a row of zeros stays zeros (its cosine with anything is 0).
template <class T>
void normalize_rows(strided<T> x) {
  for (std::size_t i = 0; i < x.rows; ++i) {
    T s = T(0);
    for (std::size_t c = 0; c < x.cols; ++c) s += x(i, c) * x(i, c);
    if (s == T(0)) continue;
    const T inv = T(1) / std::sqrt(s);
    for (std::size_t c = 0; c < x.cols; ++c) x(i, c) *= inv;
  }
}

}  // namespace qkv::kernels
