// The vector-Jacobian rules of the extension nodes, for gradient.hpp, node
// by node as gradient_rules.hpp's are. The user's functors are
// differentiated with dual numbers (numeric/dual.hpp) over xsimd batches of
// keys, as the fused kernels call them (this unit's instruction set):
//   score_mod(S, f)       dS = G ∘ ∂f/∂s(S, i, j)   (0 where G is: masked)
//   similarity(Q, K, f)   with Q̃ = f.queries(Q), K̃ = f.keys(K) (or Q, K):
//                         dQ̃_ic = Σ_j G_ij ∂f/∂q(Q̃_ic, K̃_jc, c),
//                         dK̃_jc = Σ_i G_ij ∂f/∂k(Q̃_ic, K̃_jc, c),
//                         on into queries(Q) and keys(K) as written (so
//                         additive's Wq and Wk get theirs there); additive's
//                         w: dw_c = Σ_ij G_ij tanh(Q̃_ic + K̃_jc)
//   normalize_rows(X)     dX_i = (G_i − Y_i (Y_i · G_i)) / ‖X_i‖, Y = the
//                         result; 0 for a row of zeros (which stays zeros)
//   −‖q − k‖²             dQ = 2 (G K − diag(G 1) Q), dK = 2 (Gᵀ Q − diag(Gᵀ 1) K)
// A matrix that a functor reads through operands() only (a table of the
// user's) is a constant of the functor's: asking for its gradient throws.
#pragma once

#include "../expr/score_mod.hpp"
#include "../expr/similarity.hpp"
#include "../similarity/builtin.hpp"
#include "../numeric/dual.hpp"
#include "rules.hpp"

#include <xsimd/xsimd.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace qkv {

namespace detail {


[[noreturn]] inline void functor_constant(const char* node) {
  throw std::invalid_argument(std::string("qkv: gradient(e, dO, wrt(X...)): an X is read by ") + node +
                              "'s functor through operands(), where it is a constant: its gradient is not defined");
}

// score_mod(S, f, P...)'s tables: dP_e = Σ_ij G_ij ∂f/∂P_e at the scores
// that read entry e (tabled_modifier::add_slopes), row by row, W keys at a
// time; into each table that reads a target.
template <class T, class S, class F, class... X>
void table_backprop(const score_mod_expr<S, F>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  const F& f = e.function();
  bool wanted = false;
  std::apply([&](const auto&... p) { ((wanted = wanted || reads_any(p, acc.targets)), ...); }, f.operands());
  if (!wanted) return;
  if constexpr (differentiable_modifier<F, T>) {
    using B = xsimd::batch<T>;
    constexpr std::size_t W = B::size;
    const grad_matrix<T> s = value_of<T>(e.arg());
    std::vector<T> sums(f.size(), T(0));
    alignas(64) T lanes[W], gs[W], ss[W];
    for (std::size_t l = 0; l < W; ++l) lanes[l] = T(l);
    const B iota = B::load_aligned(lanes);
    for (std::size_t i = 0; i < s.rows(); ++i)
      for (std::size_t j = 0; j < s.cols(); j += W) {
        const std::size_t k = s.cols() - j < W ? s.cols() - j : W;
        bool any = false;
        for (std::size_t l = 0; l < W; ++l) {
          gs[l] = l < k ? g(i, j + l) : T(0), ss[l] = l < k ? s(i, j + l) : T(0);
          any = any || gs[l] != T(0);
        }
        if (any)
          f.add_slopes(B::load_aligned(ss), e.batch_index(), e.head_index(), B(T(i)), iota + B(T(j)),
                       B::load_aligned(gs), sums.data());
      }
    tables_into(f, sums.data(), acc);
  }
}

template <class T, class S, class F, class... X>
void backprop(const score_mod_expr<S, F>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  static_assert(differentiable_modifier<F, T>,
                "qkv: gradient(e, dO, wrt(X...)): score_mod's f cannot be differentiated: write it generically "
                "(auto parameters, arithmetic, numbers of the element type and the functions of <qkv/numeric/dual.hpp>)");
  if constexpr (is_tabled_v<F>) table_backprop(e, g, acc);
  else if (functor_reads_any(e.function(), acc.targets)) functor_constant("score_mod");
  if constexpr (differentiable_modifier<F, T>) {
    backprop_into(e.arg(), [&] {
      using B = xsimd::batch<T>;
      using D = dual<B>;
      constexpr std::size_t W = B::size;
      const grad_matrix<T> s = value_of<T>(e.arg());
      grad_matrix<T> ds(s.rows(), s.cols());
      alignas(64) T lanes[W], gs[W], ss[W], out[W];
      for (std::size_t l = 0; l < W; ++l) lanes[l] = T(l);
      const B iota = B::load_aligned(lanes);
      for (std::size_t i = 0; i < s.rows(); ++i)
        for (std::size_t j = 0; j < s.cols(); j += W) {
          const std::size_t k = s.cols() - j < W ? s.cols() - j : W;
          for (std::size_t l = 0; l < W; ++l) gs[l] = l < k ? g(i, j + l) : T(0), ss[l] = l < k ? s(i, j + l) : T(0);
          const B gb = B::load_aligned(gs);
          const D r = call_modifier(e.function(), D(B::load_aligned(ss), B(T(1))), D(B(T(i))), D(iota + B(T(j))),
                                    e.batch_index(), e.head_index());
          // A zero of G (masked, padding) passes back exactly 0, whatever f′ is there.
          xsimd::select(gb == B(T(0)), B(T(0)), gb * r.d).store_aligned(out);
          for (std::size_t l = 0; l < k; ++l) ds(i, j + l) = out[l];
        }
      return ds;
    }, acc);
  }
}

template <class T, class Q, class K, class F, class... X>
void backprop(const similarity_expr<Q, K, F>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  static_assert(differentiable_term<F, T>,
                "qkv: gradient(e, dO, wrt(X...)): the similarity's term cannot be differentiated: write it generically "
                "(auto parameters, arithmetic, numbers of the element type and the functions of <qkv/numeric/dual.hpp>)");
  const F& f = e.function();
  const auto& qs = similarity_queries(f, e.lhs());
  const auto& ks = similarity_keys(f, e.rhs());
  if (!is_additive_v<F> && functor_reads_any(f, acc.targets) && !reads_any(qs, acc.targets) &&
      !reads_any(ks, acc.targets))
    functor_constant("similarity");
  if constexpr (differentiable_term<F, T>) {
    const bool into_q = reads_any(qs, acc.targets), into_k = reads_any(ks, acc.targets);
    bool into_w = false;
    if constexpr (is_additive_v<F>) into_w = reads_any(std::get<2>(f.operands()), acc.targets);
    if (!into_q && !into_k && !into_w) return;
    const grad_matrix<T> q = value_of<T>(qs), k = value_of<T>(ks);
    const std::size_t n = q.rows(), m = k.rows(), d = q.cols();
    grad_matrix<T> dq(n, d), dk(m, d);
    // W keys at a time, component by component: K and dK transposed, so
    // that a component's keys lie side by side; the key tail zero-padded
    // (a weight of 0 passes back exactly 0).
    using B = xsimd::batch<T>;
    using D = dual<B>;
    constexpr std::size_t W = B::size;
    const std::size_t mp = (m + W - 1) / W * W;
    std::vector<T> kt(d * mp, T(0)), dkt(into_k ? d * mp : 0, T(0)), gi(mp, T(0));
    for (std::size_t j = 0; j < m; ++j)
      for (std::size_t c = 0; c < d; ++c) kt[c * mp + j] = k(j, c);
    for (std::size_t i = 0; i < n; ++i) {
      bool any = false;
      for (std::size_t j = 0; j < m; ++j) gi[j] = g(i, j), any = any || g(i, j) != T(0);
      if (!any) continue;
      for (std::size_t c = 0; c < d; ++c) {
        const B qc(q(i, c));
        B sum(T(0));
        for (std::size_t j = 0; j < mp; j += W) {
          const B gb = B::load_unaligned(gi.data() + j), kb = B::load_unaligned(kt.data() + c * mp + j);
          const auto none = gb == B(T(0));
          if (xsimd::all(none)) continue;
          if (into_q) sum += xsimd::select(none, B(T(0)), gb * call_term(f, D(qc, B(T(1))), D(kb), c).d);
          if (into_k) {
            T* at = dkt.data() + c * mp + j;
            (B::load_unaligned(at) + xsimd::select(none, B(T(0)), gb * call_term(f, D(qc), D(kb, B(T(1))), c).d))
                .store_unaligned(at);
          }
        }
        if (into_q) dq(i, c) = xsimd::hadd(sum);
      }
    }
    if (into_k)
      for (std::size_t j = 0; j < m; ++j)
        for (std::size_t c = 0; c < d; ++c) dk(j, c) = dkt[c * mp + j];
    if (into_q) backprop_into(qs, [&] { return dq; }, acc);
    if (into_k) backprop_into(ks, [&] { return dk; }, acc);
    if constexpr (is_additive_v<F>) {
      const auto& w = std::get<2>(f.operands());
      backprop_into(w, [&] {
        grad_matrix<T> dw(w.rows(), w.cols());
        for (std::size_t c = 0; c < d; ++c) {
          T sum = 0;
          for (std::size_t i = 0; i < n; ++i)
            for (std::size_t j = 0; j < m; ++j) sum += g(i, j) * f.weight_slope(q(i, c), k(j, c), c);
          (w.rows() == 1 ? dw(0, c) : dw(c, 0)) = sum;
        }
        return dw;
      }, acc);
    }
  }
}

template <class T, class X, class... Y>
void backprop(const row_normalized_expr<X>& e, const grad_matrix<T>& g, gradients<T, Y...>& acc) {
  backprop_into(e.arg(), [&] {
    const grad_matrix<T> x = value_of<T>(e.arg());
    grad_matrix<T> dx(x.rows(), x.cols());
    for (std::size_t i = 0; i < x.rows(); ++i) {
      T s = 0;
      for (std::size_t c = 0; c < x.cols(); ++c) s += x(i, c) * x(i, c);
      if (s == T(0)) continue;
      const T r = std::sqrt(s);
      T yg = 0;
      for (std::size_t c = 0; c < x.cols(); ++c) yg += x(i, c) / r * g(i, c);
      for (std::size_t c = 0; c < x.cols(); ++c) dx(i, c) = (g(i, c) - x(i, c) / r * yg) / r;
    }
    return dx;
  }, acc);
}

// Row a of x times G's row sum a (by_rows) or column sum a.
template <class T>
grad_matrix<T> scaled_rows(const grad_matrix<T>& g, const grad_matrix<T>& x, bool by_rows) {
  grad_matrix<T> r(x.rows(), x.cols());
  for (std::size_t a = 0; a < x.rows(); ++a) {
    T sum = 0;
    for (std::size_t b = 0; b < (by_rows ? g.cols() : g.rows()); ++b) sum += by_rows ? g(a, b) : g(b, a);
    for (std::size_t c = 0; c < x.cols(); ++c) r(a, c) = sum == T(0) ? T(0) : sum * x(a, c);  // (a masked key's padding: 0)
  }
  return r;
}

template <class T, class Q, class K, class... X>
void backprop(const neg_sq_l2_expr<Q, K>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  const bool into_q = reads_any(e.lhs(), acc.targets), into_k = reads_any(e.rhs(), acc.targets);
  if (!into_q && !into_k) return;
  const grad_matrix<T> q = value_of<T>(e.lhs()), k = value_of<T>(e.rhs());
  backprop_into(e.lhs(), [&] { return eval((gradient_times(g, k, false) - scaled_rows(g, q, true)) * T(2), naive); }, acc);
  backprop_into(e.rhs(), [&] { return eval((transpose(g) * q - scaled_rows(g, k, false)) * T(2), naive); }, acc);
}

}  // namespace detail
}  // namespace qkv
