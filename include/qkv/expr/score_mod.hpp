// score_mod(S, f): S(i, j) → f(S(i, j), i, j), an elementwise function of a
// score and its position, applied inside the fused loop: soft-capping
// c·tanh(s/c), ALiBi s − slope·(i − j), relative-position terms. f is called
// on numbers of the element type (s, and i and j converted to it) and on
// xsimd batches of them (W keys side by side), so it is written once:
//   auto alibi = [](auto s, auto i, auto j) { return s - 0.5f * (i - j); };
// f(s, b, h, i, j) gets the batch and head indices too. i is the row of Q;
// key_aligned(f) hands f the row's position among the keys instead.
// f must be pure (same arguments, same result, on any thread) and copyable.
// score_mod(S, f, P...) hands f tables that have gradients (score_tables.hpp).
#pragma once

#include "key_aligned.hpp"
#include "positions.hpp"
#include "node.hpp"
#include "score_tables.hpp"

#include <xsimd/xsimd.hpp>

#include <concepts>
#include <utility>

namespace qkv {

// f(s, i, j), or f(s, b, h, i, j) with the slice's batch and head indices
// (std::size_t; 0 for a matrix): per-head ALiBi slopes, per-sequence lengths.
template <class F, class T>
concept score_modifier = requires(const F& f, T x, xsimd::batch<T> v) {
  { f(x, x, x) } -> std::convertible_to<T>;
  { f(v, v, v) } -> std::convertible_to<xsimd::batch<T>>;
};
template <class F, class T>
concept indexed_score_modifier = requires(const F& f, T x, xsimd::batch<T> v, std::size_t b) {
  { f(x, b, b, x, x) } -> std::convertible_to<T>;
  { f(v, b, b, v, v) } -> std::convertible_to<xsimd::batch<T>>;
};

namespace detail {

// f(s, b, h, i, j) or f(s, i, j) as a V, whichever f takes. (For an f not
// callable so the node's static_assert has said so: s unchanged, and no
// more errors.)
template <class F, class V>
V call_modifier(const F& f, const V& s, const V& i, const V& j, std::size_t b = 0, std::size_t h = 0) {
  if constexpr (requires { static_cast<V>(f(s, b, h, i, j)); }) return static_cast<V>(f(s, b, h, i, j));
  else if constexpr (requires { static_cast<V>(f(s, i, j)); }) return static_cast<V>(f(s, i, j));
  else return s;
}

}  // namespace detail

template <class S, class F>
class score_mod_expr : public detail::same_shape_unary<S>, public detail::slice_position {
  static_assert(value_element<value_type_t<S>>, "qkv: score_mod(S, f): S must be a float or double matrix, or a bf16 or f16 one");
  static_assert(score_modifier<F, compute_t<value_type_t<S>>> || indexed_score_modifier<F, compute_t<value_type_t<S>>>,
                "qkv: score_mod(S, f): f must be callable as f(s, i, j) or f(s, b, h, i, j) on numbers and on xsimd batches "
                "(s, i and j arrive as numbers of S's element type or batches of them, b and h as std::size_t: "
                "write (auto s, auto i, auto j))");

 public:
  template <class A>
  score_mod_expr(A&& s, F f) : detail::same_shape_unary<S>(std::forward<A>(s)), f_(std::move(f)) {
    detail::place_functor_over(f_, this->arg());
  }

  const F& function() const { return f_; }

  template <class Y>
  auto rebuild(Y&& y) const {
    score_mod_expr<detail::closure_t<Y&&>, F> r(std::forward<Y>(y), f_);
    r.at_slice(position());
    return r;
  }
  // f counts as one operation per score, whatever the user wrote.
  static constexpr detail::node_work work(const score_mod_expr* e) { return {detail::rows_of(e) * detail::cols_of(e)}; }

 private:
  [[no_unique_address]] F f_;
};

template <class E>
inline constexpr bool is_score_mod_v = false;
template <class S, class F>
inline constexpr bool is_score_mod_v<score_mod_expr<S, F>> = true;

template <expression S, class F>
auto score_mod(S&& s, F f) {
  return score_mod_expr<detail::closure_t<S&&>, F>(std::forward<S>(s), std::move(f));
}

// score_mod(S, f, P...): f(s, b, h, i, j, p...) (or f(s, i, j, p...)) reads
// matrices P through accessors p, and gradient(e, dO, wrt(P)) gives theirs.
namespace detail {
// What score_mod(S, f, P...) builds in place of one it rejected, after its
// message: s unchanged, and no more errors.
struct unchanged_score {
  template <class V>
  V operator()(const V& s, const V&, const V&) const {
    return s;
  }
};
}  // namespace detail

template <expression S, class F, expression... P>
  requires(sizeof...(P) > 0)
auto score_mod(S&& s, F f, P&&... p) {
  using T = compute_t<std::remove_const_t<value_type_t<detail::bare_t<S>>>>;
  constexpr bool tables = ((leaf<P> && std::is_same_v<std::remove_const_t<value_type_t<detail::bare_t<P>>>, T>) && ...);
  static_assert(tables, "qkv: score_mod(S, f, P...): each P must be a matrix or matrix_view of S's compute type (float "
                        "for bf16 and f16 scores)");
  using G = tabled_modifier<F, detail::closure_t<P&&>...>;
  constexpr bool callable = [] {
    if constexpr (tables) return indexed_score_modifier<G, T>;
    else return true;
  }();
  static_assert(callable,
                "qkv: score_mod(S, f, P...): f must be callable as f(s, b, h, i, j, p...) or f(s, i, j, p...) on "
                "numbers and on xsimd batches, each p an accessor p(r, c) or p(k) of a P (write (auto s, std::size_t b, "
                "std::size_t h, auto i, auto j, auto p))");
  if constexpr (tables && callable) {
    return score_mod_expr<detail::closure_t<S&&>, G>(std::forward<S>(s), G(std::move(f), std::forward<P>(p)...));
  } else {
    (void)f, ((void)p, ...);
    return score_mod_expr<detail::closure_t<S&&>, detail::unchanged_score>(std::forward<S>(s), {});
  }
}

}  // namespace qkv
