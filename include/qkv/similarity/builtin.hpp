// The built-in similarities. Each lowers to nodes the strategies already
// fuse where it can: dot is Q * transpose(K); bilinear(W) is (Q W) Kᵀ;
// cosine normalises the rows once, then takes the dot product; neg_sq_l2 is
// 2 q·k − ‖q‖² − ‖k‖², norms once; additive(Wq, Wk, w) projects once, then
// sums w_c·tanh(a_c + b_c) per pair, vectorised across keys.
#pragma once

#include "../expr/product.hpp"
#include "../expr/similarity.hpp"
#include "../expr/transpose.hpp"
#include "../shape/check.hpp"

#include <cmath>
#include <cstddef>
#include <string>
#include <tuple>
#include <utility>

namespace qkv {

struct dot_t {
  template <class V>
  V operator()(const V& q, const V& k) const {
    return q * k;
  }
};
inline constexpr dot_t dot{};

struct cosine_t {};
inline constexpr cosine_t cosine{};

struct neg_sq_l2_t {};
inline constexpr neg_sq_l2_t neg_sq_l2{};

// qᵀ W k, W a dk_q × dk_k expression, held as an operand of a node is.
template <class W>
struct bilinear_t {
  W w;
};

template <expression W>
auto bilinear(W&& w) {
  return bilinear_t<detail::closure_t<W&&>>{std::forward<W>(w)};
}

// wᵀ tanh(Wq q + Wk k), in the row convention of the notation: the query's
// projection is the row q·Wq (Wq is dk × da), the key's k·Wk, and w holds da
// values (a row or a column).
template <class Wq, class Wk, class Wv>
class additive_t {
  using wv_t = detail::bare_t<Wv>;
  static_assert(leaf<wv_t>, "qkv: additive(Wq, Wk, w): w must be a matrix or matrix_view (a row or a column)");
  static_assert(!half_element<value_type_t<Wq>> && !half_element<value_type_t<Wk>> && !half_element<value_type_t<wv_t>>,
                "qkv: additive(Wq, Wk, w): the weights must be float or double (Q and K may be bf16 or f16)");
  static_assert(static_extents_agree<detail::bare_t<Wq>::static_cols, detail::bare_t<Wk>::static_cols>,
                "qkv: additive(Wq, Wk, w): Wq and Wk project to different widths");

 public:
  static constexpr bool qkv_well_formed =
      leaf<wv_t> && static_extents_agree<detail::bare_t<Wq>::static_cols, detail::bare_t<Wk>::static_cols>;

  template <class A, class B, class C>
  additive_t(A&& wq, B&& wk, C&& w) : wq_(std::forward<A>(wq)), wk_(std::forward<B>(wk)), w_(std::forward<C>(w)) {
    const std::size_t da = wq_.cols();
    detail::require_equal(da, wk_.cols(), "additive(Wq, Wk, w): Wq and Wk project to different widths", wq_.rows(),
                          wq_.cols(), wk_.rows(), wk_.cols());
    const bool row = w_.rows() == 1 && w_.cols() == da, col = w_.cols() == 1 && w_.rows() == da;
    if (!row && !col) {
      throw shape_error("qkv: additive(Wq, Wk, w): w must hold the " + std::to_string(da) +
                        " weights of the projection width, as a row or a column (got " +
                        detail::shape_string(w_.rows(), w_.cols()) + ")");
    }
  }

  template <class Q>
  auto queries(const Q& q) const {
    return q * wq_;
  }
  template <class K>
  auto keys(const K& k) const {
    return k * wk_;
  }
  // The matrices it reads, for the aliasing check of eval_into.
  auto operands() const { return std::tie(wq_, wk_, w_); }

  // The term of component c: w_c·tanh(a_c + b_c) (std::tanh on numbers, xsimd's on batches).
  template <class V>
  V operator()(const V& a, const V& b, std::size_t c) const {
    using std::tanh;
    return V(weight(c)) * tanh(a + b);
  }
  // The term's slope in its weight w_c: tanh(a_c + b_c) (the gradient of w).
  template <class V>
  V weight_slope(const V& a, const V& b, std::size_t) const {
    using std::tanh;
    return tanh(a + b);
  }

 private:
  value_type_t<wv_t> weight(std::size_t c) const { return w_.rows() == 1 ? w_(0, c) : w_(c, 0); }

  Wq wq_;
  Wk wk_;
  Wv w_;
};

template <expression Wq, expression Wk, expression Wv>
auto additive(Wq&& wq, Wk&& wk, Wv&& w) {
  return additive_t<detail::closure_t<Wq&&>, detail::closure_t<Wk&&>, detail::closure_t<Wv&&>>(
      std::forward<Wq>(wq), std::forward<Wk>(wk), std::forward<Wv>(w));
}

// similarity(Q, K, dot) is Q * transpose(K), the same node.
template <expression Q, expression K>
auto similarity(Q&& q, K&& k, dot_t) {
  return std::forward<Q>(q) * transpose(std::forward<K>(k));
}

// (The products check the extents; with static ones they say so while
// compiling, as A * B. Dynamic ones are checked here first, to name the node.)
template <expression Q, expression K, class W>
auto similarity(Q&& q, K&& k, bilinear_t<W> b) {
  constexpr const char* what =
      "similarity(Q, K, bilinear(W)): W must have as many rows as Q has columns, and as many columns as K";
  detail::require_equal(q.cols(), b.w.rows(), what, q.rows(), q.cols(), b.w.rows(), b.w.cols());
  detail::require_equal(b.w.cols(), k.cols(), what, b.w.rows(), b.w.cols(), k.rows(), k.cols());
  return (std::forward<Q>(q) * static_cast<W&&>(b.w)) * transpose(std::forward<K>(k));
}

template <expression Q, expression K>
auto similarity(Q&& q, K&& k, cosine_t) {
  detail::require_equal(q.cols(), k.cols(), "similarity(Q, K, cosine): the rows of Q and of K have different lengths",
                        q.rows(), q.cols(), k.rows(), k.cols());
  return normalize_rows(std::forward<Q>(q)) * transpose(normalize_rows(std::forward<K>(k)));
}

template <expression Q, expression K>
auto similarity(Q&& q, K&& k, neg_sq_l2_t) {
  return neg_sq_l2_expr<detail::closure_t<Q&&>, detail::closure_t<K&&>>(std::forward<Q>(q), std::forward<K>(k));
}

}  // namespace qkv
