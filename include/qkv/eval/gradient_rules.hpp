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
// has a rule of its own when the strategy fuses
// (acc.fuse): the forward again keeping each row's maximum and sum (or
// vjp's kept ones), then the fused backward (kernels/attention_backward.hpp),
// whose dQ, dK and dV go on into Q, K and V as written.
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
#include "../shape/check.hpp"
#include "../similarity/builtin.hpp"
#include "../storage/matrix.hpp"
#include "../kernels/api.hpp"
#include "../kernels/attention_backward_with.hpp"
#include "../storage/aligned_buffer.hpp"
#include "../storage/dual.hpp"
#include "eval.hpp"
#include "strategy.hpp"

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
  static_assert((((leaf<X> || tensor_leaf<X>) && value_element<std::remove_const_t<value_type_t<X>>>) && ...),
                "qkv: wrt(X...): each X must be a matrix, tensor or view of float, double, bf16 or f16 (masks are constants)");
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

// The targets, and the sum of the gradients reaching each.
template <class T, class... X>
struct gradients {
  const wrt_t<X...>& targets;
  std::tuple<same_as_for<X, grad_matrix<T>>...> sums;
  bool fuse = false;  // the fused backward where e has one (has_fused_backward)
  // e's own forward, when e is the attention and vjp kept it: used by the
  // first node reached, e itself, then dropped.
  const forward_kept<T>* kept = nullptr;
};

template <class T>
void add_into(grad_matrix<T>& sum, const grad_matrix<T>& g) {
  for (std::size_t i = 0; i < g.rows(); ++i)
    for (std::size_t j = 0; j < g.cols(); ++j) sum(i, j) += g(i, j);
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
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((same_leaf(e, std::get<I>(acc.targets.leaves)) ? add_into(std::get<I>(acc.sums), g) : void()), ...);
  }(std::index_sequence_for<X...>{});
}

// Only into an operand that reads a target.
template <class T, class E, class... X, class G>
void backprop_into(const E& e, G&& make_gradient, gradients<T, X...>& acc) {
  if (reads_any(e, acc.targets)) backprop(e, grad_matrix<T>(make_gradient()), acc);
}

template <class T, class A, class B, class... X>
void product_backprop(const product_expr<A, B>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  backprop_into(e.lhs(), [&] { return eval(g * transpose(value_of<T>(e.rhs())), naive); }, acc);
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

// softmax(S) * V with a fused backward (attention_backward.hpp): S the dot
// product (bilinear and cosine are products too), neg_sq_l2 (norm_sums
// below adds its norms' share) or a similarity term (the user's, additive's),
// scaled, biased by a constant, causal, masked by a matrix or a predicate,
// one score_mod; the functors differentiable (dual numbers); on matrices
// (2-byte operands are read as float copies). Where a bias or additive's w
// is differentiated, the rule goes node by node at run time.
template <class E>
inline constexpr bool has_fused_backward = [] {
  if constexpr (has_fused_form<E>) {
    using T = compute_t<std::remove_const_t<value_type_t<E>>>;
    using chain = score_chain<typename fused_form<E>::scores>;
    using term = typename chain::term_type;
    using mod = typename chain::mod_type;
    if constexpr (!element<T> || static_rank_of<bare_t<E>>() != 2) {
      return false;
    } else {
      constexpr bool core = chain::core_name == "dot" || chain::core_name == "neg_sq_l2" ||
                            (!std::is_same_v<term, none> && differentiable_term<term, T>);
      return core && (std::is_same_v<mod, none> || differentiable_modifier<mod, T>);
    }
  } else {
    return false;
  }
}();

// Whether a functor reads a target through its operands() (a constant of
// the functor's: it has no gradient to give).
template <class Fn, class... X>
bool functor_reads_any(const Fn& fn, const wrt_t<X...>& w) {
  return meets_any([&](auto& look) { for_each_functor_leaf(fn, look); }, w);
}

// The chain's dot product, and whether its bias, or a score_mod's functor through
// its operands(), reads a target (then node by node, which says what it can).
template <class Q, class K>
const product_expr<Q, K>& score_core(const product_expr<Q, K>& s) { return s; }
template <class A, class B, elementwise_op Op>
const auto& score_core(const elementwise_expr<A, B, Op>& s) {
  if constexpr (bias_sides<A, B, Op>::left) return score_core(s.lhs());
  else return score_core(s.rhs());
}
template <class Q, class K, class F>
const similarity_expr<Q, K, F>& score_core(const similarity_expr<Q, K, F>& s) { return s; }
template <class Q, class K>
const neg_sq_l2_expr<Q, K>& score_core(const neg_sq_l2_expr<Q, K>& s) { return s; }
template <class S>
const auto& score_core(const S& s) { return score_core(s.arg()); }

template <class Q, class K, class W>
bool bias_reads_any(const product_expr<Q, K>&, const W&) { return false; }
template <class Q, class K, class W>
bool bias_reads_any(const neg_sq_l2_expr<Q, K>&, const W&) { return false; }
template <class Q, class K, class F, class W>
bool bias_reads_any(const similarity_expr<Q, K, F>& s, const W& w) {
  // additive's w: its gradient Σ_ij G_ij tanh(a_ic + b_jc) needs G whole.
  if constexpr (is_additive_v<F>) return reads_any(std::get<2>(s.function().operands()), w);
  else return functor_reads_any(s.function(), w);
}
template <class A, class B, elementwise_op Op, class W>
bool bias_reads_any(const elementwise_expr<A, B, Op>& s, const W& w) {
  if constexpr (bias_sides<A, B, Op>::left) return reads_any(s.rhs(), w) || bias_reads_any(s.lhs(), w);
  else return reads_any(s.lhs(), w) || bias_reads_any(s.rhs(), w);
}
template <class S, class W>
bool bias_reads_any(const S& s, const W& w) {
  if constexpr (requires { s.function(); })  // a score_mod's functor: node by node, which says so
    if (functor_reads_any(s.function(), w)) return true;
  return bias_reads_any(s.arg(), w);
}

// The compiled kernels, or with an extension the kernel instantiated here.
template <class T, class Ext>
void run_backward(const kernels::attention_problem<T>* problems, const kernels::attention_gradient<T>* g,
                  std::size_t count, const Ext& ext) {
  if constexpr (Ext::empty) kernels::attention_backward(problems, g, count);
  else kernels::attention_backward_with(problems, g, count, ext);
}

// neg_sq_l2's norms in the fused backward. Its scores are a·q·k plus the
// keys' −‖k‖² (col_scale) and, with a modifier, the queries' −‖q‖²
// (row_scale); the kernel's sums give the products' share of dQ and dK, and
// the norms' share needs each key's Σ_i G_ij and each query's Σ_j G_ij (G
// the gradient reaching the scores). Two columns appended to Q and K give
// them: Q gains (1/a, 0) and K (0, 1/a), which changes no score (the
// products add two zeros last), and dK's column dk is then Σ_i G_ij, dQ's
// column dk + 1 Σ_j G_ij.
template <class T>
struct norm_sums {
  aligned_buffer<T> q, k;
  std::size_t dk = 0;

  void widen(kernels::attention_problem<T>& p) {
    const std::size_t n = p.q.rows, m = p.k.rows, w = p.q.cols + 2;
    dk = p.q.cols;
    const T inv = T(1) / p.scale;
    q = aligned_buffer<T>(n * w, aligned_buffer<T>::uninitialized);
    k = aligned_buffer<T>(m * w, aligned_buffer<T>::uninitialized);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t c = 0; c < dk; ++c) q.data()[i * w + c] = p.q(i, c);
      q.data()[i * w + dk] = inv, q.data()[i * w + dk + 1] = T(0);
    }
    for (std::size_t j = 0; j < m; ++j) {
      for (std::size_t c = 0; c < dk; ++c) k.data()[j * w + c] = p.k(j, c);
      k.data()[j * w + dk] = T(0), k.data()[j * w + dk + 1] = inv;
    }
    p.q = dense<const T>(q.data(), n, w, w);
    p.k = dense<const T>(k.data(), m, w, w);
  }

  // dq and dk of the widened problem p → those of Q and K.
  void fold(const kernels::attention_problem<T>& p, grad_matrix<T>& dq, grad_matrix<T>& dk_) const {
    const std::size_t n = p.q.rows, m = p.k.rows;
    const bool rows = p.row_bias.data != nullptr;
    grad_matrix<T> fq(n, dk), fk(m, dk);
    for (std::size_t i = 0; i < n; ++i) {
      const T g = rows ? dq(i, dk + 1) : T(0);  // a row that sees nothing: 0, whatever q holds
      for (std::size_t c = 0; c < dk; ++c) fq(i, c) = g == T(0) ? dq(i, c) : dq(i, c) - T(2) * p.row_scale * g * p.q(i, c);
    }
    for (std::size_t j = 0; j < m; ++j) {
      const T g = dk_(j, dk);
      for (std::size_t c = 0; c < dk; ++c) fk(j, c) = g == T(0) ? dk_(j, c) : dk_(j, c) - T(2) * p.col_scale * g * p.k(j, c);
    }
    dq = std::move(fq), dk_ = std::move(fk);
  }
};

template <class E>
inline constexpr bool has_norm_sums = score_chain<typename fused_form<E>::scores>::core_name == "neg_sq_l2";

// e's fused forward into out, keeping each row's maximum and sum in stats
// (2n values); the problem it ran, whose operands live in keep.
template <class T, class E>
auto fused_forward(const E& e, const kernels::strided<T>& out, T* stats, fused_operands<T, T>& keep,
                   fused_extension_t<E>& ext) {
  auto problem = attention_problem_of<best_policy, E, T>(e, out, keep, ext);
  // (An empty problem writes nothing: its rows then see nothing.)
  for (std::size_t i = 0; i < problem.q.rows; ++i)
    stats[2 * i] = -std::numeric_limits<T>::infinity(), stats[2 * i + 1] = T(0);
  problem.row_stats = stats;
  run_attention(&problem, 1, ext);
  return problem;
}

template <class T, class M>
kernels::strided<T> view_of(M& x) {
  const auto v = dense(x.data(), x.rows(), x.cols(), x.row_stride());
  if constexpr (std::is_const_v<T>) return v.as_const();
  else return v;
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
    const auto add = [&](auto& sum, const auto& target) {
      if (!same_leaf(*leaf, target)) return;
      T d = 0;
      for (std::size_t i = 0; i < rows; ++i) d -= sink_weight_times_pg(i);
      sum(0, s.head_index()) += d;
    };
    (add(std::get<I>(acc.sums), std::get<I>(acc.targets.leaves)), ...);
  }(std::index_sequence_for<X...>{});
}

// The same in the fused backward: p_i = exp(σ − m_i) / l_i from the row
// statistics, and Σ_j P_ij G_ij = D_i = Σ_c dO_ic O_ic (O = P V).
template <class T, class E, class... X>
void fused_sink_backprop(const E& e, const grad_matrix<T>& d_out, const grad_matrix<T>& out, const T* stats,
                         gradients<T, X...>& acc) {
  const auto& s = e.lhs();
  const T sigma = static_cast<T>(s.sink());
  sink_backprop(s, out.rows(), [&](std::size_t i) {
    const T m = stats[2 * i], l = stats[2 * i + 1];
    T d = 0;
    for (std::size_t c = 0; c < out.cols(); ++c) d += d_out(i, c) * out(i, c);
    return l == T(0) ? T(0) : std::exp(sigma - m) / l * d;
  }, acc);
}

// dQ, dK and dV of attention e on into Q, K and V as written in e.
template <class T, class E, class... X>
void propagate_attention(const E& e, const grad_matrix<T>& dq, const grad_matrix<T>& dk, const grad_matrix<T>& dv,
                         gradients<T, X...>& acc) {
  const auto& core = score_core(e.lhs().arg());
  if constexpr (is_similarity_v<bare_t<decltype(core)>>) {  // into f's queries(Q) and keys(K)
    backprop_into(similarity_queries(core.function(), core.lhs()), [&] { return dq; }, acc);
    backprop_into(similarity_keys(core.function(), core.rhs()), [&] { return dk; }, acc);
  } else if constexpr (is_neg_sq_l2_v<bare_t<decltype(core)>>) {
    backprop_into(core.lhs(), [&] { return dq; }, acc);
    backprop_into(core.rhs(), [&] { return dk; }, acc);
  } else {
    backprop_into(core.lhs(), [&] { return dq; }, acc);
    backprop_into(core.rhs().arg(), [&] { return dk; }, acc);
  }
  backprop_into(e.rhs(), [&] { return dv; }, acc);
}

// The forward (unless vjp kept it), then the fused backward; dQ, dK and dV
// go on into Q, K and V as written in e.
template <class T, class A, class V, class... X>
  requires has_fused_backward<product_expr<A, V>>
void backprop(const product_expr<A, V>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  using E = product_expr<A, V>;
  const forward_kept<T>* kept = std::exchange(acc.kept, nullptr);
  const auto& scores = e.lhs().arg();
  if (!acc.fuse || bias_reads_any(scores, acc.targets)) return product_backprop(e, g, acc);
  fused_operands<T, T> keep;
  fused_extension_t<E> ext;
  forward_kept<T> here;
  if (kept == nullptr) {
    here.out = grad_matrix<T>(e.rows(), e.cols());
    here.row_stats = aligned_buffer<T>(2 * e.rows(), aligned_buffer<T>::uninitialized);
  }
  const forward_kept<T>& f = kept != nullptr ? *kept : here;
  auto problem = kept != nullptr ? attention_problem_of<best_policy, E, T>(e, view_of<T>(here.out), keep, ext)
                                 : fused_forward(e, view_of<T>(here.out), here.row_stats.data(), keep, ext);
  norm_sums<T> norms;
  if constexpr (has_norm_sums<E>) norms.widen(problem);
  const std::size_t n = problem.q.rows, m = problem.k.rows, dk = problem.q.cols, dv = problem.v.cols;
  grad_matrix<T> dq(n, dk), dk_(m, dk), dv_(m, dv);
  const kernels::attention_gradient<T> grads{view_of<const T>(g), view_of<const T>(f.out), f.row_stats.data(),
                                             view_of<T>(dq), view_of<T>(dk_), view_of<T>(dv_)};
  run_backward(&problem, &grads, 1, ext);
  if constexpr (has_norm_sums<E>) norms.fold(problem, dq, dk_);
  propagate_attention(e, dq, dk_, dv_, acc);
  fused_sink_backprop(e, g, f.out, f.row_stats.data(), acc);
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
      for (std::size_t j = 0; j < s.cols(); ++j) den += std::exp(s(i, j) - mx), pg += p(i, j) * g(i, j);
      return std::exp(sigma - mx) / den * pg;
    }, acc);
  }
  backprop_into(e.arg(), [&] {
    const grad_matrix<T> p = value_of<T>(e);
    grad_matrix<T> ds(p.rows(), p.cols());
    for (std::size_t i = 0; i < p.rows(); ++i) {
      T r = 0;
      for (std::size_t j = 0; j < p.cols(); ++j) r += g(i, j) * p(i, j);
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

template <class T, class S, class... X>
void backprop(const causal_expr<S>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  const std::size_t n = e.rows(), m = e.cols();
  backprop_into(e.arg(), [&] { return kept(g, [&](std::size_t i, std::size_t j) { return j + n <= i + m; }); }, acc);
}

template <class T, class S, class... X>
void backprop(const window_expr<S>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  backprop_into(e.arg(), [&] { return kept(g, [&](std::size_t i, std::size_t j) { return e.keeps(i, j); }); }, acc);
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
