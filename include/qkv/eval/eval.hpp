// eval(e), eval(e, strategy) and eval_into(dst, e): where an expression
// meets storage.
#pragma once

#include "../expr/expression.hpp"
#include "../shape/check.hpp"
#include "../storage/matrix.hpp"
#include "../storage/matrix_view.hpp"
#include "fused.hpp"
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
  const auto* lo = reinterpret_cast<const unsigned char*>(dst.ptr(0, 0));
  const auto* hi = reinterpret_cast<const unsigned char*>(dst.ptr(dst.rows - 1, dst.cols - 1) + 1);
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

namespace detail {

template <class Policy, class E>
result_t<E> evaluate(const E& e) {
  result_t<E> out(e.rows(), e.cols());
  node_into<Policy>(e, dense(out.data(), out.rows(), out.cols(), out.row_stride()));
  return out;
}

template <class Policy, class Dst, class E>
void evaluate_into(Dst&& dst, const E& e) {
  using D = bare_t<Dst>;
  static_assert(static_extents_agree<D::static_rows, E::static_rows>, "qkv: eval_into(dst, e): the rows of dst differ from the rows of e");
  static_assert(static_extents_agree<D::static_cols, E::static_cols>, "qkv: eval_into(dst, e): the columns of dst differ from the columns of e");
  static_assert(std::is_same_v<value_type_t<D>, value_type_t<E>>, "qkv: eval_into(dst, e): dst and e have different element types");
  static_assert(!std::is_const_v<std::remove_pointer_t<decltype(dst.data())>>, "qkv: eval_into(dst, e): dst is read-only");
  check_destination(dst.rows(), dst.cols(), e);
  const auto out = dense(dst.data(), dst.rows(), dst.cols(), dst.row_stride());
  if (reads_from(e, out)) {
    const auto tmp = evaluate<Policy>(e);
    copy_strided(dense(tmp.data(), tmp.rows(), tmp.cols(), tmp.row_stride()), out);
  } else {
    node_into<Policy>(e, out);
  }
}

template <class E>
constexpr void require_fused_form() {
  static_assert(has_fused_form<E>,
                "qkv: eval(e, qkv::fused): e has no fused form (fused evaluates softmax(S) * V, S being Q * "
                "transpose(K) scaled, causal, masked or plus a bias)");
}

}  // namespace detail

// Evaluates e with the best strategy: fused where a subexpression has a
// fused form, node by node elsewhere.
template <expression E>
result_t<E> eval(const E& e) {
  return detail::evaluate<detail::best_policy>(e);
}

// Evaluates e node by node into a new matrix of e's shape.
template <expression E>
result_t<E> eval(const E& e, naive_t) {
  return detail::evaluate<detail::naive_policy>(e);
}

// Evaluates e, which must have a fused form, with the fused kernel.
template <expression E>
result_t<E> eval(const E& e, fused_t) {
  detail::require_fused_form<E>();
  if constexpr (detail::has_fused_form<E>) return detail::evaluate<detail::best_policy>(e);
  else return result_t<E>();
}

// Evaluates e into existing storage (a matrix, or a view of mutable memory)
// of e's shape. When dst overlaps an input, e is evaluated aside first.
template <class Dst, class E>
  requires leaf<Dst> && expression<E>
void eval_into(Dst&& dst, const E& e, naive_t) {
  detail::evaluate_into<detail::naive_policy>(std::forward<Dst>(dst), e);
}

template <class Dst, class E>
  requires leaf<Dst> && expression<E>
void eval_into(Dst&& dst, const E& e, fused_t) {
  detail::require_fused_form<E>();
  if constexpr (detail::has_fused_form<E>) detail::evaluate_into<detail::best_policy>(std::forward<Dst>(dst), e);
}

template <class Dst, class E>
void eval_into(Dst&& dst, const E& e) {
  static_assert(leaf<Dst> && expression<E>, "qkv: eval_into(dst, e): dst must be a matrix or a mutable matrix_view");
  if constexpr (leaf<Dst> && expression<E>) detail::evaluate_into<detail::best_policy>(std::forward<Dst>(dst), e);
}

}  // namespace qkv
