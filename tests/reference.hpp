// A high-precision reference for the tests, and the error bounds the library
// is held to. The reference computes in long double (at least the 53 bits of
// float64; 64 bits on x86-64), so its own error is negligible against a
// float result and small against a double one. Its matrices and the bounds'
// arithmetic take any number type (basic_mat<R>): a float result may be held
// to a reference in double, whose error is as negligible against it, at a
// tenth of the time where long double is a software quad (AArch64).
#pragma once

#include <qkv/qkv.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

namespace ref {

using real = long double;

template <class R>
struct basic_mat {
  std::size_t rows = 0, cols = 0;
  std::vector<R> v;
  basic_mat() = default;
  basic_mat(std::size_t r, std::size_t c) : rows(r), cols(c), v(r * c, 0) {}
  R& operator()(std::size_t i, std::size_t j) { return v[i * cols + j]; }
  R operator()(std::size_t i, std::size_t j) const { return v[i * cols + j]; }
};
using mat = basic_mat<real>;

// The reference's number type for a result computed in T: double for float
// and the 2-byte types (its rounding, 2⁻⁵³ relative, is some 2⁻²⁹ of their
// bounds' terms), long double for double. Where long double is a software
// quad (AArch64) double is ten times faster.
template <class T>
using real_for = std::conditional_t<(sizeof(T) < sizeof(double)), double, real>;
template <class T>
using mat_for = basic_mat<real_for<T>>;

// Anything with rows(), cols() and (i, j): a qkv matrix or view (or a
// basic_mat of another number type).
template <class R = real, class M>
basic_mat<R> from(const M& m) {
  const auto rows = [&] { if constexpr (requires { m.rows(); }) return m.rows(); else return m.rows; }();
  const auto cols = [&] { if constexpr (requires { m.cols(); }) return m.cols(); else return m.cols; }();
  basic_mat<R> r(rows, cols);
  for (std::size_t i = 0; i < r.rows; ++i)
    for (std::size_t j = 0; j < r.cols; ++j) r(i, j) = static_cast<R>(m(i, j));
  return r;
}

template <class R>
basic_mat<R> transpose(const basic_mat<R>& a) {
  basic_mat<R> r(a.cols, a.rows);
  for (std::size_t i = 0; i < a.rows; ++i)
    for (std::size_t j = 0; j < a.cols; ++j) r(j, i) = a(i, j);
  return r;
}

template <class R>
basic_mat<R> abs(const basic_mat<R>& a) {
  basic_mat<R> r = a;
  for (R& x : r.v) x = std::fabs(x);
  return r;
}

template <class R>
basic_mat<R> matmul(const basic_mat<R>& a, const basic_mat<R>& b) {
  basic_mat<R> r(a.rows, b.cols);
  for (std::size_t i = 0; i < a.rows; ++i)
    for (std::size_t p = 0; p < a.cols; ++p)
      for (std::size_t j = 0; j < b.cols; ++j) r(i, j) += a(i, p) * b(p, j);
  return r;
}

template <class R>
basic_mat<R> scale(basic_mat<R> a, std::type_identity_t<R> s) {
  for (R& x : a.v) x *= s;
  return a;
}

// Row softmax; a row with no finite entry becomes zeros.
template <class R>
basic_mat<R> softmax(const basic_mat<R>& s) {
  basic_mat<R> r(s.rows, s.cols);
  for (std::size_t i = 0; i < s.rows; ++i) {
    R mx = -std::numeric_limits<R>::infinity();
    for (std::size_t j = 0; j < s.cols; ++j) mx = std::fmax(mx, s(i, j));
    if (std::isinf(mx) && mx < 0) continue;
    R sum = 0;
    for (std::size_t j = 0; j < s.cols; ++j) sum += (r(i, j) = std::exp(s(i, j) - mx));
    for (std::size_t j = 0; j < s.cols; ++j) r(i, j) /= sum;
  }
  return r;
}

template <class R>
basic_mat<R> causal(basic_mat<R> s) {
  const auto n = static_cast<std::ptrdiff_t>(s.rows), m = static_cast<std::ptrdiff_t>(s.cols);
  for (std::ptrdiff_t i = 0; i < n; ++i)
    for (std::ptrdiff_t j = 0; j < m; ++j)
      if (j > i + (m - n)) s(std::size_t(i), std::size_t(j)) = -std::numeric_limits<R>::infinity();
  return s;
}

template <class R, class M>
basic_mat<R> masked(basic_mat<R> s, const M& keep) {
  for (std::size_t i = 0; i < s.rows; ++i)
    for (std::size_t j = 0; j < s.cols; ++j)
      if (!keep(i, j)) s(i, j) = -std::numeric_limits<R>::infinity();
  return s;
}

// Unit roundoff of T: half its machine epsilon.
template <class T>
constexpr real unit_roundoff = static_cast<real>(std::numeric_limits<T>::epsilon()) / 2;

// The smallest normal number of T.
template <class T>
constexpr real tiny = static_cast<real>(std::numeric_limits<T>::min());

// γ_k = k·u / (1 − k·u): the relative error bound of a k-term sum or dot
// product in precision T, whatever the order of summation (Higham, §3.1).
template <class T>
real gamma(std::size_t k) {
  const real ku = static_cast<real>(k) * unit_roundoff<T>;
  return ku / (1 - ku);
}

// Bound on |fl(A·B) − A·B| elementwise: γ_k · (|A|·|B|).
template <class T, class R>
basic_mat<R> gemm_bound(const basic_mat<R>& a, const basic_mat<R>& b) {
  return scale(matmul(abs(a), abs(b)), static_cast<R>(gamma<T>(a.cols)));
}

// Bound on |fl(softmax(S)) − softmax(S)| elementwise, S exact in T. Per
// element: the subtraction of the row maximum rounds by u·|s − max|; exp is
// within 2 ulp (xsimd's is 1.5), i.e. 4u; the m-term sum γ_m; the division u.
// Weights below the smallest normal number of T may flush to zero (xsimd's
// exp does, below e^−88 in float): an absolute term of that size covers them.
template <class T, class R>
basic_mat<R> softmax_bound(const basic_mat<R>& s, const basic_mat<R>& p) {
  const R u = unit_roundoff<T>, g = gamma<T>(s.cols), small = tiny<T>;
  basic_mat<R> r(s.rows, s.cols);
  for (std::size_t i = 0; i < s.rows; ++i) {
    R mx = -std::numeric_limits<R>::infinity();
    for (std::size_t j = 0; j < s.cols; ++j) mx = std::fmax(mx, s(i, j));
    for (std::size_t j = 0; j < s.cols; ++j) {
      r(i, j) = p(i, j) * (u * std::fabs(s(i, j) - mx) + 5 * u + g) + small;
    }
  }
  return r;
}

// Bound on the error of softmax(S) V computed in T, from the exact scores S,
// the exact weights P and a bound e_ij on the absolute error of each score as
// the library computes it (whatever similarity, scaling, bias or modifier
// produced it). The fused kernel's online rescaling adds a few u per key
// block, far below γ_m. A weight p_ij = exp(s_ij)/Σ_k exp(s_ik) moves by the
// relative amount |e_ij| + max_k |e_ik| ≤ 2·max_k e_ik, on top of the
// softmax's own rounding (softmax_bound). The product with V adds γ_m. To
// first order:
//   |ΔO_il| ≤ Σ_j p_ij (2·max_k e_ik + u|s_ij − max_k s_ik| + 5u + 2γ_m) |V_jl|.
// (plus tiny·|V_jl| per weight, for weights that flush to zero). The tests
// allow twice this, for second-order terms. A constant added to a whole row
// of scores changes neither the weights nor this bound, so e_ij may bound the
// error against S plus such a constant (what a kernel that leaves it out computes).
template <class T, class R>
basic_mat<R> attention_bound_from_scores(const basic_mat<R>& score_error, const basic_mat<R>& v,
                                         const basic_mat<R>& scores, const basic_mat<R>& p) {
  const R u = unit_roundoff<T>, g = gamma<T>(scores.cols), small = tiny<T>;
  basic_mat<R> r(scores.rows, v.cols);
  for (std::size_t i = 0; i < scores.rows; ++i) {
    R emax = 0, smax = -std::numeric_limits<R>::infinity();
    for (std::size_t j = 0; j < scores.cols; ++j) {
      if (p(i, j) == 0) continue;
      emax = std::fmax(emax, score_error(i, j));
      smax = std::fmax(smax, scores(i, j));
    }
    for (std::size_t j = 0; j < scores.cols; ++j) {
      if (p(i, j) == 0) continue;
      const R rel = 2 * emax + u * std::fabs(scores(i, j) - smax) + 5 * u + 2 * g;
      for (std::size_t l = 0; l < v.cols; ++l) r(i, l) += (p(i, j) * rel + small) * std::fabs(v(j, l));
    }
  }
  return scale(r, 2);
}

// The bound for softmax(scale · Q Kᵀ [+ B] [masked]) V: the score s_ij
// carries an absolute error e_ij ≤ γ_dk (|Q||K|ᵀ)_ij·scale + 3u|s_ij| (the
// product; then the rounding of the scale, of its reciprocal where the
// kernel multiplies by it, and of the scaling itself, the bias riding in the
// same fused multiply-add).
template <class T, class R>
basic_mat<R> attention_bound(const basic_mat<R>& q, const basic_mat<R>& k, const basic_mat<R>& v,
                             std::type_identity_t<R> scale_factor, const basic_mat<R>& scores, const basic_mat<R>& p) {
  const R u = unit_roundoff<T>, g = gamma<T>(q.cols);
  const basic_mat<R> qk_abs = scale(matmul(abs(q), transpose(abs(k))), scale_factor);
  basic_mat<R> e(q.rows, k.rows);
  for (std::size_t i = 0; i < q.rows; ++i)
    for (std::size_t j = 0; j < k.rows; ++j) {
      if (p(i, j) == 0) continue;  // masked: its error does not matter (and |s_ij| is infinite)
      e(i, j) = g * qk_abs(i, j) + 3 * u * std::fabs(scores(i, j));
    }
  return attention_bound_from_scores<T>(e, v, scores, p);
}

// The bound for the same attention computed on bf16 pairs (AVX512-BF16's
// products; kernels/attention_prefill_bf16.hpp), Q, K and V holding bf16
// values. Both products are float sums of exact products (two bf16 values
// multiply exactly in float), as in float; what differs:
//  - each weight is rounded to bf16 before its product with V, the row sum
//    left unrounded: p̃ = p(1 + δ), |δ| ≤ 2⁻⁸, which moves O_il by at most
//    Σ_j p_ij·2⁻⁸·|V_jl|. attention_bound_from_scores counts a score error
//    twice (in the weight and in the row sum), so 2⁻⁹ more per score covers it;
//  - the weights come from an exponential of relative error below 2⁻¹³
//    (softmax_exp.hpp's degree 3): e^s(1 + ε) = e^(s + ε'), |ε'| < 2⁻¹³,
//    which is 2⁻¹³ more per score;
//  - the instruction flushes subnormal inputs, products and sums to zero:
//    up to dk·tiny·scale more per score, and tiny per weight (already there).
inline mat attention_bound_bf16_pairs(const mat& q, const mat& k, const mat& v, real scale_factor, const mat& scores,
                                      const mat& p) {
  const real u = unit_roundoff<float>, rounding = std::ldexp(real(1), -9) + std::ldexp(real(1), -13);
  const mat qk_abs = scale(matmul(abs(q), transpose(abs(k))), scale_factor);
  mat e(q.rows, k.rows);
  for (std::size_t i = 0; i < q.rows; ++i)
    for (std::size_t j = 0; j < k.rows; ++j) {
      if (p(i, j) == 0) continue;
      e(i, j) = gamma<float>(q.cols) * qk_abs(i, j) + 3 * u * std::fabs(scores(i, j)) + rounding +
                static_cast<real>(q.cols) * tiny<float> * scale_factor;
    }
  return attention_bound_from_scores<float>(e, v, scores, p);
}

// Uniform values in [lo, hi], the same on every platform (std's
// distributions are not).
class rng {
 public:
  explicit rng(std::uint32_t seed) : gen_(seed) {}
  double uniform(double lo, double hi) { return lo + (hi - lo) * (static_cast<double>(gen_()) / 4294967295.0); }
  bool coin(double p_true) { return uniform(0, 1) < p_true; }

  template <class M>
  void fill(M& m, double lo = -1, double hi = 1) {
    for (std::size_t i = 0; i < m.rows(); ++i)
      for (std::size_t j = 0; j < m.cols(); ++j) m(i, j) = static_cast<typename M::value_type>(uniform(lo, hi));
  }

 private:
  std::mt19937 gen_;
};

template <class R>
R max_abs(const basic_mat<R>& a) {
  R r = 0;
  for (R x : a.v) r = std::fmax(r, std::fabs(x));
  return r;
}

template <class M, class R>
R max_error(const M& got, const basic_mat<R>& want) {
  R r = 0;
  for (std::size_t i = 0; i < want.rows; ++i)
    for (std::size_t j = 0; j < want.cols; ++j) {
      const R e = std::fabs(static_cast<R>(got(i, j)) - want(i, j));
      if (std::isnan(e)) return std::numeric_limits<R>::infinity();
      r = std::fmax(r, e);
    }
  return r;
}

// Largest |got − want| / bound over the elements (0 where both are 0);
// a result within its bound scores at most 1.
template <class M, class R>
R worst_ratio(const M& got, const basic_mat<R>& want, const basic_mat<R>& bound) {
  R worst = 0;
  for (std::size_t i = 0; i < want.rows; ++i)
    for (std::size_t j = 0; j < want.cols; ++j) {
      const R err = std::fabs(static_cast<R>(got(i, j)) - want(i, j));
      if (std::isnan(err)) return std::numeric_limits<R>::infinity();
      if (err == 0) continue;
      worst = std::fmax(worst, bound(i, j) > 0 ? err / bound(i, j) : std::numeric_limits<R>::infinity());
    }
  return worst;
}

}  // namespace ref
