// The vector-Jacobian rule of each node, for gradient.hpp: backprop(e, G,
// acc) adds what the gradient G reaching e gives each target that e reads.
// Node by node, a rule runs on matrices the library evaluates (eval(·,
// naive)), in the type e computes in:
//   A * B        dA = G Bᵀ, dB = Aᵀ G
//   transpose    dX = Gᵀ
//   X * s, X / s dX = G s, G / s (the scalar is a constant)
//   A ± B        dA = G, dB = ±G
//   softmax(S)   dS = P ∘ (G − rowsum(G ∘ P)), P the forward weights
//   causal, window, masked(S, M), masked(S, pred)
//                dS = G where kept, exactly 0 where masked
// softmax(S) * V where S is any similarity, scaled, biased by a constant,
// causal, masked by a matrix or a predicate, or modified by one score_mod,
// has a rule of its own when the strategy fuses (gradient_fused.hpp).
// A subexpression that reads none of the targets is not differentiated. A
// leaf is a target when it has its data, extents and strides; every
// occurrence adds to its gradient.
#pragma once

#include "../expr/elementwise.hpp"
#include "../expr/mask.hpp"
#include "../expr/product.hpp"
#include "../expr/scaled.hpp"
#include "../expr/score_mod.hpp"
#include "../expr/similarity.hpp"
#include "../expr/softmax.hpp"
#include "../expr/transpose.hpp"
#include "../expr/window.hpp"
#include "../eval/key_bounds_of.hpp"
#include "../shape/check.hpp"
#include "../similarity/builtin.hpp"
#include "../storage/matrix.hpp"
#include "../storage/aligned_buffer.hpp"
#include "../numeric/dual.hpp"
#include "../eval/eval.hpp"
#include "../eval/strategy.hpp"

#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>

namespace qkv {

// Whether f can be differentiated as a modifier (a similarity term) of
// element type T: called on dual numbers and on duals of batches, it gives
// duals.
template <class F, class T>
concept differentiable_modifier = requires(const F& f, dual<T> x, dual<xsimd::batch<T>> v) {
  { f(x, x, x) } -> std::convertible_to<dual<T>>;
  { f(v, v, v) } -> std::convertible_to<dual<xsimd::batch<T>>>;
} || requires(const F& f, dual<T> x, dual<xsimd::batch<T>> v, std::size_t b) {
  { f(x, b, b, x, x) } -> std::convertible_to<dual<T>>;
  { f(v, b, b, v, v) } -> std::convertible_to<dual<xsimd::batch<T>>>;
};

template <class F, class T>
concept differentiable_term = requires(const F& f, dual<T> x, dual<xsimd::batch<T>> v) {
  { f(x, x) } -> std::convertible_to<dual<T>>;
  { f(v, v) } -> std::convertible_to<dual<xsimd::batch<T>>>;
} || requires(const F& f, dual<T> x, dual<xsimd::batch<T>> v, std::size_t c) {
  { f(x, x, c) } -> std::convertible_to<dual<T>>;
  { f(v, v, c) } -> std::convertible_to<dual<xsimd::batch<T>>>;
};

// The leaves a gradient is taken with respect to: wrt(Q, K, V).
template <class... X>
struct wrt_t {
  std::tuple<const X&...> leaves;
};

template <class... X>
wrt_t<X...> wrt(const X&... x) {
  static_assert(((coded_leaf<X> || ((leaf<X> || tensor_leaf<X>) && value_element<std::remove_const_t<value_type_t<X>>>)) && ...),
                "qkv: wrt(X...): each X must be a matrix, tensor or view of float, double, bf16 or f16 (masks are constants)");
  static_assert(!(coded_leaf<X> || ...),
                "qkv: wrt(X...): a quantized K or V has no gradient (its codes are constants: take it with respect to the float values quantized)");
  static_assert(!(requires { X::qkv_paged; } || ...), "qkv: wrt(X...): a paged cache has no gradient (attention over pages is forward only)");
  return {std::tie(x...)};
}

namespace detail {

template <class T>
using grad_matrix = matrix<T, dyn, dyn>;

template <class L>
std::size_t leaf_col_stride(const L& l) {
  if constexpr (requires { l.col_stride(); }) return l.col_stride();
  else return 1;
}

// Whether leaf a is the object b names: the same data, extents and strides.
template <class A, class B>
bool same_leaf(const A& a, const B& b) {
  if constexpr (!std::is_same_v<std::remove_const_t<value_type_t<A>>, std::remove_const_t<value_type_t<B>>>) {
    return false;
  } else {
    return static_cast<const void*>(a.data()) == static_cast<const void*>(b.data()) && a.rows() == b.rows() &&
           a.cols() == b.cols() && (a.rows() < 2 || a.row_stride() == b.row_stride()) &&
           (a.cols() < 2 || leaf_col_stride(a) == leaf_col_stride(b));
  }
}

// Whether a walk over leaves (walk(look) calls look on each) meets any of w's.
template <class Walk, class... X>
bool meets_any(Walk walk, const wrt_t<X...>& w) {
  bool found = false;
  auto look = [&](const auto& l) {
    if constexpr (leaf<decltype(l)>)
      std::apply([&](const auto&... x) { found = found || (same_leaf(l, x) || ...); }, w.leaves);
  };
  walk(look);
  return found;
}

// Whether e reads any of the leaves in w.
template <class E, class... X>
bool reads_any(const E& e, const wrt_t<X...>& w) {
  return meets_any([&](auto& look) { for_each_leaf(e, look); }, w);
}

// e's value as a matrix of T.
template <class T, class E>
grad_matrix<T> value_of(const E& e) {
  if constexpr (leaf<E>) {
    grad_matrix<T> r(e.rows(), e.cols());
    for (std::size_t i = 0; i < e.rows(); ++i)
      for (std::size_t j = 0; j < e.cols(); ++j) r(i, j) = static_cast<T>(e(i, j));
    return r;
  } else {
    grad_matrix<T> r(e.rows(), e.cols());
    eval_into(r, e, naive);  // a 2-byte subexpression: its float value, unrounded
    return r;
  }
}

template <class, class T>
using same_as_for = T;

// What vjp(e) keeps of a fused forward: O and each row's maximum and sum
// (attention_problem::row_stats), which make its log-sum-exp.
template <class T>
struct forward_kept {
  grad_matrix<T> out;
  aligned_buffer<T> row_stats;
};

// The targets, and the sum of the gradients reaching each. The first
// gradient to reach a target becomes its sum, moved where it can be: a
// fused attention's dQ, dK and dV go to the caller without a copy or an
// addition to zeros. sum_of gives a sum that nothing has reached yet as
// zeros of its target's shape.
template <class T, class... X>
struct gradients {
  const wrt_t<X...>& targets;
  std::tuple<same_as_for<X, grad_matrix<T>>...> sums;
  bool fuse = false;  // the fused backward where e has one (has_fused_backward)
  // e's own forward, when e is the attention and vjp kept it: used by the
  // first node reached, e itself, then dropped.
  const forward_kept<T>* kept = nullptr;
  std::array<bool, sizeof...(X)> reached{};  // whether sums[I] holds a gradient yet

  template <std::size_t I>
  grad_matrix<T>& sum_of() {
    grad_matrix<T>& sum = std::get<I>(sums);
    if (!reached[I]) {
      const auto& x = std::get<I>(targets.leaves);
      sum = grad_matrix<T>(x.rows(), x.cols());
      reached[I] = true;
    }
    return sum;
  }
  // Every sum, zeros where nothing reached it.
  std::tuple<same_as_for<X, grad_matrix<T>>...>& all_sums() {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (sum_of<I>(), ...); }(std::index_sequence_for<X...>{});
    return sums;
  }
};

template <class T>
void add_into(grad_matrix<T>& sum, const grad_matrix<T>& g) {
  for (std::size_t i = 0; i < g.rows(); ++i)
    for (std::size_t j = 0; j < g.cols(); ++j) sum(i, j) += g(i, j);
}

// The gradient g reaching leaf e, into each target that e is: the sum of
// the first it reaches is g itself (moved, when g is an rvalue), later
// ones add it.
template <class T, class E, class G, class... X>
void reach_leaf(const E& e, G&& g, gradients<T, X...>& acc) {
  const grad_matrix<T>* moved_to = nullptr;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    const auto reach = [&]<std::size_t J>(std::integral_constant<std::size_t, J>) {
      if (!same_leaf(e, std::get<J>(acc.targets.leaves))) return;
      grad_matrix<T>& sum = std::get<J>(acc.sums);
      const grad_matrix<T>& from = moved_to != nullptr ? *moved_to : static_cast<const grad_matrix<T>&>(g);
      if (acc.reached[J]) {
        add_into(sum, from);
      } else {
        if constexpr (std::is_rvalue_reference_v<G&&> && !std::is_const_v<std::remove_reference_t<G>>) {
          if (moved_to == nullptr) sum = std::move(g), moved_to = &sum;
          else sum = from;
        } else {
          sum = from;
        }
        acc.reached[J] = true;
      }
    };
    (reach(std::integral_constant<std::size_t, I>{}), ...);
  }(std::index_sequence_for<X...>{});
}

template <class... Any>
inline constexpr bool no_backward = false;

template <class T, class E, class... X>
void backprop(const E&, const grad_matrix<T>&, gradients<T, X...>&) {
  static_assert(no_backward<E>,
                "qkv: gradient(e, dO, wrt(X...)): e holds a node without a backward");
}

template <class T, class E, class... X>
  requires leaf<E>
void backprop(const E& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  reach_leaf(e, g, acc);
}

// Only into an operand that reads a target; a leaf takes the gradient made
// for it as its sum, where it is the first to reach it.
template <class T, class E, class... X, class G>
void backprop_into(const E& e, G&& make_gradient, gradients<T, X...>& acc) {
  if (!reads_any(e, acc.targets)) return;
  if constexpr (leaf<E>) reach_leaf(e, grad_matrix<T>(make_gradient()), acc);
  else backprop(e, grad_matrix<T>(make_gradient()), acc);
}

// The gradients of the tables a modifier reads (score_mod(S, f, P...)),
// summed flat in `sums` (the tables' entries row by row, one table after
// another), on into each table that reads a target.
template <class T, class Tabled, class... X>
void tables_into(const Tabled& f, const T* sums, gradients<T, X...>& acc) {
  std::size_t t = 0;
  std::apply([&](const auto&... p) {
    ((backprop_into(p, [&] {
       grad_matrix<T> d(p.rows(), p.cols());
       const T* from = sums + f.offset(t);
       for (std::size_t r = 0; r < p.rows(); ++r)
         for (std::size_t c = 0; c < p.cols(); ++c) d(r, c) = from[r * p.cols() + c];
       return d;
     }, acc), ++t), ...);
  }, f.operands());
}

// g · B (or g · Bᵀ), where an exact zero of g is no contribution: 0 times
// an infinite or NaN value of B (a masked key's padding) adds nothing, as
// in the fused backward, which never reads a key no row sees. The plain
// product where B is finite.
template <class T>
grad_matrix<T> gradient_times(const grad_matrix<T>& g, const grad_matrix<T>& b, bool transposed) {
  bool finite = true;
  for (std::size_t i = 0; i < b.rows(); ++i)
    for (std::size_t j = 0; j < b.cols(); ++j) finite = finite && std::isfinite(b(i, j));
  if (finite) return transposed ? eval(g * transpose(b), naive) : eval(g * b, naive);
  const std::size_t cols = transposed ? b.rows() : b.cols();
  grad_matrix<T> r(g.rows(), cols);
  for (std::size_t i = 0; i < g.rows(); ++i) {
    for (std::size_t c = 0; c < cols; ++c) r(i, c) = T(0);
    for (std::size_t j = 0; j < g.cols(); ++j) {
      if (g(i, j) == T(0)) continue;
      for (std::size_t c = 0; c < cols; ++c) r(i, c) += g(i, j) * (transposed ? b(c, j) : b(j, c));
    }
  }
  return r;
}

template <class T, class A, class B, class... X>
void product_backprop(const product_expr<A, B>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  backprop_into(e.lhs(), [&] { return gradient_times(g, value_of<T>(e.rhs()), true); }, acc);
  backprop_into(e.rhs(), [&] { return eval(transpose(value_of<T>(e.lhs())) * g, naive); }, acc);
}

template <class T, class A, class B, class... X>
void backprop(const product_expr<A, B>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  product_backprop(e, g, acc);
}

template <class F>
inline constexpr bool is_additive_v = false;
template <class Wq, class Wk, class Wv>
inline constexpr bool is_additive_v<additive_t<Wq, Wk, Wv>> = true;

// Whether a functor reads a target through its operands() (a constant of
// the functor's: it has no gradient to give).
template <class Fn, class... X>
bool functor_reads_any(const Fn& fn, const wrt_t<X...>& w) {
  return meets_any([&](auto& look) { for_each_functor_leaf(fn, look); }, w);
}

// A softmax's per-head sinks, where a target names them: dσ_h, added at
// (0, h) of that target's sum, from each row's sink weight p_i and its
// Σ_j P_ij G_ij, as dσ = −Σ_i p_i Σ_j P_ij G_ij (G the gradient reaching
// the weights P).
template <class T, class Softmax, class PG, class... X>
void sink_backprop(const Softmax& s, std::size_t rows, PG sink_weight_times_pg, gradients<T, X...>& acc) {
  const auto* leaf = s.sink_leaf();
  if (leaf == nullptr) return;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    const auto add = [&](grad_matrix<T>& sum) {
      T d = 0;
      for (std::size_t i = 0; i < rows; ++i) d -= sink_weight_times_pg(i);
      sum(0, s.head_index()) += d;
    };
    ((same_leaf(*leaf, std::get<I>(acc.targets.leaves)) ? add(acc.template sum_of<I>()) : void()), ...);
  }(std::index_sequence_for<X...>{});
}

template <class T, class A, class... X>
void backprop(const transpose_expr<A>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  backprop_into(e.arg(), [&] { return eval(transpose(g), naive); }, acc);
}

template <class T, class A, class S, scale_op Op, class... X>
void backprop(const scaled_expr<A, S, Op>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  const T s = static_cast<T>(e.factor());
  if constexpr (Op == scale_op::multiply) backprop_into(e.arg(), [&] { return eval(g * s, naive); }, acc);
  else backprop_into(e.arg(), [&] { return eval(g / s, naive); }, acc);
}

template <class T, class A, class B, elementwise_op Op, class... X>
void backprop(const elementwise_expr<A, B, Op>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  backprop_into(e.lhs(), [&] { return g; }, acc);
  if constexpr (Op == elementwise_op::add) backprop_into(e.rhs(), [&] { return g; }, acc);
  else backprop_into(e.rhs(), [&] { return eval(g * T(-1), naive); }, acc);
}

template <class T, class A, class... X>
void backprop(const softmax_expr<A>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  if (e.sink_leaf() != nullptr) {
    // The sink's weight in each row, exp(σ − M) / (exp(σ − M) + Σ_j exp(s_ij − M)), M the larger of σ and the row's maximum.
    const grad_matrix<T> s = value_of<T>(e.arg()), p = value_of<T>(e);
    const T sigma = static_cast<T>(e.sink());
    sink_backprop(e, s.rows(), [&](std::size_t i) {
      T mx = sigma, pg = 0;
      for (std::size_t j = 0; j < s.cols(); ++j) mx = s(i, j) > mx ? s(i, j) : mx;
      if (mx == -std::numeric_limits<T>::infinity()) return T(0);  // a sink of −∞ in a row that sees nothing
      T den = std::exp(sigma - mx);
      for (std::size_t j = 0; j < s.cols(); ++j) den += std::exp(s(i, j) - mx), pg += p(i, j) == T(0) ? T(0) : p(i, j) * g(i, j);
      return std::exp(sigma - mx) / den * pg;
    }, acc);
  }
  backprop_into(e.arg(), [&] {
    const grad_matrix<T> p = value_of<T>(e);
    grad_matrix<T> ds(p.rows(), p.cols());
    for (std::size_t i = 0; i < p.rows(); ++i) {
      T r = 0;
      // (A weight of 0 adds nothing, whatever reached it: NaN from a masked key's padded value.)
      for (std::size_t j = 0; j < p.cols(); ++j) r += p(i, j) == T(0) ? T(0) : g(i, j) * p(i, j);
      // A weight of 0 (masked, or a fully masked row) passes back exactly 0.
      for (std::size_t j = 0; j < p.cols(); ++j) ds(i, j) = p(i, j) == T(0) ? T(0) : p(i, j) * (g(i, j) - r);
    }
    return ds;
  }, acc);
}

// G with the masked positions set to 0: keep(i, j) says which stay.
template <class T, class Keep>
grad_matrix<T> kept(const grad_matrix<T>& g, Keep keep) {
  grad_matrix<T> r(g.rows(), g.cols());
  for (std::size_t i = 0; i < g.rows(); ++i)
    for (std::size_t j = 0; j < g.cols(); ++j) r(i, j) = keep(i, j) ? g(i, j) : T(0);
  return r;
}

// Causal and windows: G where the row sees the key (kernels/key_bounds.hpp).
template <class T, class E, class... X>
  requires sets_key_bounds<E>
void backprop(const E& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  const kernels::key_bounds b = node_bounds(&e);
  const std::size_t n = e.rows(), m = e.cols();
  backprop_into(e.arg(), [&] { return kept(g, [&](std::size_t i, std::size_t j) { return kernels::sees(b, n, m, i, j); }); }, acc);
}

template <class T, class S, class... X>
void backprop(const positions_expr<S>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  backprop_into(e.arg(), [&] { return g; }, acc);
}

template <class T, class S, class M, class... X>
void backprop(const masked_expr<S, M>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  backprop_into(e.arg(), [&] { return kept(g, [&](std::size_t i, std::size_t j) { return bool(e.mask()(i, j)); }); },
                acc);
}

template <class T, class S, class P, class... X>
void backprop(const predicate_masked_expr<S, P>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  backprop_into(e.arg(), [&] {
    return kept(g, [&](std::size_t i, std::size_t j) {
      return call_predicate(e.predicate(), i, j, e.batch_index(), e.head_index());
    });
  }, acc);
}

}  // namespace detail
}  // namespace qkv
