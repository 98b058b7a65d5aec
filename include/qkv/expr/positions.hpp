// positions(S, q0, k0): where the rows and columns of the scores S stand in
// the sequence. Row i is at position q0 + i and key j at k0 + j, so causal
// and windows compare q0 + i with k0 + j instead of aligning the last query
// with the last key:
//   causal(positions(S, 0, 0))           top-left causal (PyTorch's is_causal, n ≠ m)
//   window(positions(S, q0, 0), w)       the first part of a split cache, keys 0 … m₁ − 1
//   window(positions(S, q0, m₁), w)      the second part, keys m₁ … m − 1
// key_aligned functors get (q0 + i, k0 + j); other functors still the row
// and column of S. The values of S pass through unchanged.
//
// Wherever it is written in a score chain, the node is moved next to the
// chain's core (under causal, windows, masks, modifiers and scaling), so
// every node of the chain finds it below itself (find_positions).
#pragma once

#include "elementwise.hpp"
#include "key_aligned.hpp"
#include "node.hpp"
#include "score_tables.hpp"
#include "softmax.hpp"
#include "transpose.hpp"

#include <concepts>
#include <cstddef>
#include <optional>
#include <utility>

namespace qkv {

template <class S>
class positions_expr : public detail::same_shape_unary<S> {
  static_assert(value_element<value_type_t<S>>,
                "qkv: positions(S, q0, k0): S must be a score matrix of float or double, or of bf16 or f16");

 public:
  template <class A>
  positions_expr(A&& s, std::ptrdiff_t q0, std::ptrdiff_t k0)
      : detail::same_shape_unary<S>(std::forward<A>(s)), q0_(q0), k0_(k0) {}

  std::ptrdiff_t query_origin() const { return q0_; }
  std::ptrdiff_t key_origin() const { return k0_; }

  template <class Y>
  auto rebuild(Y&& y) const {
    return positions_expr<detail::closure_t<Y&&>>(std::forward<Y>(y), q0_, k0_);
  }

 private:
  std::ptrdiff_t q0_, k0_;
};

template <class E>
inline constexpr bool is_positions_v = false;
template <class S>
inline constexpr bool is_positions_v<positions_expr<S>> = true;

namespace detail {

// Where a chain's rows and keys stand: row i at q0 + i, key j at k0 + j.
struct placement {
  std::ptrdiff_t q0 = 0, k0 = 0;
};

// The nodes a chain's positions pass through: one score argument, the same
// shape (not a softmax, not a transpose).
template <class S>
concept positions_pass_through =
    !is_softmax_v<S> && !is_transpose_v<S> && !is_positions_v<S> && requires(const S& s) { s.arg(); };

// The positions of a chain, found below s (at s itself, or under its
// nodes, or on either side of a bias); none when it has none.
template <class S>
constexpr std::optional<placement> find_positions(const S& s) {
  if constexpr (is_positions_v<S>) {
    return placement{s.query_origin(), s.key_origin()};
  } else if constexpr (positions_pass_through<S>) {
    return find_positions(s.arg());
  } else if constexpr (is_elementwise_v<S>) {
    if (auto p = find_positions(s.lhs())) return p;
    return find_positions(s.rhs());
  } else {
    return std::nullopt;
  }
}

template <class S>
constexpr bool has_positions() {
  if constexpr (is_positions_v<S>) return true;
  else if constexpr (positions_pass_through<S>) return has_positions<bare_t<decltype(std::declval<const S&>().arg())>>();
  else if constexpr (is_elementwise_v<S>)
    return has_positions<bare_t<decltype(std::declval<const S&>().lhs())>>() ||
           has_positions<bare_t<decltype(std::declval<const S&>().rhs())>>();
  else return false;
}

// How a node holds its operands: by reference (the user's object, which
// outlives the node) or by value (a temporary the node owns, which must be
// copied into a rebuilt node).
template <class X>
constexpr bool holds_by_reference(const same_shape_unary<X>*) {
  return std::is_reference_v<X>;
}
template <class A, class B, std::size_t R, std::size_t C, bool G>
constexpr std::pair<bool, bool> holds_by_reference(const binary<A, B, R, C, G>*) {
  return {std::is_reference_v<A>, std::is_reference_v<B>};
}

// An operand x of a node, to hand to a rebuilt node: the same reference,
// or a copy of what the node owned.
template <bool Reference, class X>
decltype(auto) pass_on(const X& x) {
  if constexpr (Reference) return x;
  else return X(x);
}

// Tells a key_aligned functor applied to `scores` where they stand: their
// positions, or else their shape (the last query at the last key).
template <class F, class S>
void place_functor_over(F& f, const S& scores) {
  if constexpr (is_tabled_v<F>) {  // score_mod(S, f, P...)'s own f
    place_functor_over(f.function(), scores);
  } else if constexpr (is_key_aligned_v<F>) {
    if (const auto p = find_positions(scores)) f.position(p->q0, p->k0);
    else f.place(scores.rows(), scores.cols());
  }
}

template <class X>
inline constexpr bool storage_operand = leaf<X> || tensor_leaf<X>;

// The nodes positions are moved under: the chain's unary nodes, a mask
// matrix's scores, a bias's scores.
template <class S>
concept positions_move_under =
    (positions_pass_through<S> && (requires(const S& s) { s.rebuild(s.arg()); } ||
                                   requires(const S& s) { s.rebuild(s.arg(), s.mask()); })) ||
    (is_elementwise_v<S> && !(storage_operand<bare_t<decltype(std::declval<const S&>().lhs())>> &&
                              storage_operand<bare_t<decltype(std::declval<const S&>().rhs())>>));

template <bool Reference, class X>
auto place_positions_in(const X& x, std::ptrdiff_t q0, std::ptrdiff_t k0);

// s, rebuilt with positions (q0, k0) next to its core.
template <positions_move_under S>
auto place_positions(const S& s, std::ptrdiff_t q0, std::ptrdiff_t k0) {
  constexpr auto ref = holds_by_reference(static_cast<const S*>(nullptr));
  if constexpr (requires { s.rebuild(s.arg()); }) {
    return s.rebuild(place_positions_in<ref>(s.arg(), q0, k0));
  } else if constexpr (requires { s.mask(); }) {
    return s.rebuild(place_positions_in<ref.first>(s.arg(), q0, k0), pass_on<ref.second>(s.mask()));
  } else if constexpr (!storage_operand<bare_t<decltype(s.lhs())>>) {
    return s.rebuild(place_positions_in<ref.first>(s.lhs(), q0, k0), pass_on<ref.second>(s.rhs()));
  } else {
    return s.rebuild(pass_on<ref.first>(s.lhs()), place_positions_in<ref.second>(s.rhs(), q0, k0));
  }
}
// The same for an operand its node holds as Reference says: a node the
// positions move under is rebuilt; where they stop, the new node holds the
// operand as the old one did.
template <bool Reference, class X>
auto place_positions_in(const X& x, std::ptrdiff_t q0, std::ptrdiff_t k0) {
  if constexpr (positions_move_under<X>) return place_positions(x, q0, k0);
  else if constexpr (Reference) return positions_expr<const X&>(x, q0, k0);
  else return positions_expr<X>(x, q0, k0);
}

}  // namespace detail

template <expression S, std::integral Q, std::integral K>
auto positions(S&& s, Q q0, K k0) {
  using s_t = detail::bare_t<S>;
  static_assert(!is_softmax_v<s_t>, "qkv: positions(S, q0, k0): S must be scores, not a softmax (write softmax(positions(S, q0, k0)))");
  static_assert(!detail::has_positions<s_t>(), "qkv: positions(S, q0, k0): S has positions already");
  const auto q = static_cast<std::ptrdiff_t>(q0), k = static_cast<std::ptrdiff_t>(k0);
  if constexpr (detail::positions_move_under<s_t>)
    return detail::place_positions(s, q, k);  // (a temporary s is copied node by node)
  else
    return positions_expr<detail::closure_t<S&&>>(std::forward<S>(s), q, k);
}

// What is not a score matrix.
template <class S, class... I>
  requires(!expression<S>)
auto positions(S&&, I...) {
  static_assert(expression<S>, "qkv: positions(S, q0, k0): S must be a score matrix (an expression such as Q * transpose(K))");
}

}  // namespace qkv
