// key_aligned(f): a score modifier or a predicate that sees the query's
// position among the keys, i' = i + (m − n), instead of its row i of Q: the
// alignment causal and window use, with the last query at the last key. With
// a cache (n < m) the new queries are the last positions of the sequence:
//   auto alibi = qkv::key_aligned([](auto s, auto i, auto j) { return s - 0.5f * (i - j); });
//   auto pred = qkv::key_aligned([](auto i, auto j) { return j <= i && i - j < 256; });
// The node that takes it (score_mod, masked) tells it m − n. A modifier gets
// i' as a value of the element type; a predicate gets i' and j as
// std::ptrdiff_t (i' < 0 for the first n − m rows when n > m), and so does a
// block hint any(i0, i1, j0, j1) the predicate has. Under positions(S, q0, k0)
// (expr/positions.hpp) f gets the positions q0 + i and k0 + j instead.
#pragma once

#include "../numeric/number_as.hpp"

#include <cstddef>
#include <type_traits>
#include <utility>

namespace qkv {

template <class F>
class key_aligned_t {
 public:
  explicit key_aligned_t(F f) : f_(std::move(f)) {}

  const F& function() const { return f_; }
  std::ptrdiff_t offset() const { return offset_; }
  std::ptrdiff_t key_offset() const { return key_offset_; }
  // What f reads, for the walks that look inside functors (aliasing, gradients).
  auto operands() const
    requires requires(const F& f) { f.operands(); }
  {
    return f_.operands();
  }
  // The shape of the scores it is applied to (score_mod and masked call it),
  // unless their positions placed it.
  void place(std::size_t rows, std::size_t cols) {
    if (!positioned_) offset_ = static_cast<std::ptrdiff_t>(cols) - static_cast<std::ptrdiff_t>(rows);
  }
  // Row i at q0 + i, key j at k0 + j (positions(S, q0, k0)).
  void position(std::ptrdiff_t q0, std::ptrdiff_t k0) {
    positioned_ = true, offset_ = q0, key_offset_ = k0;
  }

  // Modifiers: f(s, i', j) and f(s, b, h, i', j).
  template <class V>
    requires requires(const F& f, const V& v) { f(v, v, v); }
  auto operator()(const V& s, const V& i, const V& j) const {
    return f_(s, i + shift<V>(offset_), j + shift<V>(key_offset_));
  }
  template <class V>
    requires requires(const F& f, const V& v, std::size_t b) { f(v, b, b, v, v); }
  auto operator()(const V& s, std::size_t b, std::size_t h, const V& i, const V& j) const {
    return f_(s, b, h, i + shift<V>(offset_), j + shift<V>(key_offset_));
  }
  // With the tables of score_mod(S, f, P...): f(s, b, h, i', j, p...) or
  // f(s, i', j, p...). (A member of its own: a call of four arguments
  // would also try the predicates' forms.)
  template <class V, class... P>
  auto with_tables(const V& s, std::size_t b, std::size_t h, const V& i, const V& j, const P&... p) const
    requires requires(const F& f, const V& v, std::size_t x) { f(v, x, x, v, v, p...); } ||
             requires(const F& f, const V& v) { f(v, v, v, p...); }
  {
    if constexpr (requires { f_(s, b, h, i, j, p...); }) return f_(s, b, h, i + shift<V>(offset_), j + shift<V>(key_offset_), p...);
    else return f_(s, i + shift<V>(offset_), j + shift<V>(key_offset_), p...);
  }

  // Predicates: pred(i', j) and pred(b, h, i', j), on signed positions.
  bool operator()(std::size_t i, std::size_t j) const
    requires requires(const F& f, std::ptrdiff_t x) { f(x, x); }
  {
    return static_cast<bool>(f_(row(i), col(j)));
  }
  bool operator()(std::size_t b, std::size_t h, std::size_t i, std::size_t j) const
    requires requires(const F& f, std::size_t x, std::ptrdiff_t y) { f(x, x, y, y); }
  {
    return static_cast<bool>(f_(b, h, row(i), col(j)));
  }
  // Block hints, in the same coordinates.
  bool any(std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) const
    requires requires(const F& f, std::ptrdiff_t x) { f.any(x, x, x, x); }
  {
    return f_.any(row(i0), row(i1), col(j0), col(j1));
  }
  bool any(std::size_t b, std::size_t h, std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) const
    requires requires(const F& f, std::size_t x, std::ptrdiff_t y) { f.any(x, x, y, y, y, y); }
  {
    return f_.any(b, h, row(i0), row(i1), col(j0), col(j1));
  }

 private:
  std::ptrdiff_t row(std::size_t i) const { return static_cast<std::ptrdiff_t>(i) + offset_; }
  std::ptrdiff_t col(std::size_t j) const { return static_cast<std::ptrdiff_t>(j) + key_offset_; }
  template <class V>
  static V shift(std::ptrdiff_t x) {
    return detail::number_as<V>(x);
  }

  [[no_unique_address]] F f_;
  std::ptrdiff_t offset_ = 0, key_offset_ = 0;
  bool positioned_ = false;
};

template <class F>
key_aligned_t<F> key_aligned(F f) {
  return key_aligned_t<F>(std::move(f));
}

namespace detail {

template <class F>
inline constexpr bool is_key_aligned_v = false;
template <class F>
inline constexpr bool is_key_aligned_v<key_aligned_t<F>> = true;

// Tells a key_aligned functor the shape of its scores; others need nothing.
template <class F>
void place_functor(F& f, std::size_t rows, std::size_t cols) {
  if constexpr (is_key_aligned_v<F>) f.place(rows, cols);
}

}  // namespace detail

}  // namespace qkv
