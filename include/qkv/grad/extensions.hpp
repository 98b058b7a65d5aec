// The vector-Jacobian rules of the extension nodes, for gradient.hpp, node
// by node as gradient_rules.hpp's are. The user's functors are
// differentiated with dual numbers (numeric/dual.hpp), one number at a time:
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

namespace qkv {

namespace detail {


[[noreturn]] inline void functor_constant(const char* node) {
  throw std::invalid_argument(std::string("qkv: gradient(e, dO, wrt(X...)): an X is read by ") + node +
                              "'s functor through operands(), where it is a constant: its gradient is not defined");
}

template <class T, class S, class F, class... X>
void backprop(const score_mod_expr<S, F>& e, const grad_matrix<T>& g, gradients<T, X...>& acc) {
  static_assert(differentiable_modifier<F, T>,
                "qkv: gradient(e, dO, wrt(X...)): score_mod's f cannot be differentiated: write it generically "
                "(auto parameters, arithmetic, numbers of the element type and the functions of <qkv/numeric/dual.hpp>)");
  if (functor_reads_any(e.function(), acc.targets)) functor_constant("score_mod");
  if constexpr (differentiable_modifier<F, T>) {
    backprop_into(e.arg(), [&] {
      const grad_matrix<T> s = value_of<T>(e.arg());
      grad_matrix<T> ds(s.rows(), s.cols());
      for (std::size_t i = 0; i < s.rows(); ++i)
        for (std::size_t j = 0; j < s.cols(); ++j)
          ds(i, j) = g(i, j) == T(0) ? T(0)
                                     : g(i, j) * call_modifier(e.function(), dual<T>(s(i, j), T(1)), dual<T>(T(i)),
                                                               dual<T>(T(j)), e.batch_index(), e.head_index())
                                                     .d;
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
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < m; ++j) {
        if (g(i, j) == T(0)) continue;
        for (std::size_t c = 0; c < d; ++c) {
          if (into_q) dq(i, c) += g(i, j) * call_term(f, dual<T>(q(i, c), T(1)), dual<T>(k(j, c)), c).d;
          if (into_k) dk(j, c) += g(i, j) * call_term(f, dual<T>(q(i, c)), dual<T>(k(j, c), T(1)), c).d;
        }
      }
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
