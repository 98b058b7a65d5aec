// The attention backward in a reference number type (ref::real_for<T>: double
// for a float result), and bounds on the error of the library's node-by-node
// and fused backward passes (grad/gradient.hpp, kernels/attention_backward.hpp),
// shared by the gradient tests.
#pragma once

#include "reference.hpp"

#include <cmath>
#include <cstddef>
#include <limits>

namespace ref {

enum class attention_form { plain, causal, mask, bias };

template <class R = real>
struct gradient_reference {
  basic_mat<R> dq, dk, dv;  // the exact gradients
  basic_mat<R> bq, bk, bv;  // bounds on the computed ones' errors
};

// The analytic backward of O = softmax(S) V, S = c·Q Kᵀ (causal, masked, or
// plus a constant bias B):
//   dV = Pᵀ dO,  dP = dO Vᵀ,  r_i = Σ_j P_ij dP_ij,  dS = P ∘ (dP − r),
//   dQ = c·dS K,  dK = c·dSᵀ Q.
// The bound follows the backward's steps in T (u = T's unit roundoff, γ_k as
// in reference.hpp), from the error of the weights it recomputes: P̂ = P(1 + ρ)
// with e the scores' error γ_dk·c·(|Q||K|ᵀ) + 2u|s| (as for the forward; a
// bias rides in the same fused multiply-add; a weight below the smallest
// normal may flush: + tiny).
//  - Node by node, the softmax of the scores again:
//      ρ_ij = 2·max_k e_ik + u|s_ij − max_k s_ik| + 5u + γ_m.
//  - Fused, P̂ = exp(fl(ŝ − m̂)) · fl(1 / l̂) from the forward's row maximum
//    m̂ (a computed score: within max_k e_ik of the true one) and sum l̂: the
//    exponent is off by e_ij + max_k e_ik and rounds by u|s_ij − max_k s_ik|,
//    exp is within 4u; l̂ sums terms with those errors (their P-weighted mean,
//    at most 2·max_k e_ik + u Σ_k P_ik |s_ik − max s| + 4u), rounded and
//    rescaled by the online softmax (γ_2m); the reciprocal and the product
//    add 2u:
//      ρ_ij = 2·max_k e_ik + u|s_ij − max_k s_ik| + u Σ_k P_ik |s_ik − max_k s_ik| + γ_2m + 10u
//    (twice the score errors, as node by node: the weight's and the sum's).
// Then, with Pe = P·ρ + tiny:
//   dV:  Pe ᵀ|dO| + γ_n (P + Pe)ᵀ|dO|
//   dP:  dPe = γ_dv |dO||V|ᵀ
//   r:   node by node, re_i = Σ_j (dPe_ij P_ij + |dP_ij| Pe_ij) + γ_{m+1} Σ_j |dP_ij| P_ij;
//        fused, r_i is D_i = Σ_l dO_il O_il from the forward's O (error Oe,
//        its bound as the forward's tests hold it): re_i = Σ_l |dO_il| Oe_il
//        + γ_dv Σ_l |dO_il| (|O_il| + Oe_il)
//   dS:  dSe = Pe |dP − r| + P (dPe + re) + 2u P (|dP| + |r|)   (+ u|dS| fused: the scale)
//   dQ:  c·(dSe |K| + γ_{m+1} |dS||K|)   (the scaling's rounding, then the product)
//   dK:  c·(dSeᵀ|Q| + γ_{n+1} |dS|ᵀ|Q|)
// each doubled for the second-order terms, as the forward's bound is.
template <class T, class Keep, class R>
gradient_reference<R> attention_backward(const basic_mat<R>& q, const basic_mat<R>& k, const basic_mat<R>& v,
                                         const basic_mat<R>& d_o, std::type_identity_t<R> c, attention_form f,
                                         const Keep& keep, const std::type_identity_t<basic_mat<R>>* bias, bool fused) {
  using mat = basic_mat<R>;
  // γ_k and T's smallest normal in R: no long-double arithmetic in the loops.
  const auto gamma_t = [](std::size_t terms) { return static_cast<R>(gamma<T>(terms)); };
  const R small = tiny<T>;
  const std::size_t n = q.rows, m = k.rows, dk = q.cols, dv = v.cols;
  const R u = unit_roundoff<T>;
  mat s = scale(matmul(q, transpose(k)), c);
  if (f == attention_form::causal) s = causal(s);
  if (f == attention_form::mask) s = masked(s, keep);
  if (f == attention_form::bias)
    for (std::size_t x = 0; x < s.v.size(); ++x) s.v[x] += bias->v[x];
  const mat p = softmax(s);
  const mat qk = scale(matmul(abs(q), transpose(abs(k))), c);
  mat pe(n, m);
  for (std::size_t i = 0; i < n; ++i) {
    R emax = 0, smax = -std::numeric_limits<R>::infinity(), spread = 0;
    for (std::size_t j = 0; j < m; ++j)
      if (p(i, j) != 0)
        emax = std::fmax(emax, gamma_t(dk) * qk(i, j) + 2 * u * std::fabs(s(i, j))), smax = std::fmax(smax, s(i, j));
    for (std::size_t j = 0; j < m; ++j)
      if (p(i, j) != 0) spread += p(i, j) * std::fabs(s(i, j) - smax);
    for (std::size_t j = 0; j < m; ++j) {
      if (p(i, j) == 0) continue;
      const R rho = fused ? 2 * emax + u * std::fabs(s(i, j) - smax) + u * spread + gamma_t(2 * m) + 10 * u
                             : 2 * emax + u * std::fabs(s(i, j) - smax) + 5 * u + gamma_t(m);
      pe(i, j) = p(i, j) * rho + small;
    }
  }
  gradient_reference<R> r;
  const mat pt = transpose(p), pet = transpose(pe), ado = abs(d_o);
  r.dv = matmul(pt, d_o);
  r.bv = matmul(pet, ado);
  const mat pv = matmul(pt, ado);
  for (std::size_t x = 0; x < r.bv.v.size(); ++x) r.bv.v[x] = 2 * (r.bv.v[x] + gamma_t(n) * (pv.v[x] + r.bv.v[x]));

  const mat dp = matmul(d_o, transpose(v));
  const mat dpe = scale(matmul(ado, transpose(abs(v))), gamma_t(dv));
  const mat o = matmul(p, v);
  const mat oe = attention_bound<T>(q, k, v, c, s, p);
  mat ds(n, m), dse(n, m);
  for (std::size_t i = 0; i < n; ++i) {
    R ri = 0, re = 0, mag = 0;
    for (std::size_t j = 0; j < m; ++j) {
      ri += p(i, j) * dp(i, j);
      re += dpe(i, j) * p(i, j) + std::fabs(dp(i, j)) * pe(i, j);
      mag += std::fabs(dp(i, j)) * p(i, j);
    }
    re += gamma_t(m + 1) * mag;
    if (fused) {
      re = 0;
      for (std::size_t l = 0; l < dv; ++l)
        re += std::fabs(d_o(i, l)) * (oe(i, l) + gamma_t(dv) * (std::fabs(o(i, l)) + oe(i, l)));
    }
    for (std::size_t j = 0; j < m; ++j) {
      ds(i, j) = p(i, j) * (dp(i, j) - ri);
      dse(i, j) = pe(i, j) * std::fabs(dp(i, j) - ri) + p(i, j) * (dpe(i, j) + re) +
                  2 * u * p(i, j) * (std::fabs(dp(i, j)) + std::fabs(ri)) + (fused ? u * std::fabs(ds(i, j)) : R(0));
    }
  }
  const mat ak = abs(k), aq = abs(q), ads = abs(ds);
  r.dq = scale(matmul(ds, k), c);
  r.dk = scale(matmul(transpose(ds), q), c);
  const mat eq = matmul(dse, ak), mq = matmul(ads, ak);
  const mat ek = matmul(transpose(dse), aq), mk = matmul(transpose(ads), aq);
  r.bq = mat(n, dk);
  r.bk = mat(m, dk);
  for (std::size_t x = 0; x < r.bq.v.size(); ++x) r.bq.v[x] = 2 * c * (eq.v[x] + gamma_t(m + 1) * mq.v[x]);
  for (std::size_t x = 0; x < r.bk.v.size(); ++x) r.bk.v[x] = 2 * c * (ek.v[x] + gamma_t(n + 1) * mk.v[x]);
  return r;
}

}  // namespace ref
