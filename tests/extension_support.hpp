// What the tests of the extension points share: the user's similarities
// and modifiers (each written once, generically, for numbers and xsimd
// batches), the long-double reference of every similarity with the bound on
// the error of each score, the inputs of one attention, and the check of a
// naive and a fused result against the reference.
//
// The tolerances: every computed score carries an absolute error bounded per
// similarity (derived beside each reference below), that error propagates
// through the softmax and the product with V as ref::attention_bound_from_scores
// argues, and a result must lie within twice that first-order bound. The
// fused result must also be about as accurate as the naive one: its error at
// most twice the naive error, with a floor of 8 units of roundoff of the
// largest output (attention_test.cpp explains the floor).
#pragma once

#include "support.hpp"

#include <qkv/qkv.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <tuple>
#include <vector>

namespace test::ext {

using namespace qkv;
using test::fill;
using test::same_bits;
using test::same_bits_tensor;
using test::threads_guard;

using ref::real;
inline constexpr real rinf = std::numeric_limits<real>::infinity();

template <class T>
using dmat = matrix<T, dyn, dyn>;
using bmat = matrix<bool, dyn, dyn>;

inline const char* type_name(float) { return "float"; }
inline const char* type_name(double) { return "double"; }

// ---------------------------------------------------------------------------
// The user's similarities and modifiers used below. Each is written once,
// generically, for numbers and xsimd batches.

// The dot product, as the user would write it.
struct user_dot_t {
  template <class V>
  V operator()(const V& q, const V& k) const {
    return q * k;
  }
};

// −‖q − k‖₁.
struct neg_l1_t {
  template <class V>
  V operator()(const V& q, const V& k) const {
    using std::abs;
    return -abs(q - k);
  }
};

// Σ_c w_c q_c k_c: the form with the component index.
template <class T>
struct weighted_dot_t {
  const T* w;
  template <class V>
  V operator()(const V& q, const V& k, std::size_t c) const {
    return q * k * V(w[c]);
  }
};

// The L2-normalised dot product by queries() and keys(): the cosine.
struct unit_dot_t {
  template <class Q>
  auto queries(const Q& q) const {
    return normalize_rows(q);
  }
  template <class K>
  auto keys(const K& k) const {
    return normalize_rows(k);
  }
  template <class V>
  V operator()(const V& q, const V& k) const {
    return q * k;
  }
};

// The same with queries() and keys() returning matrices by value (the
// normalised rows evaluated): the library must keep them alive.
struct unit_dot_by_value_t {
  template <class Q>
  auto queries(const Q& q) const {
    return eval(normalize_rows(q));
  }
  template <class K>
  auto keys(const K& k) const {
    return eval(normalize_rows(k));
  }
  template <class V>
  V operator()(const V& q, const V& k) const {
    return q * k;
  }
};

// qᵀ W k by a projection of the queries: bilinear(W).
template <class W>
struct projected_dot_t {
  const W* w;
  template <class Q>
  auto queries(const Q& q) const {
    return q * *w;
  }
  template <class V>
  V operator()(const V& q, const V& k) const {
    return q * k;
  }
};

// (q Wq)·(k Wk): both sides projected to da.
template <class W>
struct two_sided_t {
  const W* wq;
  const W* wk;
  template <class Q>
  auto queries(const Q& q) const {
    return q * *wq;
  }
  template <class K>
  auto keys(const K& k) const {
    return k * *wk;
  }
  template <class V>
  V operator()(const V& q, const V& k) const {
    return q * k;
  }
};

// Soft-capping c·tanh(s/c) (std::tanh on numbers; xsimd's, found by ADL, on batches).
template <class T>
struct softcap_t {
  T c;
  template <class V>
  V operator()(const V& s, const V&, const V&) const {
    using std::tanh;
    return c * tanh(s / c);
  }
};

// ALiBi: s − slope·(i − j).
template <class T>
struct alibi_t {
  T slope;
  template <class V>
  V operator()(const V& s, const V& i, const V& j) const {
    return s - slope * (i - j);
  }
};

// A relative-position bias by buckets that grow with the distance:
// s + w·⌊√|i − j|⌋, computed as ⌊√(|i − j| + ½)⌋, the same for integers, so
// that the buckets stay exact with a square root a few ulps off (xsimd 8.1
// approximates the float square root of NEON batches): √(k² + ½) lies
// 1/(4k) above k and √(k² − ½) as far below, far more than an ulp for the
// distances here.
template <class T>
struct bucket_t {
  T w;
  template <class V>
  V operator()(const V& s, const V& i, const V& j) const {
    using std::abs;
    using std::floor;
    using std::sqrt;
    return s + w * floor(sqrt(abs(i - j) + V(0.5)));
  }
};

// The dot product, counting its calls (the count does not change its results).
struct counting_dot {
  std::atomic<std::size_t>* calls;
  template <class V>
  V operator()(const V& q, const V& k) const {
    calls->fetch_add(1, std::memory_order_relaxed);
    return q * k;
  }
};

static_assert(similarity_term<neg_l1_t, float> && similarity_term<weighted_dot_t<double>, double>);
static_assert(similarity_term<user_dot_t, double> && similarity_term<unit_dot_t, float>);
static_assert(score_modifier<softcap_t<float>, float> && score_modifier<alibi_t<double>, double>);
static_assert(score_modifier<bucket_t<float>, float>);

// ---------------------------------------------------------------------------
// The reference: the scores of each similarity in long double, and the bound
// on the absolute error of each score as computed in T (before any scaling).

struct scores {
  ref::mat s, err;
};

// Σ_c |a_ic|·|b_jc|.
inline ref::mat abs_dots(const ref::mat& a, const ref::mat& b) {
  return ref::matmul(ref::abs(a), ref::transpose(ref::abs(b)));
}

// q·k: a d-term dot product, γ_d·Σ|q_c||k_c| in any order of summation (the
// user's term q * k rounds its product and its sum, the same count).
template <class T>
scores dot_scores(const ref::mat& q, const ref::mat& k) {
  return {ref::matmul(q, ref::transpose(k)), ref::scale(abs_dots(q, k), ref::gamma<T>(q.cols))};
}

// qᵀ W k as (q W)·k: X = qW carries γ_dq·(|q||W|), the dot with k adds
// γ_dk·(|X||k|): together (γ_dq + γ_dk + γ_dq·γ_dk)·(|q||W||k|ᵀ).
template <class T>
scores bilinear_scores(const ref::mat& q, const ref::mat& w, const ref::mat& k) {
  const real g = ref::gamma<T>(q.cols) + ref::gamma<T>(k.cols) + ref::gamma<T>(q.cols) * ref::gamma<T>(k.cols);
  return {ref::matmul(ref::matmul(q, w), ref::transpose(k)),
          ref::scale(ref::matmul(ref::matmul(ref::abs(q), ref::abs(w)), ref::transpose(ref::abs(k))), g)};
}

// (q Wq)·(k Wk): each projection γ_dq or γ_dk of |q||Wq| and |k||Wk|, the
// dot of the projections γ_da: (γ_dq + γ_dk + γ_da)·(|q||Wq|)·(|k||Wk|)ᵀ to first order.
template <class T>
scores two_sided_scores(const ref::mat& q, const ref::mat& wq, const ref::mat& k, const ref::mat& wk) {
  const real g = ref::gamma<T>(q.cols) + ref::gamma<T>(k.cols) + ref::gamma<T>(wq.cols);
  const ref::mat a = ref::matmul(q, wq), b = ref::matmul(k, wk);
  const ref::mat aa = ref::matmul(ref::abs(q), ref::abs(wq)), ab = ref::matmul(ref::abs(k), ref::abs(wk));
  return {ref::matmul(a, ref::transpose(b)), ref::scale(ref::matmul(aa, ref::transpose(ab)), g)};
}

// Σ_c w_c tanh(a_ic + b_jc), a = q Wq, b = k Wk. The projections carry
// α_ic = γ_dq(|q||Wq|)_ic and β_jc = γ_dk(|k||Wk|)_jc; their sum rounds by
// u|a + b|; tanh is 1-Lipschitz, so its argument's error passes through
// unamplified, and it is itself within 4u·|tanh| (std::tanh and xsimd's
// measure under 3u); the weight's product rounds by u, the da-term sum γ_da:
//   e_ij = Σ_c |w_c|(α_ic + β_jc + u|a_ic + b_jc|) + (5u + γ_da)·Σ_c |w_c tanh(a_ic + b_jc)|.
template <class T>
scores additive_scores(const ref::mat& q, const ref::mat& wq, const ref::mat& k, const ref::mat& wk,
                       const std::vector<real>& w) {
  const real u = ref::unit_roundoff<T>;
  const std::size_t da = w.size();
  const ref::mat a = ref::matmul(q, wq), b = ref::matmul(k, wk);
  const ref::mat alpha = ref::scale(ref::matmul(ref::abs(q), ref::abs(wq)), ref::gamma<T>(q.cols));
  const ref::mat beta = ref::scale(ref::matmul(ref::abs(k), ref::abs(wk)), ref::gamma<T>(k.cols));
  scores r{ref::mat(q.rows, k.rows), ref::mat(q.rows, k.rows)};
  for (std::size_t i = 0; i < q.rows; ++i)
    for (std::size_t j = 0; j < k.rows; ++j) {
      real s = 0, lin = 0, mag = 0;
      for (std::size_t c = 0; c < da; ++c) {
        const real t = a(i, c) + b(j, c), th = std::tanh(t);
        s += w[c] * th;
        lin += std::fabs(w[c]) * (alpha(i, c) + beta(j, c) + u * std::fabs(t));
        mag += std::fabs(w[c] * th);
      }
      r.s(i, j) = s;
      r.err(i, j) = lin + (5 * u + ref::gamma<T>(da)) * mag;
    }
  return r;
}

// The rows divided by their norms (a zero row stays zero).
inline ref::mat unit_rows(ref::mat x) {
  for (std::size_t i = 0; i < x.rows; ++i) {
    real ss = 0;
    for (std::size_t c = 0; c < x.cols; ++c) ss += x(i, c) * x(i, c);
    if (ss == 0) continue;
    const real norm = std::sqrt(ss);
    for (std::size_t c = 0; c < x.cols; ++c) x(i, c) /= norm;
  }
  return x;
}

// q·k/(‖q‖‖k‖). Each normalised component: ‖x‖² by a d-term sum (γ_d), its
// square root (half that, plus u), the reciprocal (u), the product (u):
// relative γ_d/2 + 3u. The dot of two such rows: 2(γ_d/2 + 3u) from the
// factors and γ_d from the sum, of Σ|q̂_c||k̂_c| (≤ 1):
//   e_ij = (2γ_d + 6u)·Σ_c |q̂_c||k̂_c|; a zero row gives exactly 0.
template <class T>
scores cosine_scores(const ref::mat& q, const ref::mat& k) {
  const ref::mat qh = unit_rows(q), kh = unit_rows(k);
  const real g = 2 * ref::gamma<T>(q.cols) + 6 * ref::unit_roundoff<T>;
  return {ref::matmul(qh, ref::transpose(kh)), ref::scale(abs_dots(qh, kh), g)};
}

// −‖q − k‖², computed (both strategies) as 2q·k − ‖q‖² − ‖k‖² (the fused
// one leaving −‖q‖², a constant of the row, out unless a score_mod needs
// it). The three sums carry γ_d of M_ij = 2Σ|q_c||k_c| + ‖q‖² + ‖k‖²; the
// doubling is exact; the two subtractions (naive) each round by at most
// u·M_ij; fused, the scale's rounding into 2·scale and scale, and the three
// products, round each term by 2u of itself (2u·M_ij in all), the two
// additions by u·M_ij each:
//   e_ij = (γ_d + 5u)·M_ij, however small −‖q − k‖² itself is.
template <class T>
scores neg_sq_l2_scores(const ref::mat& q, const ref::mat& k) {
  scores r{ref::mat(q.rows, k.rows), ref::mat(q.rows, k.rows)};
  const real g = ref::gamma<T>(q.cols) + 5 * ref::unit_roundoff<T>;
  for (std::size_t i = 0; i < q.rows; ++i)
    for (std::size_t j = 0; j < k.rows; ++j) {
      real s = 0, mag = 0;
      for (std::size_t c = 0; c < q.cols; ++c) {
        const real diff = q(i, c) - k(j, c);
        s -= diff * diff;
        mag += 2 * std::fabs(q(i, c) * k(j, c)) + q(i, c) * q(i, c) + k(j, c) * k(j, c);
      }
      r.s(i, j) = s;
      r.err(i, j) = g * mag;
    }
  return r;
}

// −Σ_c |q_c − k_c|: each difference rounds by u, the sum γ_{d−1}: γ_d·|s|.
template <class T>
scores neg_l1_scores(const ref::mat& q, const ref::mat& k) {
  scores r{ref::mat(q.rows, k.rows), ref::mat(q.rows, k.rows)};
  for (std::size_t i = 0; i < q.rows; ++i)
    for (std::size_t j = 0; j < k.rows; ++j) {
      real s = 0;
      for (std::size_t c = 0; c < q.cols; ++c) s -= std::fabs(q(i, c) - k(j, c));
      r.s(i, j) = s;
      r.err(i, j) = ref::gamma<T>(q.cols) * std::fabs(s);
    }
  return r;
}

// Σ_c w_c q_c k_c: two products and a sum, γ_{d+1}·Σ|w_c q_c k_c|.
template <class T>
scores weighted_scores(const ref::mat& q, const ref::mat& k, const std::vector<real>& w) {
  scores r{ref::mat(q.rows, k.rows), ref::mat(q.rows, k.rows)};
  for (std::size_t i = 0; i < q.rows; ++i)
    for (std::size_t j = 0; j < k.rows; ++j) {
      real s = 0, mag = 0;
      for (std::size_t c = 0; c < q.cols; ++c) {
        s += w[c] * q(i, c) * k(j, c);
        mag += std::fabs(w[c] * q(i, c) * k(j, c));
      }
      r.s(i, j) = s;
      r.err(i, j) = ref::gamma<T>(q.cols + 1) * mag;
    }
  return r;
}

// The final scores scale·s (+ b): the scale's rounding, that of its
// reciprocal where the kernel multiplies by it, the scaling and the bias's
// addition (or the fused multiply-add that does both) add at most
// 3u·(|scale·s| + |b|) to the similarity's own error, scaled.
template <class T>
scores scaled(const scores& raw, real scale, const ref::mat* bias = nullptr) {
  const real u = ref::unit_roundoff<T>;
  scores r{ref::scale(raw.s, scale), ref::scale(raw.err, scale)};
  for (std::size_t x = 0; x < r.s.v.size(); ++x) {
    const real b = bias != nullptr ? bias->v[x] : 0;
    r.err.v[x] += 3 * u * (std::fabs(r.s.v[x]) + std::fabs(b));
    r.s.v[x] += b;
  }
  return r;
}

// A modifier's reference (in long double) and how it moves each score's
// error bound: f' ≤ 1 passes the error through, plus f's own roundings.
template <class T>
real apply(const softcap_t<T>& f, real s, real, real) {
  return static_cast<real>(f.c) * std::tanh(s / static_cast<real>(f.c));
}
// s/c rounds by u|s/c|, amplified by at most c; tanh 4u (see additive); ×c, u.
template <class T>
real propagate(const softcap_t<T>&, real e, real s, real out, real, real) {
  const real u = ref::unit_roundoff<T>;
  return (std::isinf(s) ? 0 : e + u * std::fabs(s)) + 5 * u * std::fabs(out);
}
template <class T>
real apply(const alibi_t<T>& f, real s, real i, real j) {
  return s - static_cast<real>(f.slope) * (i - j);
}
// i − j is exact; slope·(i − j) rounds by u of itself, the subtraction by u|out|.
template <class T>
real propagate(const alibi_t<T>& f, real e, real, real out, real i, real j) {
  const real u = ref::unit_roundoff<T>;
  return e + u * std::fabs(static_cast<real>(f.slope) * (i - j)) + u * std::fabs(out);
}
template <class T>
real apply(const bucket_t<T>& f, real s, real i, real j) {
  return s + static_cast<real>(f.w) * std::floor(std::sqrt(std::fabs(i - j)));
}
template <class T>
real propagate(const bucket_t<T>& f, real e, real, real out, real i, real j) {
  const real u = ref::unit_roundoff<T>;
  return e + u * std::fabs(static_cast<real>(f.w) * std::floor(std::sqrt(std::fabs(i - j)))) + u * std::fabs(out);
}

template <class F>
scores modified(const scores& in, const F& f) {
  scores r = in;
  for (std::size_t i = 0; i < in.s.rows; ++i)
    for (std::size_t j = 0; j < in.s.cols; ++j) {
      const real s = in.s(i, j), out = apply(f, s, real(i), real(j));
      r.s(i, j) = out;
      r.err(i, j) = std::isinf(out) ? 0 : propagate(f, in.err(i, j), s, out, real(i), real(j));
    }
  return r;
}

template <class P>
ref::mat masked_by(ref::mat s, const P& keep) {
  for (std::size_t i = 0; i < s.rows; ++i)
    for (std::size_t j = 0; j < s.cols; ++j)
      if (!keep(i, j)) s(i, j) = -rinf;
  return s;
}

// The mean absolute error over every output.
template <class A, class R>
R mean_error(const A& got, const ref::basic_mat<R>& want) {
  R sum = 0;
  for (std::size_t i = 0; i < want.rows; ++i)
    for (std::size_t j = 0; j < want.cols; ++j) sum += std::fabs(static_cast<R>(got(i, j)) - want(i, j));
  return want.v.empty() ? 0 : sum / static_cast<R>(want.v.size());
}

// Holds a naive and a fused result to softmax(s)·v within the bound from
// the scores' errors, and the fused error to twice the naive one (floored).
// The weights and outputs of a float (or 2-byte) result in double
// (ref::basic_mat): the exact scores rounded to double move them by about
// 2⁻⁵³·|s|, some 10⁻⁹ of the float bound.
template <class T, class A, class B>
void check_pair(const A& got_naive, const B& got_fused, const scores& sc, const ref::mat& v_exact,
                bool compare_to_naive = true) {
  using R = ref::real_for<T>;
  const ref::basic_mat<R> s = ref::from<R>(sc.s), err = ref::from<R>(sc.err), v = ref::from<R>(v_exact);
  const ref::basic_mat<R> p = ref::softmax(s);
  const ref::basic_mat<R> want = ref::matmul(p, v);
  const ref::basic_mat<R> bound = ref::attention_bound_from_scores<T>(err, v, s, p);
  REQUIRE(got_naive.rows() == want.rows);
  REQUIRE(got_naive.cols() == want.cols);
  REQUIRE(got_fused.rows() == want.rows);
  REQUIRE(got_fused.cols() == want.cols);
  CHECK(ref::worst_ratio(got_naive, want, bound) <= 1);
  CHECK(ref::worst_ratio(got_fused, want, bound) <= 1);
  const R floor = 8 * static_cast<R>(ref::unit_roundoff<T>) * ref::max_abs(want);
  // Below 64 outputs the largest (or the mean) of two strategies' errors of
  // one size differs by more than 2× for too many inputs to say anything:
  // the bound alone holds there.
  if (!compare_to_naive || want.v.size() < 64) return;
  if (want.rows > 4) {
    CHECK(ref::max_error(got_fused, want) <= 2 * std::fmax(ref::max_error(got_naive, want), floor));
  } else {
    // Up to 4 queries take the decoding path, which rounds the scores in
    // another order than the naive product: two independent errors of one
    // size, whose largest over a few rows differs by more than 2× either way
    // round for some inputs. Their mean is steady: hold that to 2×.
    CHECK(mean_error(got_fused, want) <= 2 * std::fmax(mean_error(got_naive, want), floor));
  }
}

// Rows of the output that must be exactly zero (every score masked).
template <class A>
bool zero_row(const A& a, std::size_t i) {
  for (std::size_t l = 0; l < a.cols(); ++l)
    if (a(i, l) != 0) return false;
  return true;
}

// ---------------------------------------------------------------------------
// The inputs of one attention: Q (n×dq), K (m×dk), V (m×dv), a bias, a mask
// with some rows empty, a bilinear form W (dq×dk), additive projections Wq
// (dq×da), Wk (dk×da) and weights w (as a row and as a column), and the
// weights of the component-wise similarity.
template <class T>
struct inputs {
  std::size_t n, m, dq, dk, dv, da;
  dmat<T> Q, K, V, B, W, Wq, Wk, wrow, wcol;
  bmat M;
  std::vector<T> weights;

  inputs(std::size_t n_, std::size_t m_, std::size_t dq_, std::size_t dk_, std::size_t dv_, std::uint32_t seed,
         double range = 1)
      : n(n_), m(m_), dq(dq_), dk(dk_), dv(dv_), da(dq_ / 2 + 3), Q(n, dq), K(m, dk), V(m, dv), B(n, m), W(dq, dk),
        Wq(dq, da), Wk(dk, da), wrow(1, da), wcol(da, 1), M(n, m), weights(dq) {
    ref::rng rng(seed);
    rng.fill(Q, -range, range);
    rng.fill(K, -range, range);
    rng.fill(V);
    rng.fill(B, -2, 2);
    const double wr = 2 / std::sqrt(double(dq));
    rng.fill(W, -wr, wr);
    rng.fill(Wq, -wr, wr);
    rng.fill(Wk, -2 / std::sqrt(double(dk)), 2 / std::sqrt(double(dk)));
    rng.fill(wrow);
    for (std::size_t c = 0; c < da; ++c) wcol(c, 0) = wrow(0, c);
    for (std::size_t c = 0; c < dq; ++c) weights[c] = T(0.5) + T(c) / T(dq);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < m; ++j) M(i, j) = i % 5 != 1 && rng.coin(0.7);
  }
  std::vector<real> real_weights() const { return {weights.begin(), weights.end()}; }
  std::vector<real> real_w() const {
    std::vector<real> r(da);
    for (std::size_t c = 0; c < da; ++c) r[c] = wrow(0, c);
    return r;
  }
};

enum class kind {
  dot, user_dot, bilinear, projected, additive_row, additive_col, cosine, unit_dot, unit_dot_by_value,
  neg_sq_l2, neg_l1, weighted, two_sided
};

inline const char* name(kind k) {
  const char* names[] = {"dot", "user dot", "bilinear", "projected dot", "additive (w a row)", "additive (w a column)",
                         "cosine", "unit dot (queries/keys)", "unit dot (queries/keys by value)", "neg_sq_l2",
                         "user -l1", "user weighted dot (f(q, k, c))", "two-sided projection"};
  return names[int(k)];
}

// Whether the similarity reads Q and K of different widths.
inline bool asymmetric(kind k) {
  return k == kind::bilinear || k == kind::projected || k == kind::additive_row || k == kind::additive_col ||
         k == kind::two_sided;
}

template <class T>
scores reference_scores(kind k, const inputs<T>& in) {
  const auto q = ref::from(in.Q), kk = ref::from(in.K);
  switch (k) {
    case kind::dot:
    case kind::user_dot: return dot_scores<T>(q, kk);
    case kind::bilinear:
    case kind::projected: return bilinear_scores<T>(q, ref::from(in.W), kk);
    case kind::additive_row:
    case kind::additive_col: return additive_scores<T>(q, ref::from(in.Wq), kk, ref::from(in.Wk), in.real_w());
    case kind::cosine:
    case kind::unit_dot:
    case kind::unit_dot_by_value: return cosine_scores<T>(q, kk);
    case kind::neg_sq_l2: return neg_sq_l2_scores<T>(q, kk);
    case kind::neg_l1: return neg_l1_scores<T>(q, kk);
    case kind::weighted: return weighted_scores<T>(q, kk, in.real_weights());
    case kind::two_sided: return two_sided_scores<T>(q, ref::from(in.Wq), kk, ref::from(in.Wk));
  }
  return {};
}

// The built-in similarities; the others are written as a user would.
inline bool builtin(kind k) {
  return k == kind::dot || k == kind::bilinear || k == kind::additive_row || k == kind::additive_col ||
         k == kind::cosine || k == kind::neg_sq_l2;
}

// Calls body(make) with make() building similarity(Q, K, f) for the kind,
// one of the built-in kinds or one of the user's (Builtin).
template <bool Builtin, class T, class Body>
void with_similarity(kind k, const inputs<T>& in, Body&& body) {
  if constexpr (Builtin) {
    switch (k) {
      case kind::dot: return body([&] { return similarity(in.Q, in.K, qkv::dot); });
      case kind::bilinear: return body([&] { return similarity(in.Q, in.K, bilinear(in.W)); });
      case kind::additive_row: return body([&] { return similarity(in.Q, in.K, additive(in.Wq, in.Wk, in.wrow)); });
      case kind::additive_col: return body([&] { return similarity(in.Q, in.K, additive(in.Wq, in.Wk, in.wcol)); });
      case kind::cosine: return body([&] { return similarity(in.Q, in.K, cosine); });
      case kind::neg_sq_l2: return body([&] { return similarity(in.Q, in.K, neg_sq_l2); });
      default: FAIL("not a built-in similarity: " << name(k));
    }
  } else {
    switch (k) {
      case kind::user_dot: return body([&] { return similarity(in.Q, in.K, [](auto q, auto kk) { return q * kk; }); });
      case kind::projected: return body([&] { return similarity(in.Q, in.K, projected_dot_t<dmat<T>>{&in.W}); });
      case kind::unit_dot: return body([&] { return similarity(in.Q, in.K, unit_dot_t{}); });
      case kind::unit_dot_by_value: return body([&] { return similarity(in.Q, in.K, unit_dot_by_value_t{}); });
      case kind::neg_l1: return body([&] { return similarity(in.Q, in.K, neg_l1_t{}); });
      case kind::weighted: return body([&] { return similarity(in.Q, in.K, weighted_dot_t<T>{in.weights.data()}); });
      case kind::two_sided: return body([&] { return similarity(in.Q, in.K, two_sided_t<dmat<T>>{&in.Wq, &in.Wk}); });
      default: FAIL("a built-in similarity: " << name(k));
    }
  }
}

template <class T, class Body>
void with_any_similarity(kind k, const inputs<T>& in, Body&& body) {
  if (builtin(k)) with_similarity<true>(k, in, body);
  else with_similarity<false>(k, in, body);
}

enum class variant { scaled, unscaled, causal, mask, bias, bias_causal, window };

inline const char* name(variant v) {
  const char* names[] = {"/ root", "unscaled", "causal", "masked (M)", "+ bias", "causal(B + c * S)",
                         "masked (sliding window)"};
  return names[int(v)];
}

// Sliding window of w keys, bottom-right aligned as causal is: query i sits
// at key position i + m − n and sees the w keys up to it.
struct window_t {
  std::ptrdiff_t n, m, w;
  bool operator()(std::size_t i, std::size_t j) const {
    const std::ptrdiff_t pos = std::ptrdiff_t(i) + m - n, jj = std::ptrdiff_t(j);
    return jj <= pos && pos - jj < w;
  }
};

// softmax(S') * V for the variant, S' built around make() (the similarity).
template <class T, class Make, class Strategy>
dmat<T> attend(const inputs<T>& in, variant var, T root, const Make& make, Strategy strategy) {
  const T c = T(1) / root;
  const window_t win{std::ptrdiff_t(in.n), std::ptrdiff_t(in.m), 37};
  switch (var) {
    case variant::scaled: return eval(softmax(make() / root) * in.V, strategy);
    case variant::unscaled: return eval(softmax(make()) * in.V, strategy);
    case variant::causal: return eval(softmax(causal(make() / root)) * in.V, strategy);
    case variant::mask: return eval(softmax(masked(make() / root, in.M)) * in.V, strategy);
    case variant::bias: return eval(softmax(make() / root + in.B) * in.V, strategy);
    case variant::bias_causal: return eval(softmax(causal(in.B + c * make())) * in.V, strategy);
    case variant::window: return eval(softmax(masked(make() / root, win)) * in.V, strategy);
  }
  return {};
}

template <class T>
scores reference_variant(const inputs<T>& in, const scores& raw, variant var, T root) {
  const ref::mat b = ref::from(in.B);
  const real by_root = 1 / static_cast<real>(root), times_c = static_cast<real>(T(1) / root);
  switch (var) {
    case variant::scaled: return scaled<T>(raw, by_root);
    case variant::unscaled: return scaled<T>(raw, 1);
    case variant::causal: {
      scores r = scaled<T>(raw, by_root);
      r.s = ref::causal(r.s);
      return r;
    }
    case variant::mask: {
      scores r = scaled<T>(raw, by_root);
      r.s = ref::masked(r.s, in.M);
      return r;
    }
    case variant::bias: return scaled<T>(raw, by_root, &b);
    case variant::bias_causal: {
      scores r = scaled<T>(raw, times_c, &b);
      r.s = ref::causal(r.s);
      return r;
    }
    case variant::window: {
      scores r = scaled<T>(raw, by_root);
      r.s = masked_by(r.s, window_t{std::ptrdiff_t(in.n), std::ptrdiff_t(in.m), 37});
      return r;
    }
  }
  return {};
}

// Every variant of softmax(similarity(Q, K, f) ...) * V, naive and fused,
// against the reference of the same formula: check_similarity below.
// What check_similarity checks.
struct similarity_case {
  kind k;
  std::size_t n, m, d, dv;
  std::initializer_list<variant> vars;
  std::uint32_t seed;
  double range;
  bool compare_to_naive;
};

template <class T, bool Builtin>
void check_similarity_of(const similarity_case& c) {
  // (copies, not a structured binding: clang 14 cannot capture one in a lambda)
  const kind k = c.k;
  const std::size_t n = c.n, m = c.m, d = c.d, dv = c.dv;
  const std::initializer_list<variant> vars = c.vars;
  const std::uint32_t seed = c.seed;
  const double range = c.range;
  const bool compare_to_naive = c.compare_to_naive;
  if (test::emulation_skips(n, m, d, dv)) return;
  const std::size_t dk = asymmetric(k) ? d + 3 : d;
  inputs<T> in(n, m, d, dk, dv, seed, range);
  if (k == kind::cosine || k == kind::unit_dot || k == kind::unit_dot_by_value) {
    // A zero query row and a zero key row: their cosines are 0.
    for (std::size_t c = 0; c < d; ++c) in.Q(0, c) = 0;
    if (m > 1)
      for (std::size_t c = 0; c < d; ++c) in.K(m / 2, c) = 0;
  }
  // Scores of a few units: √d for the dot products and distances, a
  // temperature of 1/8 for the cosine (whose scores lie in [−1, 1]).
  const T root = (k == kind::cosine || k == kind::unit_dot || k == kind::unit_dot_by_value) ? T(0.125) : qkv::sqrt(T(d));
  const scores raw = reference_scores<T>(k, in);
  const ref::mat v = ref::from(in.V);
  with_similarity<Builtin>(k, in, [&](const auto& make) {
    if (k == kind::cosine || k == kind::unit_dot || k == kind::unit_dot_by_value) {
      const auto S = eval(make());
      for (std::size_t j = 0; j < m; ++j) CHECK(S(0, j) == T(0));
      if (m > 1)
        for (std::size_t i = 0; i < n; ++i) CHECK(S(i, m / 2) == T(0));
    }
    for (variant var : vars) {
      INFO(name(k) << ", n = " << n << ", m = " << m << ", dq = " << d << ", dk = " << dk << ", dv = " << dv << ", "
                   << name(var) << ", " << type_name(T()) << ", kernels " << active_arch());
      const scores sc = reference_variant(in, raw, var, root);
      const auto got_naive = attend(in, var, root, make, naive);
      const auto got_fused = attend(in, var, root, make, fused);
      check_pair<T>(got_naive, got_fused, sc, v, compare_to_naive);
      if (var == variant::mask) {
        for (std::size_t i = 1; i < n; i += 5) {
          CHECK(zero_row(got_naive, i));
          CHECK(zero_row(got_fused, i));
        }
      }
    }
  });
}

// Each kind and variant is a fused kernel of its own: too many to compile
// in every test file that checks a similarity, so they are compiled once,
// in four files that build in parallel (similarity_check_*.cpp).
extern template void check_similarity_of<float, true>(const similarity_case&);
extern template void check_similarity_of<float, false>(const similarity_case&);
extern template void check_similarity_of<double, true>(const similarity_case&);
extern template void check_similarity_of<double, false>(const similarity_case&);

template <class T>
void check_similarity(kind k, std::size_t n, std::size_t m, std::size_t d, std::size_t dv,
                      std::initializer_list<variant> vars, std::uint32_t seed, double range = 1,
                      bool compare_to_naive = true) {
  const similarity_case c{k, n, m, d, dv, vars, seed, range, compare_to_naive};
  if (builtin(k)) check_similarity_of<T, true>(c);
  else check_similarity_of<T, false>(c);
}

inline constexpr std::initializer_list<variant> all_variants = {variant::scaled, variant::unscaled,    variant::causal,
                                                         variant::mask,   variant::bias,        variant::bias_causal,
                                                         variant::window};
inline constexpr std::initializer_list<variant> some_variants = {variant::scaled, variant::bias_causal, variant::window};

// Sizes: n in {1, 3, 70, 130} (n ≤ 4 takes the compiled kernels' decoding
// path, the query block is 64 or so), m in {1, 300, 1100} (key blocks of up
// to 256, a tail), d in {8, 17, 64} (vector tails), dv ≠ dk.
inline auto extension_sizes() {
  return Catch::Generators::table<std::size_t, std::size_t, std::size_t, std::size_t>({
      {1, 1, 8, 8}, {1, 300, 17, 5}, {3, 1100, 64, 64}, {3, 1, 17, 3}, {70, 300, 8, 33}, {70, 1100, 17, 17},
      {70, 1, 64, 8}, {130, 300, 64, 40}, {130, 1100, 8, 8}, {130, 1, 17, 19}});
}

}  // namespace test::ext
