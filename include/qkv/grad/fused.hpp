// The fused attention's rule for gradient_rules.hpp's walk: softmax(S) * V,
// where the strategy fuses (acc.fuse) and e has a fused backward, runs the
// forward again keeping each row's maximum and sum (or takes vjp's kept
// ones), then the backward kernel (kernels/attention_backward.hpp); its dQ,
// dK and dV go on into Q, K and V as written in e, additive's dw into w,
// the bias's gradient (written by the kernel where the bias is among the
// targets) into the bias, and dσ into per-head sinks. Where a functor reads
// a target through its operands() the rule goes node by node, which says
// that it cannot. gradient.hpp runs the same pieces on all of a tensor's batch
// indices at once.
#pragma once

#include "../kernels/api.hpp"
#include "../kernels/attention_backward_with.hpp"
#include "../storage/aligned_buffer.hpp"
#include "rules.hpp"

#include <cmath>
#include <cstddef>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace qkv::detail {

// softmax(S) * V with a fused backward (attention_backward.hpp): S the dot
// product (bilinear and cosine are products too), neg_sq_l2 (norm_sums
// below adds its norms' share) or a similarity term (the user's, additive's),
// scaled, biased by a constant, causal, masked by a matrix or a predicate,
// one score_mod; the functors differentiable (dual numbers); on matrices
// (2-byte operands are read as float copies). A differentiated bias gets its
// gradient from the kernel too.
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
bool functor_reads_target(const product_expr<Q, K>&, const W&) { return false; }
template <class Q, class K, class W>
bool functor_reads_target(const neg_sq_l2_expr<Q, K>&, const W&) { return false; }
template <class Q, class K, class F, class W>
bool functor_reads_target(const similarity_expr<Q, K, F>& s, const W& w) {
  // additive's weights: Wq and Wk through its queries and keys, w summed by the kernel.
  if constexpr (is_additive_v<F>) return false;
  else return functor_reads_any(s.function(), w);
}
template <class A, class B, elementwise_op Op, class W>
bool functor_reads_target(const elementwise_expr<A, B, Op>& s, const W& w) {
  if constexpr (bias_sides<A, B, Op>::left) return functor_reads_target(s.lhs(), w);
  else return functor_reads_target(s.rhs(), w);
}
template <class S, class W>
bool functor_reads_target(const S& s, const W& w) {
  // a score_mod's functor: node by node, which says so; the tables of
  // score_mod(S, f, P...) have their gradients from the kernel.
  if constexpr (requires { s.function(); })
    if constexpr (!is_tabled_v<bare_t<decltype(s.function())>>)
      if (functor_reads_any(s.function(), w)) return true;
  return functor_reads_target(s.arg(), w);
}

// f(t) for the tabled modifier t of a score chain (score_mod(S, f, P...)),
// where it has one.
template <class S, class F>
void with_chain_tables(const S& s, F&& f) {
  if constexpr (requires { s.function(); })
    if constexpr (is_tabled_v<bare_t<decltype(s.function())>>) return f(s.function());
  if constexpr (requires { s.arg(); }) with_chain_tables(s.arg(), f);
}
// Room for the gradients of the chain's tables where one reads a target;
// empty elsewhere. Points g at it.
template <class T, class S, class W>
std::vector<T> table_sums_for(const S& s, const W& w, kernels::attention_gradient<T>& g) {
  std::vector<T> sums;
  with_chain_tables(s, [&](const auto& t) {
    bool wanted = false;
    std::apply([&](const auto&... p) { ((wanted = wanted || reads_any(p, w)), ...); }, t.operands());
    if (wanted) sums.assign(t.size(), T(0));
  });
  g.d_tables = sums.empty() ? nullptr : sums.data();
  g.tables_size = sums.size();
  return sums;
}
// The kernel's table gradients on into the tables.
template <class T, class S, class... X>
void propagate_tables(const S& s, const std::vector<T>& sums, gradients<T, X...>& acc) {
  if (sums.empty()) return;
  with_chain_tables(s, [&](const auto& t) { tables_into(t, sums.data(), acc); });
}

// f(B) for the bias B of a score chain, where it has one.
template <class S, class F>
void with_chain_bias(const S& s, F&& f);
template <class A, class B, elementwise_op Op, class F>
void with_chain_bias(const elementwise_expr<A, B, Op>& s, F&& f) {
  if constexpr (bias_sides<A, B, Op>::left) f(s.rhs()), with_chain_bias(s.lhs(), f);
  else f(s.lhs()), with_chain_bias(s.rhs(), f);
}
template <class S, class F>
void with_chain_bias(const S& s, F&& f) {
  if constexpr (requires { s.arg(); }) with_chain_bias(s.arg(), f);
}
// Whether the bias of a score chain reads a target: the fused backward then
// writes the bias's gradient too (attention_gradient::d_bias).
template <class S, class W>
bool chain_bias_reads_any(const S& s, const W& w) {
  bool reads = false;
  with_chain_bias(s, [&](const auto& b) { reads = reads || reads_any(b, w); });
  return reads;
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

// Room for the kernel's sums of additive's dw (attention_gradient's
// d_term_weight), where w is among the targets; empty elsewhere.
template <class T, class E, class... X>
std::vector<T> term_weight_sums(const E& e, std::size_t width, const wrt_t<X...>& targets) {
  const auto& core = score_core(e.lhs().arg());
  if constexpr (is_similarity_v<bare_t<decltype(core)>>)
    if constexpr (is_additive_v<bare_t<decltype(core.function())>>)
      if (reads_any(std::get<2>(core.function().operands()), targets)) return std::vector<T>(width);
  return {};
}

// dQ, dK and dV of attention e on into Q, K and V as written in e, and
// additive's dw (d_term_weight, when not empty) into w.
// Each of dq, dk and dv goes to one operand, moved.
template <class T, class E, class... X>
void propagate_attention(const E& e, grad_matrix<T> dq, grad_matrix<T> dk, grad_matrix<T> dv,
                         const std::vector<T>& d_term_weight, gradients<T, X...>& acc) {
  const auto& core = score_core(e.lhs().arg());
  if constexpr (is_similarity_v<bare_t<decltype(core)>>) {  // into f's queries(Q) and keys(K)
    backprop_into(similarity_queries(core.function(), core.lhs()), [&] { return std::move(dq); }, acc);
    backprop_into(similarity_keys(core.function(), core.rhs()), [&] { return std::move(dk); }, acc);
    if constexpr (is_additive_v<bare_t<decltype(core.function())>>) {
      if (!d_term_weight.empty()) {
        const auto& w = std::get<2>(core.function().operands());
        backprop_into(w, [&] {
          grad_matrix<T> dw(w.rows(), w.cols());
          for (std::size_t c = 0; c < d_term_weight.size(); ++c) (w.rows() == 1 ? dw(0, c) : dw(c, 0)) = d_term_weight[c];
          return dw;
        }, acc);
      }
    }
  } else if constexpr (is_neg_sq_l2_v<bare_t<decltype(core)>>) {
    backprop_into(core.lhs(), [&] { return std::move(dq); }, acc);
    backprop_into(core.rhs(), [&] { return std::move(dk); }, acc);
  } else {
    backprop_into(core.lhs(), [&] { return std::move(dq); }, acc);
    backprop_into(core.rhs().arg(), [&] { return std::move(dk); }, acc);
  }
  backprop_into(e.rhs(), [&] { return std::move(dv); }, acc);
}

// The forward (unless vjp kept it), then the fused backward; dQ, dK and dV
// go on into Q, K and V as written in e.
template <class T, class A, class V, class... X>
  requires has_fused_backward<product_expr<A, V>>
void backprop(const product_expr<A, V>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  using E = product_expr<A, V>;
  const forward_kept<T>* kept = std::exchange(acc.kept, nullptr);
  const auto& scores = e.lhs().arg();
  if (!acc.fuse || functor_reads_target(scores, acc.targets)) return product_backprop(e, g, acc);
  const bool into_bias = chain_bias_reads_any(scores, acc.targets);
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
  std::vector<T> dw = term_weight_sums<T>(e, dk, acc.targets);
  kernels::attention_gradient<T> grads{view_of<const T>(g),   view_of<const T>(f.out), f.row_stats.data(),
                                       view_of<T>(dq),        view_of<T>(dk_),         view_of<T>(dv_),
                                       dw.empty() ? nullptr : dw.data()};
  grad_matrix<T> db;
  if (into_bias) db = grad_matrix<T>(n, m), grads.d_bias = view_of<T>(db);
  const std::vector<T> dt = table_sums_for(scores, acc.targets, grads);
  run_backward(&problem, &grads, 1, ext);
  propagate_tables(scores, dt, acc);
  if (into_bias) with_chain_bias(scores, [&](const auto& b) { backprop_into(b, [&] { return db; }, acc); });
  if constexpr (has_norm_sums<E>) norms.fold(problem, dq, dk_);
  propagate_attention(e, std::move(dq), std::move(dk_), std::move(dv_), dw, acc);
  fused_sink_backprop(e, g, f.out, f.row_stats.data(), acc);
}

}  // namespace qkv::detail
