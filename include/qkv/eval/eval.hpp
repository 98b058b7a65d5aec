// eval(e), eval(e, strategy) and eval_into(dst, e): where an expression
// meets storage.
#pragma once

#include "../expr/expression.hpp"
#include "../shape/check.hpp"
#include "../storage/matrix.hpp"
#include "../storage/matrix_view.hpp"
#include "naive.hpp"
#include "strategy.hpp"

#include <cstddef>
#include <functional>
#include <tuple>
#include <type_traits>

namespace qkv {

// The owning matrix an expression evaluates to.
template <expression E>
using result_t = matrix<value_type_t<E>, detail::bare_t<E>::static_rows, detail::bare_t<E>::static_cols>;

namespace detail {

// Calls f(leaf) for every storage leaf under e.
template <class E, class F>
void for_each_leaf(const E& e, F& f) {
  if constexpr (leaf<E>) {
    f(e);
  } else {
    std::apply([&f](const auto&... child) { (for_each_leaf(child, f), ...); }, e.operands());
  }
}

// Whether the destination's memory overlaps memory that e reads.
template <class T, class E>
bool reads_from(const E& e, kernels::strided<T> dst) {
  if (dst.rows == 0 || dst.cols == 0) return false;
  const auto* lo = reinterpret_cast<const unsigned char*>(&dst(0, 0));
  const auto* hi = reinterpret_cast<const unsigned char*>(&dst(dst.rows - 1, dst.cols - 1) + 1);
  bool overlaps = false;
  auto check = [&](const auto& l) {
    if (l.rows() == 0 || l.cols() == 0) return;
    const auto* b = reinterpret_cast<const unsigned char*>(l.data());
    const auto* end = reinterpret_cast<const unsigned char*>(l.data() + (l.rows() - 1) * l.row_stride() + l.cols());
    overlaps = overlaps || (std::less<>{}(b, hi) && std::less<>{}(lo, end));
  };
  for_each_leaf(e, check);
  return overlaps;
}

template <class E>
void check_destination(std::size_t rows, std::size_t cols, const E& e) {
  require_equal(rows, e.rows(), "eval_into(dst, e): the shapes of dst and e differ", rows, cols, e.rows(), e.cols());
  require_equal(cols, e.cols(), "eval_into(dst, e): the shapes of dst and e differ", rows, cols, e.rows(), e.cols());
}

}  // namespace detail

// Evaluates e node by node into a new matrix of e's shape.
template <expression E>
result_t<E> eval(const E& e, naive_t) {
  result_t<E> out(e.rows(), e.cols());
  detail::naive_into(e, detail::dense(out.data(), out.rows(), out.cols(), out.row_stride()));
  return out;
}

// Evaluates e with the best strategy available for it.
template <expression E>
result_t<E> eval(const E& e) {
  return eval(e, naive);
}

// Evaluates e into existing storage (a matrix, or a view of mutable memory)
// of e's shape. When dst overlaps an input, e is evaluated aside first.
template <class Dst, class E>
  requires leaf<Dst> && expression<E>
void eval_into(Dst&& dst, const E& e, naive_t) {
  using D = detail::bare_t<Dst>;
  static_assert(static_extents_agree<D::static_rows, E::static_rows>, "qkv: eval_into(dst, e): the rows of dst differ from the rows of e");
  static_assert(static_extents_agree<D::static_cols, E::static_cols>, "qkv: eval_into(dst, e): the columns of dst differ from the columns of e");
  static_assert(std::is_same_v<value_type_t<D>, value_type_t<E>>, "qkv: eval_into(dst, e): dst and e have different element types");
  static_assert(!std::is_const_v<std::remove_pointer_t<decltype(dst.data())>>, "qkv: eval_into(dst, e): dst is read-only");
  detail::check_destination(dst.rows(), dst.cols(), e);
  const auto out = detail::dense(dst.data(), dst.rows(), dst.cols(), dst.row_stride());
  if (detail::reads_from(e, out)) {
    const auto tmp = eval(e, naive);
    detail::copy_strided(detail::dense(tmp.data(), tmp.rows(), tmp.cols(), tmp.row_stride()), out);
  } else {
    detail::naive_into(e, out);
  }
}

template <class Dst, class E>
void eval_into(Dst&& dst, const E& e) {
  eval_into(std::forward<Dst>(dst), e, naive);
}

}  // namespace qkv
