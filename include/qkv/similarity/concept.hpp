// What a similarity function is to qkv. The score of query q and key k is
//   s(q, k) = Σ_c f(q̃_c, k̃_c)           (or Σ_c f(q̃_c, k̃_c, c))
// where q̃ and k̃ are the rows of f.queries(Q) and f.keys(K) when f has those
// members (projections, normalisations: computed once per row, before any
// score), else of Q and K. f is called on numbers of the element type and on
// xsimd batches of them (W keys side by side, the query's component
// broadcast), so it is written once, generically:
//   auto l1 = [](auto q, auto k) { return -xsimd::abs(q - k); };   // −‖q − k‖₁
// f must be pure: the same arguments give the same result, whatever the
// order or the thread it is called in, and it may be copied.
#pragma once

#include <xsimd/xsimd.hpp>

#include <concepts>
#include <cstddef>
#include <type_traits>

namespace qkv {

template <class F, class T>
concept similarity_term = requires(const F& f, T x, xsimd::batch<T> v) {
  { f(x, x) } -> std::convertible_to<T>;
  { f(v, v) } -> std::convertible_to<xsimd::batch<T>>;
} || requires(const F& f, T x, xsimd::batch<T> v, std::size_t c) {
  { f(x, x, c) } -> std::convertible_to<T>;
  { f(v, v, c) } -> std::convertible_to<xsimd::batch<T>>;
};

namespace detail {

// f's term for component c, whichever of the two forms f has. (For an f
// of neither form the node's static_assert has said so: no more errors.)
template <class F, class V>
V call_term(const F& f, const V& q, const V& k, std::size_t c) {
  if constexpr (requires { static_cast<V>(f(q, k, c)); }) return static_cast<V>(f(q, k, c));
  else if constexpr (requires { static_cast<V>(f(q, k)); }) return static_cast<V>(f(q, k));
  else return V(0);
}

// Whether the checks of f's own type passed (a built-in similarity whose
// operands disagree says so itself; the node's checks then stay quiet).
template <class F>
constexpr bool similarity_well_formed() {
  if constexpr (requires { F::qkv_well_formed; }) return F::qkv_well_formed;
  else return true;
}

// The operand a similarity's term reads for Q (and K): f.queries(Q) if f has it.
template <class F, class Q>
decltype(auto) similarity_queries(const F& f, const Q& q) {
  if constexpr (requires { f.queries(q); }) return f.queries(q);
  else return (q);
}

template <class F, class K>
decltype(auto) similarity_keys(const F& f, const K& k) {
  if constexpr (requires { f.keys(k); }) return f.keys(k);
  else return (k);
}

}  // namespace detail
}  // namespace qkv
