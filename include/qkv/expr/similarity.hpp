// similarity(Q, K, f): the n×m scores s(q_i, k_j) of a similarity function
// (similarity/concept.hpp), and the nodes the built-in ones lower to:
// normalize_rows(X) for the cosine, neg_sq_l2_expr for −‖q − k‖².
#pragma once

#include "../shape/check.hpp"
#include "../similarity/concept.hpp"
#include "node.hpp"

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace qkv {

// Scores Σ_c f(q̃_c, k̃_c), one per query row and key row.
template <class Q, class K, class F>
class similarity_expr
    : public detail::binary<Q, K, detail::bare_t<Q>::static_rows, detail::bare_t<K>::static_rows, true> {
  using q_t = detail::bare_t<Q>;
  using k_t = detail::bare_t<K>;
  using base = detail::binary<Q, K, q_t::static_rows, k_t::static_rows, true>;
  using q_in = detail::bare_t<decltype(detail::similarity_queries(std::declval<const F&>(), std::declval<const q_t&>()))>;
  using k_in = detail::bare_t<decltype(detail::similarity_keys(std::declval<const F&>(), std::declval<const k_t&>()))>;
  static_assert(value_element<value_type_t<Q>>, "qkv: similarity(Q, K, f): Q must be a float or double matrix, or a bf16 or f16 one");
  static_assert(mixable_elements<value_type_t<Q>, value_type_t<K>>, "qkv: similarity(Q, K, f): Q and K have different element types (float mixes with bf16 or f16, nothing else)");
  static_assert(similarity_term<F, compute_t<value_type_t<Q>>>,
                "qkv: similarity(Q, K, f): f must be callable as f(q, k) or f(q, k, c) on numbers and on xsimd batches");
  static_assert(static_extents_agree<q_in::static_cols, k_in::static_cols> || !detail::similarity_well_formed<F>(),
                "qkv: similarity(Q, K, f): the rows of Q and of K (after f's queries and keys) have different lengths");
  static constexpr batch_extents q_batch = detail::static_batch_of<q_t>(), k_batch = detail::static_batch_of<k_t>();
  static_assert(static_batches_agree<q_batch[0], q_batch[1], k_batch[0], k_batch[1], true>,
                "qkv: similarity(Q, K, f): the batch extents of Q and K differ");

 public:
  template <class A, class B>
  similarity_expr(A&& q, B&& k, F f) : base(std::forward<A>(q), std::forward<B>(k)), f_(std::move(f)) {
    this->require_batch("similarity(Q, K, f): the batch extents of Q and K differ");
    const auto& qs = detail::similarity_queries(f_, this->lhs());
    const auto& ks = detail::similarity_keys(f_, this->rhs());
    detail::require_equal(qs.cols(), ks.cols(),
                          "similarity(Q, K, f): the rows of Q and of K (after f's queries and keys) have different lengths",
                          qs.rows(), qs.cols(), ks.rows(), ks.cols());
  }

  std::size_t rows() const { return this->lhs().rows(); }
  std::size_t cols() const { return this->rhs().rows(); }
  const F& function() const { return f_; }

  template <class A, class B>
  auto rebuild(A&& q, B&& k) const {
    return similarity_expr<detail::closure_t<A&&>, detail::closure_t<B&&>, F>(std::forward<A>(q), std::forward<B>(k), f_);
  }
  // What the evaluator reads: f's queries(Q) and keys(K), each in a buffer.
  auto evaluated_operands() const {
    using qs = decltype(detail::similarity_queries(f_, this->lhs()));
    using ks = decltype(detail::similarity_keys(f_, this->rhs()));
    return std::tuple<qs, ks>(detail::similarity_queries(f_, this->lhs()), detail::similarity_keys(f_, this->rhs()));
  }
  // What each score sums over: the length of f's query (and key) rows; e
  // null in a walk over types alone, where it is static.
  static constexpr std::size_t width_of(const similarity_expr* e) {
    if constexpr (is_static(q_in::static_cols)) return q_in::static_cols;
    else return detail::similarity_queries(e->function(), e->lhs()).cols();
  }
  // A term counts as a multiply and an add, whatever the user wrote.
  static constexpr detail::node_work work(const similarity_expr* e) {
    return {2 * detail::rows_of(e) * detail::cols_of(e) * width_of(e)};
  }

 private:
  [[no_unique_address]] F f_;
};

// Each row divided by its Euclidean norm (a row of zeros stays zeros): the
// cosine similarity is normalize_rows(Q) * transpose(normalize_rows(K)).
template <class X>
class row_normalized_expr : public detail::same_shape_unary<X> {
  static_assert(value_element<value_type_t<X>>, "qkv: normalize_rows(X): X must be a float or double matrix, or a bf16 or f16 one");

 public:
  using detail::same_shape_unary<X>::same_shape_unary;

  template <class Y>
  auto rebuild(Y&& y) const {
    return row_normalized_expr<detail::closure_t<Y&&>>(std::forward<Y>(y));
  }
  // A sum of squares, a square root and a division per element.
  static constexpr detail::node_work work(const row_normalized_expr* e) {
    return {3 * detail::rows_of(e) * detail::cols_of(e)};
  }
};

// −‖q_i − k_j‖², evaluated as 2 q·k − ‖q‖² − ‖k‖² with the norms computed once.
template <class Q, class K>
class neg_sq_l2_expr
    : public detail::binary<Q, K, detail::bare_t<Q>::static_rows, detail::bare_t<K>::static_rows, true> {
  using q_t = detail::bare_t<Q>;
  using k_t = detail::bare_t<K>;
  using base = detail::binary<Q, K, q_t::static_rows, k_t::static_rows, true>;
  static_assert(value_element<value_type_t<Q>>, "qkv: similarity(Q, K, neg_sq_l2): Q must be a float or double matrix, or a bf16 or f16 one");
  static_assert(mixable_elements<value_type_t<Q>, value_type_t<K>>,
                "qkv: similarity(Q, K, neg_sq_l2): Q and K have different element types (float mixes with bf16 or f16, nothing else)");
  static_assert(static_extents_agree<q_t::static_cols, k_t::static_cols>,
                "qkv: similarity(Q, K, neg_sq_l2): the rows of Q and of K have different lengths");
  static constexpr batch_extents q_batch = detail::static_batch_of<q_t>(), k_batch = detail::static_batch_of<k_t>();
  static_assert(static_batches_agree<q_batch[0], q_batch[1], k_batch[0], k_batch[1], true>,
                "qkv: similarity(Q, K, neg_sq_l2): the batch extents of Q and K differ");

 public:
  template <class A, class B>
  neg_sq_l2_expr(A&& q, B&& k) : base(std::forward<A>(q), std::forward<B>(k)) {
    this->require_batch("similarity(Q, K, neg_sq_l2): the batch extents of Q and K differ");
    detail::require_equal(this->lhs().cols(), this->rhs().cols(),
                          "similarity(Q, K, neg_sq_l2): the rows of Q and of K have different lengths",
                          this->lhs().rows(), this->lhs().cols(), this->rhs().rows(), this->rhs().cols());
  }

  std::size_t rows() const { return this->lhs().rows(); }
  std::size_t cols() const { return this->rhs().rows(); }

  template <class A, class B>
  auto rebuild(A&& q, B&& k) const {
    return neg_sq_l2_expr<detail::closure_t<A&&>, detail::closure_t<B&&>>(std::forward<A>(q), std::forward<B>(k));
  }
  // 2 q·k − ‖q‖² − ‖k‖²: the products, the norms (kept beside the result), three operations per score.
  static constexpr detail::node_work work(const neg_sq_l2_expr* e) {
    const std::size_t n = detail::rows_of(e), m = detail::cols_of(e), d = detail::cols_of(detail::lhs_of(e));
    return {2 * n * m * d + 2 * (n + m) * d + 3 * n * m, 0, (n + m) * sizeof(compute_t<value_type_t<Q>>)};
  }
};

template <class E>
inline constexpr bool is_similarity_v = false;
template <class Q, class K, class F>
inline constexpr bool is_similarity_v<similarity_expr<Q, K, F>> = true;
template <class E>
inline constexpr bool is_neg_sq_l2_v = false;
template <class Q, class K>
inline constexpr bool is_neg_sq_l2_v<neg_sq_l2_expr<Q, K>> = true;
template <class E>
inline constexpr bool is_row_normalized_v = false;
template <class X>
inline constexpr bool is_row_normalized_v<row_normalized_expr<X>> = true;

template <expression X>
auto normalize_rows(X&& x) {
  return row_normalized_expr<detail::closure_t<X&&>>(std::forward<X>(x));
}

// A similarity of the user's (the built-ins have overloads of their own, in
// similarity/builtin.hpp).
template <expression Q, expression K, class F>
auto similarity(Q&& q, K&& k, F f) {
  return similarity_expr<detail::closure_t<Q&&>, detail::closure_t<K&&>, F>(std::forward<Q>(q), std::forward<K>(k),
                                                                            std::move(f));
}

}  // namespace qkv
