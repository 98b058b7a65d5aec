// A * B: the matrix product of two expressions.
#pragma once

#include "../shape/check.hpp"
#include "elementwise.hpp"
#include "node.hpp"
#include "softmax.hpp"
#include "transpose.hpp"

#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace qkv {

namespace detail {

// The batch extents of the keys a softmax's scores read (the right operand
// of the chain's core: K of Q * transpose(K) or of a similarity), or none
// where they are not a chain: what softmax(S) * V checks V's heads against.
template <class S>
constexpr bool walks_to_keys = is_softmax_v<S> || (!is_transpose_v<S> && requires(const S& s) { s.arg(); });
template <class S>
std::optional<batch_extents> keys_batch(const S& s) {
  if constexpr (walks_to_keys<S>) {
    return keys_batch(s.arg());
  } else if constexpr (is_elementwise_v<S>) {
    if (const auto b = keys_batch(s.lhs())) return b;
    return keys_batch(s.rhs());
  } else if constexpr (requires { s.lhs(); s.rhs(); }) {
    return batch_of(s.rhs());
  } else {
    return std::nullopt;
  }
}
template <class S>
constexpr std::optional<batch_extents> static_keys_batch() {
  if constexpr (walks_to_keys<S>) {
    return static_keys_batch<bare_t<decltype(std::declval<const S&>().arg())>>();
  } else if constexpr (is_elementwise_v<S>) {
    constexpr auto b = static_keys_batch<bare_t<decltype(std::declval<const S&>().lhs())>>();
    if (b) return b;
    return static_keys_batch<bare_t<decltype(std::declval<const S&>().rhs())>>();
  } else if constexpr (requires(const S& s) { s.lhs(); s.rhs(); }) {
    return static_batch_of<bare_t<decltype(std::declval<const S&>().rhs())>>();
  } else {
    return std::nullopt;
  }
}
// Keys and values of one attention: the same heads (K and V of a grouped
// query attention are both the fewer heads), the batch as for a sum.
constexpr bool keys_values_agree(batch_extents k, batch_extents v) {
  return batch_extent_agrees(k[0], v[0], false) && (k[1] == v[1] || k[1] == dyn || v[1] == dyn);
}
template <class A, class B>
constexpr bool static_keys_values_agree() {
  if constexpr (!is_softmax_v<A>) return true;
  else {
    constexpr auto k = static_keys_batch<A>();
    return !k || keys_values_agree(*k, static_batch_of<B>());
  }
}

}  // namespace detail

template <class A, class B>
class product_expr
    : public detail::binary<A, B, detail::bare_t<A>::static_rows, detail::bare_t<B>::static_cols, true> {
  using a_t = detail::bare_t<A>;
  using b_t = detail::bare_t<B>;
  static constexpr batch_extents a_batch = detail::static_batch_of<a_t>(), b_batch = detail::static_batch_of<b_t>();
  static_assert(value_element<value_type_t<A>>, "qkv: A * B: A must be a float or double matrix, or a bf16 or f16 one (bool is for masks)");
  static_assert(mixable_elements<value_type_t<A>, value_type_t<B>>, "qkv: A * B: A and B have different element types (float mixes with bf16 or f16, nothing else)");
  static_assert(static_extents_agree<a_t::static_cols, b_t::static_rows>, "qkv: A * B: the columns of A differ from the rows of B");
  static_assert(static_batches_agree<a_batch[0], a_batch[1], b_batch[0], b_batch[1], true>,
                "qkv: A * B: the batch extents of A and B differ (each pair must be equal, or one 1, or A's a multiple of B's: more query heads than key heads)");
  static_assert(detail::static_keys_values_agree<a_t, b_t>(),
                "qkv: softmax(S) * V: K and V have different heads (grouped-query attention needs K and V with the same heads, Q's a multiple of theirs)");

 public:
  template <class L, class R>
  product_expr(L&& a, R&& b)
      : detail::binary<A, B, a_t::static_rows, b_t::static_cols, true>(std::forward<L>(a), std::forward<R>(b)) {
    this->require_batch("A * B: the batch extents of A and B differ");
    if constexpr (is_softmax_v<a_t>) {
      const auto k = detail::keys_batch(this->lhs());
      if (k && !detail::keys_values_agree(*k, detail::batch_of(this->rhs())))
        throw shape_error("qkv: softmax(S) * V: K and V have different heads (K " + detail::batch_string(*k) + ", V " +
                          detail::batch_string(detail::batch_of(this->rhs())) +
                          "); grouped-query attention needs K and V with the same heads, Q's a multiple of theirs");
    }
    detail::require_equal(this->lhs().cols(), this->rhs().rows(), "A * B: the columns of A differ from the rows of B",
                          this->lhs().rows(), this->lhs().cols(), this->rhs().rows(), this->rhs().cols());
  }

  std::size_t rows() const { return this->lhs().rows(); }
  std::size_t cols() const { return this->rhs().cols(); }

  template <class L, class R>
  auto rebuild(L&& a, R&& b) const {
    return product_expr<detail::closure_t<L&&>, detail::closure_t<R&&>>(std::forward<L>(a), std::forward<R>(b));
  }
  // n×k by k×m: 2·n·k·m.
  static constexpr detail::node_work work(const product_expr* e) {
    return {2 * detail::rows_of(e) * detail::cols_of(detail::lhs_of(e)) * detail::cols_of(e)};
  }
};

template <class E>
inline constexpr bool is_product_v = false;
template <class A, class B>
inline constexpr bool is_product_v<product_expr<A, B>> = true;

template <expression A, expression B>
auto operator*(A&& a, B&& b) {
  return product_expr<detail::closure_t<A&&>, detail::closure_t<B&&>>(std::forward<A>(a), std::forward<B>(b));
}

}  // namespace qkv
