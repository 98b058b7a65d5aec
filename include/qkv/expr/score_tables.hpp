// Tables a score modifier reads, as operands of the expression:
// score_mod(S, f, P...) calls f(s, b, h, i, j, p...) (or f(s, i, j, p...)),
// p an accessor of matrix P: p(r, c), or p(k) for a matrix of one row or one
// column. The indices may be integers, numbers of the element type or batches
// of them (then the read is a gather, lane by lane), so one f serves the
// scalar and the SIMD calls:
//   auto rel = [](auto s, std::size_t, std::size_t h, auto i, auto j, auto p) {
//     return s + p(h, i - j + decltype(i)(1023));   // a relative-position bias
//   };
//   auto e = softmax(causal(score_mod(Q * transpose(K), rel, P))) * V;
// Unlike a matrix the functor captures (a constant), P has a gradient:
// gradient(e, dO, wrt(P)) sums, into each entry, dS times f's derivative in
// the entry over every score that read it (fused: scatter-added per key
// group, summed in a fixed order, the same bits on any number of threads).
// A read outside P (a negative or too large index) gives NaN, and no
// gradient: the masks applied after f hide what hidden pairs read, and a
// visible pair that reads outside is the user's error, shown, not a crash.
#pragma once

#include "expression.hpp"
#include "../numeric/dual.hpp"

#include <xsimd/xsimd.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <utility>

namespace qkv {
namespace detail {

// The table reads of one call of f in the backward: read `active` is the
// variable (its derivative is f's tangent), each read's entry per lane
// (−1 where outside) is noted, so that the tangent can be added there.
struct table_reads {
  static constexpr std::size_t most_reads = 32, most_lanes = 16;
  std::size_t active = 0, count = 0;
  bool overflow = false;  // more reads than most_reads in a call
  std::size_t table[most_reads];           // (written before read: left
  long long at[most_reads][most_lanes];    // uninitialised, 4 KiB a call)
};
inline thread_local table_reads* active_table_reads = nullptr;

template <class X>
inline constexpr bool is_dual_v = false;
template <class V>
inline constexpr bool is_dual_v<dual<V>> = true;

// V without its dual (a number or a batch), and its element type.
template <class V>
struct undual {
  using type = V;
};
template <class V>
struct undual<dual<V>> {
  using type = V;
};
template <class V>
using undual_t = typename undual<V>::type;
template <class V>
using table_element_t = typename dual_element<undual_t<V>>::type;

// An index argument as a value: a dual's value, else itself.
template <class X>
const auto& index_value(const X& x) {
  if constexpr (is_dual_v<X>) return x.v;
  else return x;
}

// What f gets for a table: reads of T, shaped as V (a number, a batch, or a
// dual of either).
template <class T, class V>
class table_access {
  using plain = undual_t<V>;  // T or batch<T>
  static constexpr std::size_t lanes = [] {
    if constexpr (std::is_same_v<plain, T>) return std::size_t(1);
    else return plain::size;
  }();
  static_assert(lanes <= table_reads::most_lanes);

 public:
  table_access(const T* data, std::size_t rows, std::size_t cols, std::size_t stride, std::size_t id)
      : data_(data), rows_(rows), cols_(cols), stride_(stride), id_(id) {}

  template <class R, class C>
  V operator()(const R& r, const C& c) const {
    return read(as_plain(index_value(r)), as_plain(index_value(c)));
  }
  // One index, for a table of one row or one column (else every read is outside).
  template <class K>
  V operator()(const K& k) const {
    const plain x = as_plain(index_value(k)), zero(T(0));
    if (rows_ == 1) return read(zero, x);
    if (cols_ == 1) return read(x, zero);
    return read(plain(T(-1)), x);
  }
  std::size_t rows() const { return rows_; }
  std::size_t cols() const { return cols_; }

 private:
  template <class X>
  static plain as_plain(const X& x) {
    if constexpr (std::is_arithmetic_v<X>) return plain(static_cast<T>(x));
    else return x;
  }

  // Entry (r, c), truncated as a conversion to an integer truncates, lane
  // by lane; NaN outside. Places are computed in T, exact below 2^digits
  // (a table of up to 2^24 entries in float); a larger table's outside
  // reads say so rather than wrap.
  V read(const plain& r, const plain& c) const {
    using std::trunc;
    const plain rt = trunc(r), ct = trunc(c), zero(T(0));
    const auto inside = r >= zero && c >= zero && rt < plain(static_cast<T>(rows_)) && ct < plain(static_cast<T>(cols_)) &&
                        rt * plain(static_cast<T>(stride_)) + ct < plain(limit());
    alignas(64) T at[lanes], got[lanes];
    store(pick(inside, rt * plain(static_cast<T>(stride_)) + ct, zero), at);
    for (std::size_t l = 0; l < lanes; ++l) got[l] = data_[static_cast<std::size_t>(at[l])];
    const plain value = pick(inside, load(got), plain(std::numeric_limits<T>::quiet_NaN()));
    if constexpr (!is_dual_v<V>) {
      return value;
    } else {
      table_reads* reads = active_table_reads;
      if (reads == nullptr) return V(value);
      if (reads->count >= table_reads::most_reads) return reads->overflow = true, V(value);
      const std::size_t k = reads->count++;
      reads->table[k] = id_;
      alignas(64) T dense[lanes], in[lanes];
      store(rt * plain(static_cast<T>(cols_)) + ct, dense);
      store(pick(inside, plain(T(1)), zero), in);
      for (std::size_t l = 0; l < lanes; ++l) reads->at[k][l] = in[l] != T(0) ? static_cast<long long>(dense[l]) : -1;
      if (k != reads->active) return V(value);
      return V(value, plain(T(1)));  // the variable
    }
  }
  static T limit() { return std::ldexp(T(1), std::numeric_limits<T>::digits); }
  template <class C>
  static plain pick(const C& c, const plain& a, const plain& b) {
    if constexpr (lanes == 1) return c ? a : b;
    else return xsimd::select(c, a, b);
  }
  static void store(const plain& x, T* out) {
    if constexpr (lanes == 1) out[0] = x;
    else x.store_aligned(out);
  }
  static plain load(const T* x) {
    if constexpr (lanes == 1) return x[0];
    else return plain::load_aligned(x);
  }

  const T* data_;
  std::size_t rows_, cols_, stride_, id_;
};

// f(s, b, h, i, j, p...) or f(s, i, j, p...); key_aligned's own member for
// one that is key_aligned.
template <class G, class V, class... A>
auto call_tabled(const G& f, const V& s, std::size_t b, std::size_t h, const V& i, const V& j, const A&... p)
  requires requires { f.with_tables(s, b, h, i, j, p...); } || requires { f(s, b, h, i, j, p...); } ||
           requires { f(s, i, j, p...); }
{
  if constexpr (requires { f.with_tables(s, b, h, i, j, p...); }) return f.with_tables(s, b, h, i, j, p...);
  else if constexpr (requires { f(s, b, h, i, j, p...); }) return f(s, b, h, i, j, p...);
  else return f(s, i, j, p...);
}

}  // namespace detail

// f with the tables it reads: a modifier as the kernels call one, f(s, b, h,
// i, j), that hands f the accessors. operands() names the tables (aliasing,
// gradients).
template <class F, class... P>
class tabled_modifier {
 public:
  template <class... A>
  tabled_modifier(F f, A&&... p) : f_(std::move(f)), tables_(std::forward<A>(p)...) {}

  const F& function() const { return f_; }
  F& function() { return f_; }
  auto operands() const {
    return std::apply([](const auto&... p) { return std::tie(p...); }, tables_);
  }
  static constexpr std::size_t count = sizeof...(P);

  template <class V>
    requires requires(const F& f, const V& v, std::size_t b, const detail::table_access<detail::table_element_t<V>, V>& p) {
      detail::call_tabled(f, v, b, b, v, v, (void(sizeof(P)), p)...);
    }
  V operator()(const V& s, std::size_t b, std::size_t h, const V& i, const V& j) const {
    using E = detail::table_element_t<V>;
    return [&]<std::size_t... I>(std::index_sequence<I...>) -> V {
      return static_cast<V>(detail::call_tabled(f_, s, b, h, i, j, access<E, V, I>()...));
    }(std::index_sequence_for<P...>{});
  }

  // Entries in all, and where table t's start, in one flat row-major array
  // of the tables' gradients.
  std::size_t size() const {
    return std::apply([](const auto&... p) { return (std::size_t(0) + ... + (p.rows() * p.cols())); }, tables_);
  }
  std::size_t offset(std::size_t t) const {
    std::size_t at = 0, k = 0;
    std::apply([&](const auto&... p) { ((k++ < t ? at += p.rows() * p.cols() : 0), ...); }, tables_);
    return at;
  }

  // sums[entry] += g · ∂f/∂entry for each lane with g ≠ 0, f at (s, i, j):
  // f once per table read, that read the variable (up to
  // table_reads::most_reads reads a call; more throw). V a number or a batch.
  template <class V>
  void add_slopes(const V& s, std::size_t b, std::size_t h, const V& i, const V& j, const V& g, auto* sums) const {
    using D = dual<V>;
    constexpr std::size_t lanes = [] {
      if constexpr (std::is_arithmetic_v<V>) return std::size_t(1);
      else return V::size;
    }();
    using E = typename detail::dual_element<V>::type;
    alignas(64) E gl[lanes], dl[lanes];
    if constexpr (lanes == 1) gl[0] = g;
    else g.store_aligned(gl);
    detail::table_reads reads;
    struct restore {  // (also when f throws)
      detail::table_reads* outer;
      ~restore() { detail::active_table_reads = outer; }
    } const guard{std::exchange(detail::active_table_reads, &reads)};
    for (reads.active = 0; reads.active < detail::table_reads::most_reads; ++reads.active) {
      reads.count = 0;
      const D r = (*this)(D(s), b, h, D(i), D(j));
      if (reads.overflow)
        throw std::invalid_argument("qkv: gradient(e, dO, wrt(P)): score_mod's f reads its tables more than 32 times "
                                    "in one call: their gradients would be incomplete");
      if (reads.count <= reads.active) break;
      if constexpr (lanes == 1) dl[0] = r.d;
      else r.d.store_aligned(dl);
      const std::size_t t = reads.table[reads.active];
      for (std::size_t l = 0; l < lanes; ++l) {
        const long long at = reads.at[reads.active][l];
        if (gl[l] == E(0) || at < 0) continue;
        sums[offset(t) + static_cast<std::size_t>(at)] += gl[l] * dl[l];
      }
    }
  }

 private:
  template <class E, class V, std::size_t I>
  detail::table_access<E, V> access() const {
    const auto& p = std::get<I>(tables_);
    return {p.data(), p.rows(), p.cols(), static_cast<std::size_t>(p.row_stride()), I};
  }

  [[no_unique_address]] F f_;
  std::tuple<P...> tables_;
};

namespace detail {
template <class F>
inline constexpr bool is_tabled_v = false;
template <class F, class... P>
inline constexpr bool is_tabled_v<tabled_modifier<F, P...>> = true;
}  // namespace detail

}  // namespace qkv
