// The attention forms a sequence split into parts must keep (tests/part_test.cpp
// in one process, tests/mpi_test.cpp across processes), each built from
// views of Q, K and V, and the check of a split result.
//
// The tolerance: the reference is the same form over the whole sequence in
// long double (long_double_form; in double for tensors). The whole in float
// has error w (measured); a result merged from P parts adds, per merge, a
// weight exp(L_part − max) whose argument carries an absolute error of about
// |L|·ε (L the rows' log-sum-exp, at most log m + max |score|), so each output
// moves by at most (|L|max + 4)·ε·max|V| per merge. A merged result must lie
// within w + (P·(|L|max + 4) + 8)·ε·max|V|.
#pragma once

#include <qkv/qkv.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace test::parts {

using qkv::dyn;

// The forms, by number: what each does with positions.
inline constexpr int form_count = 9;
inline const char* form_name(int f) {
  static const char* names[] = {"plain", "causal", "window", "causal window", "key_aligned ALiBi",
                                "position predicate", "sink", "neg_sq_l2 causal",
                                "positions, a window and key_aligned ALiBi"};
  return names[f];
}

template <class T>
struct alibi {
  T slope;
  template <class V>
  V operator()(const V& s, const V& i, const V& j) const {
    return s - V(slope) * (i - j);
  }
};
// Keeps key j for query i when both are even or j is within 5 before i
// (indices of the whole sequence: a split that passed local ones differs).
struct parity_near {
  bool operator()(std::size_t i, std::size_t j) const { return j <= i && ((i % 2 == 0 && j % 2 == 0) || i - j < 5); }
};

// Form f over q, k and v (matrix or tensor views), computed by eval(e) or by
// a split: `run` is called with the expression.
template <class Q, class K, class V, class Run>
auto with_form(int f, const Q& q, const K& k, const V& v, Run&& run) {
  using T = qkv::compute_t<std::remove_const_t<qkv::value_type_t<Q>>>;  // float for 2-byte inputs
  const T c = T(1) / std::sqrt(T(q.cols()));
  switch (f) {
    case 0: return run(softmax(q * transpose(k) * c) * v);
    case 1: return run(softmax(causal(q * transpose(k) * c)) * v);
    case 2: return run(softmax(window(q * transpose(k) * c, 9, 4)) * v);
    case 3: return run(softmax(window(causal(q * transpose(k) * c), 13)) * v);
    case 4: return run(softmax(causal(score_mod(q * transpose(k) * c, qkv::key_aligned(alibi<T>{T(0.25)})))) * v);
    case 5: return run(softmax(masked(q * transpose(k) * c, parity_near{})) * v);
    case 6: return run(softmax(causal(q * transpose(k) * c), T(1.5)) * v);
    case 7: return run(softmax(causal(similarity(q, k, qkv::neg_sq_l2) * c)) * v);
    // Row i at 3 + i, key j at 7 + j (positions of the whole, written outside the modifier).
    default:
      return run(softmax(window(positions(score_mod(q * transpose(k) * c, qkv::key_aligned(alibi<T>{T(0.25)})), 3, 7), 6, 2)) * v);
  }
}

// Form f over the whole sequence (t queries and t keys, one batch index) in
// long double, written out from with_form's definitions: the reference the
// split results are checked against. Row i is at key position i (n = m).
// The scale 1/√d is exact for the d the tests use (powers of 4).
inline std::vector<double> long_double_form(int f, const std::vector<double>& q, const std::vector<double>& k,
                                            const std::vector<double>& v, std::size_t t, std::size_t d,
                                            std::size_t dv) {
  using real = long double;
  const real c = 1 / std::sqrt(static_cast<real>(d)), none = -std::numeric_limits<real>::infinity();
  const real sink = f == 6 ? real(1.5) : none;
  std::vector<double> o(t * dv, 0.0);
  std::vector<real> s(t);
  for (std::size_t i = 0; i < t; ++i) {
    real top = sink;
    for (std::size_t j = 0; j < t; ++j) {
      real x = 0;
      for (std::size_t a = 0; a < d; ++a) {
        const real qa = q[i * d + a], ka = k[j * d + a];
        x += f == 7 ? -(qa - ka) * (qa - ka) : qa * ka;
      }
      x *= c;
      if (f == 4) x -= real(0.25) * (real(i) - real(j));
      if (f == 8) x -= real(0.25) * (real(3 + i) - real(7 + j));
      const auto ii = static_cast<std::ptrdiff_t>(i), jj = static_cast<std::ptrdiff_t>(j);
      bool keep = true;
      if (f == 1 || f == 3 || f == 4 || f == 6 || f == 7) keep = jj <= ii;
      if (f == 2) keep = jj >= ii - 9 && jj <= ii + 4;
      if (f == 3) keep = keep && jj >= ii - 13;
      if (f == 5) keep = parity_near{}(i, j);
      if (f == 8) keep = jj + 7 >= ii + 3 - 6 && jj + 7 <= ii + 3 + 2;
      s[j] = keep ? x : none;
      if (s[j] > top) top = s[j];
    }
    if (top == none) continue;  // a row that sees nothing: zeros
    real sum = sink == none ? 0 : std::exp(sink - top);  // the sink: one more logit, value 0
    for (std::size_t j = 0; j < t; ++j) sum += s[j] = s[j] == none ? 0 : std::exp(s[j] - top);
    for (std::size_t col = 0; col < dv; ++col) {
      real y = 0;
      for (std::size_t j = 0; j < t; ++j) y += s[j] * v[j * dv + col];
      o[i * dv + col] = static_cast<double>(y / sum);
    }
  }
  return o;
}

struct rng {
  std::mt19937 g;
  explicit rng(std::uint32_t seed) : g(seed) {}
  double operator()() { return std::uniform_real_distribution<double>(-1, 1)(g); }
};

// Row-major [batches, rows, cols] values in double and their float copies.
struct data {
  std::size_t batches, rows, cols;
  std::vector<double> d;
  std::vector<float> f;
  data(std::size_t b, std::size_t r, std::size_t c, rng& g) : batches(b), rows(r), cols(c), d(b * r * c), f(b * r * c) {
    for (std::size_t x = 0; x < d.size(); ++x) f[x] = static_cast<float>(d[x] = 2 * g());
    for (std::size_t x = 0; x < d.size(); ++x) d[x] = f[x];  // the same values in both
  }
};

// Rows [r0, r0 + count) of x as a matrix (one batch) or as a [b0, b1, count, cols] tensor view.
template <class T>
qkv::matrix_view<const T, dyn, dyn> rows_matrix(const std::vector<T>& x, std::size_t cols, std::size_t r0,
                                               std::size_t count) {
  return {x.data() + r0 * cols, count, cols, cols};
}
template <class T>
qkv::tensor_view<const T, dyn, dyn, dyn, dyn> rows_tensor(const std::vector<T>& x, std::size_t b0, std::size_t b1,
                                                          std::size_t rows, std::size_t cols, std::size_t r0,
                                                          std::size_t count) {
  return {x.data() + r0 * cols, {b0, b1, count, cols}, {b1 * rows * cols, rows * cols, cols, 1}};
}

// The largest |a − b| over matching elements.
template <class A, class B>
double max_diff(const A& a, const B& b, std::size_t n) {
  double e = 0;
  for (std::size_t x = 0; x < n; ++x) e = std::fmax(e, std::fabs(static_cast<double>(a[x]) - static_cast<double>(b[x])));
  return e;
}

// The bound above, for P parts, scores of at most `max_score` in magnitude
// over m keys, values of at most max_v, the whole's float error w.
inline double split_bound(double w, std::size_t parts, double max_score, std::size_t m, double max_v) {
  const double eps = std::numeric_limits<float>::epsilon();
  const double lmax = std::log(static_cast<double>(m) + 1) + max_score;
  return w + (static_cast<double>(parts) * (lmax + 4) + 8) * eps * max_v;
}

}  // namespace test::parts
