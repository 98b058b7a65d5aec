// Which keys the causal and window bounds leave each row of an
// attention_problem: they depend on the extents and the row's position among
// the keys alone, so the kernels, the backward and the callers that split a
// problem (eval/part.hpp) share them.
#pragma once

#include "attention_problem.hpp"

#include <cstddef>

namespace qkv::kernels {

// The keys row i may see, [key_begin, key_end): all m, cut by causal at
// i' + 1 and by a window to [i' − left, i' + right + 1), where i' is the
// row's position among the keys (attention_problem::diagonal_shift).
template <class T, class S>
std::ptrdiff_t key_position(const attention_problem<T, S>& p, std::size_t i) {
  return static_cast<std::ptrdiff_t>(i + p.k.rows) - static_cast<std::ptrdiff_t>(p.q.rows) + p.diagonal_shift;
}
// A bound of b keys from i', clamped where it reaches past every key from
// any row (no_bound among them), so that the sums cannot overflow.
template <class T, class S>
std::ptrdiff_t bound_reach(const attention_problem<T, S>& p, std::size_t b) {
  const std::size_t shift = static_cast<std::size_t>(p.diagonal_shift < 0 ? -p.diagonal_shift : p.diagonal_shift);
  const std::size_t far = p.k.rows + p.q.rows + shift + 1;
  return static_cast<std::ptrdiff_t>(b < far ? b : far);
}
template <class T, class S>
std::size_t clamp_keys(const attention_problem<T, S>& p, std::ptrdiff_t j) {
  if (j <= 0) return 0;
  return static_cast<std::size_t>(j) < p.k.rows ? static_cast<std::size_t>(j) : p.k.rows;
}
template <class T, class S>
std::size_t key_end(const attention_problem<T, S>& p, std::size_t i) {
  const std::size_t right = p.causal ? 0 : p.window_right;  // (a window's right bound is at least 0)
  if (right == p.no_bound) return p.k.rows;
  return clamp_keys(p, key_position(p, i) + bound_reach(p, right) + 1);
}
template <class T, class S>
std::size_t key_begin(const attention_problem<T, S>& p, std::size_t i) {
  if (p.window_left == p.no_bound) return 0;
  return clamp_keys(p, key_position(p, i) - bound_reach(p, p.window_left));
}
// Whether some row of [i0, i0 + rows) sees a key of [j0, j0 + cols) by
// the causal and window bounds (both grow with the row).
template <class T, class S>
bool bounds_keep_any(const attention_problem<T, S>& p, std::size_t i0, std::size_t rows, std::size_t j0,
                            std::size_t cols) {
  return rows > 0 && key_end(p, i0 + rows - 1) > j0 && key_begin(p, i0) < j0 + cols;
}

}  // namespace qkv::kernels
