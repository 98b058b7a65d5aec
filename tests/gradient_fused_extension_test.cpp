// The fused backward with an extension (kernels/attention_backward_with.hpp):
// a score_mod and similarity terms of the user's (and additive's),
// differentiated with dual numbers inside the kernel, neg_sq_l2 with its
// norms, and predicates, which skip tiles as in the forward. Against the node-by-node
// backward in double (which tests/gradient_extension_test.cpp holds to
// central differences): the fused float error within a small factor of the
// node-by-node float error; fused and node by node in double alike to
// double's rounding; the same bits on 1, 2 and 3 threads; hidden NaN keys
// that reach nothing; vjp keeping the forward.
#include "reference.hpp"
#include "support.hpp"

#include <catch2/catch.hpp>

#include <qkv/kernels/attention_backward_with.hpp>
#include <qkv/qkv.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

using namespace qkv;

namespace {

template <class T>
using mat = matrix<T, dyn, dyn>;

template <class T>
mat<double> widened(const mat<T>& a) {
  mat<double> r(a.rows(), a.cols());
  for (std::size_t i = 0; i < a.rows(); ++i)
    for (std::size_t j = 0; j < a.cols(); ++j) r(i, j) = a(i, j);
  return r;
}

// The largest |a − ref| and |ref|.
template <class T>
std::pair<double, double> gap(const mat<T>& a, const mat<double>& ref) {
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < a.rows(); ++i)
    for (std::size_t j = 0; j < a.cols(); ++j)
      worst = std::fmax(worst, std::fabs(double(a(i, j)) - ref(i, j))), scale = std::fmax(scale, std::fabs(ref(i, j)));
  return {worst, scale};
}

// A window of w keys up to the query's own position, with its block hint.
struct window_pred {
  std::size_t w;
  bool operator()(std::size_t i, std::size_t j) const { return j <= i && i - j < w; }
  bool any(std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) const { return j0 < i1 && j1 + w > i0 + 1; }
};

// Row 2 sees nothing; key 3 is hidden from every row.
struct holes_pred {
  bool operator()(std::size_t i, std::size_t j) const { return i != 2 && j != 3 && (i + 2 * j) % 7 != 0; }
};

const auto cap = [](auto s, auto, auto) { using std::tanh; return 3 * tanh(s / 3); };
const auto neg_l1 = [](auto q, auto k) { return -xsimd::abs(q - k); };
const auto weighted = [](auto q, auto k, std::size_t c) { using std::tanh; return decltype(q)(1 + 0.25 * double(c % 4)) * tanh(q) * k; };
const auto alibi = [](auto s, auto i, auto j) { return s - decltype(s)(0.125) * xsimd::abs(i - j); };

struct best_t {};  // gradient without a strategy named

// Fixed weights for additive(Wq, Wk, w).
template <class T>
mat<T> weights(std::size_t r, std::size_t c, std::uint32_t seed) {
  mat<T> w(r, c);
  ref::rng(seed).fill(w, -1, 1);
  return w;
}

// The four forms, as gradient(e, dO, wrt(Q, K, V), how) for T.
template <class T, class How>
auto grads(int form, const mat<T>& Q, const mat<T>& K, const mat<T>& V, const mat<T>& B, const mat<T>& dO, How how) {
  const T c = T(1) / std::sqrt(T(Q.cols()));
  const auto of = [&](const auto& e) {
    if constexpr (std::is_same_v<How, best_t>) return gradient(e, dO, wrt(Q, K, V));
    else return gradient(e, dO, wrt(Q, K, V), how);
  };
  switch (form) {
    case 0: return of(softmax(causal(score_mod(Q * transpose(K) * c, cap))) * V);
    case 1: return of(softmax(masked(score_mod(Q * transpose(K) * c, alibi), window_pred{9})) * V);
    case 2: return of(softmax(masked(Q * transpose(K) * c, holes_pred{})) * V);
    case 3: return of(softmax(causal(score_mod(Q * transpose(K) * c + B, cap))) * V);
    case 4: return of(softmax(causal(similarity(Q, K, neg_l1))) * V);
    case 5: return of(softmax(masked(score_mod(similarity(Q, K, weighted) * c, cap), window_pred{9})) * V);
    case 6: return of(softmax(causal(similarity(Q, K, neg_sq_l2) * c)) * V);
    case 7: return of(softmax(causal(score_mod(similarity(Q, K, neg_sq_l2) * c, cap))) * V);
    default: {
      const mat<T> Wq = weights<T>(Q.cols(), 5, 1), Wk = weights<T>(K.cols(), 5, 2), w = weights<T>(1, 5, 3);
      return of(softmax(masked(similarity(Q, K, additive(Wq, Wk, w)), holes_pred{})) * V);
    }
  }
}

const char* form_name(int form) {
  switch (form) {
    case 0: return "soft cap, causal";
    case 1: return "ALiBi, a window predicate with its hint";
    case 2: return "a predicate with an empty row and a hidden key";
    case 3: return "soft cap around a bias, causal";
    case 4: return "a user term, -|q - k|, causal";
    case 5: return "a user term with its component index, soft-capped, a window predicate";
    case 6: return "neg_sq_l2, causal (the keys' norms)";
    case 7: return "neg_sq_l2 soft-capped, causal (the queries' norms too)";
    default: return "additive, a predicate";
  }
}

}  // namespace

TEST_CASE("fused backward with a score_mod or a predicate: float error within a small factor of node by node's",
          "[gradient][score_mod]") {
  // Both compute the same quantities in float; the fused one recomputes the
  // weights from the forward's row maximum and sum, which doubles the
  // score errors' share (tests/gradient_reference.hpp), and sums in other
  // orders: 4× the node-by-node error covers it, and 16u of the largest
  // gradient where the node-by-node error happens to be near zero.
  const double u = std::ldexp(1.0, -24);
  const auto [n, m, dk, dv] = GENERATE(table<std::size_t, std::size_t, std::size_t, std::size_t>(
      {{1, 1, 1, 1}, {7, 13, 5, 3}, {33, 70, 17, 9}, {70, 33, 64, 40}, {67, 130, 33, 17}, {140, 65, 16, 64}}));
  ref::rng rng(static_cast<std::uint32_t>(n * 7 + m));
  mat<float> Q(n, dk), K(m, dk), V(m, dv), dO(n, dv), B(n, m);
  rng.fill(Q, -2, 2), rng.fill(K, -2, 2), rng.fill(V), rng.fill(dO), rng.fill(B, -2, 2);
  const mat<double> Qd = widened(Q), Kd = widened(K), Vd = widened(V), dOd = widened(dO), Bd = widened(B);
  for (int form = 0; form < 9; ++form) {
    INFO("n = " << n << ", m = " << m << ", dk = " << dk << ", dv = " << dv << ", " << form_name(form));
    const auto [fQ, fK, fV] = grads<float>(form, Q, K, V, B, dO, qkv::fused);
    const auto [nQ, nK, nV] = grads<float>(form, Q, K, V, B, dO, naive);
    const auto [rQ, rK, rV] = grads<double>(form, Qd, Kd, Vd, Bd, dOd, naive);
    for (const auto& [f, nv, r] : {std::tie(fQ, nQ, rQ), std::tie(fK, nK, rK), std::tie(fV, nV, rV)}) {
      const auto [fused_err, scale] = gap(f, r);
      const auto [naive_err, unused] = gap(nv, r);
      CHECK(fused_err <= 4 * naive_err + 16 * u * scale);
    }
    // The best strategy is the fused backward.
    const auto [bQ, bK, bV] = grads<float>(form, Q, K, V, B, dO, best_t{});
    CHECK(test::same_bits(bQ, fQ));
    CHECK(test::same_bits(bK, fK));
    CHECK(test::same_bits(bV, fV));
  }
}

TEST_CASE("fused backward with a score_mod or a predicate, in double: node by node's to double's rounding",
          "[gradient][score_mod]") {
  const std::size_t n = 45, m = 77, dk = 12, dv = 7;
  ref::rng rng(4);
  mat<double> Q(n, dk), K(m, dk), V(m, dv), dO(n, dv), B(n, m);
  rng.fill(Q, -2, 2), rng.fill(K, -2, 2), rng.fill(V), rng.fill(dO), rng.fill(B, -2, 2);
  for (int form = 0; form < 9; ++form) {
    INFO(form_name(form));
    const auto [fQ, fK, fV] = grads<double>(form, Q, K, V, B, dO, qkv::fused);
    const auto [nQ, nK, nV] = grads<double>(form, Q, K, V, B, dO, naive);
    // Gradients of order 1 from sums of at most 77 terms of order 1.
    CHECK(gap(fQ, nQ).first < 1e-12);
    CHECK(gap(fK, nK).first < 1e-12);
    CHECK(gap(fV, nV).first < 1e-12);
  }
}

TEST_CASE("fused backward with a predicate: a hidden key of NaN reaches nothing, an empty row passes back zeros",
          "[gradient][score_mod]") {
  const std::size_t n = 20, m = 30, d = 8;
  ref::rng rng(6);
  mat<float> Q(n, d), K(m, d), V(m, d), dO(n, d), B(n, m);
  rng.fill(Q), rng.fill(K), rng.fill(V), rng.fill(dO);
  for (std::size_t c = 0; c < d; ++c) K(3, c) = V(3, c) = std::numeric_limits<float>::quiet_NaN();
  const auto [dQ, dK, dV] = grads<float>(2, Q, K, V, B, dO, qkv::fused);
  bool finite = true;
  for (std::size_t x = 0; x < n * d; ++x) finite = finite && std::isfinite(dQ.data()[x]);
  for (std::size_t x = 0; x < m * d; ++x) finite = finite && std::isfinite(dK.data()[x]) && std::isfinite(dV.data()[x]);
  CHECK(finite);
  for (std::size_t c = 0; c < d; ++c) {
    CHECK(dQ(2, c) == 0.0f);  // row 2 sees nothing
    CHECK(dK(3, c) == 0.0f);  // key 3 is seen by none
    CHECK(dV(3, c) == 0.0f);
  }
}

TEST_CASE("fused backward with a score_mod: the same bits on 1, 2 and 3 threads", "[gradient][score_mod][threads]") {
  test::threads_guard guard;
  const std::size_t n = 200, m = 4000, d = 64;
  // Enough keys for two key groups: the threads split the work in two passes.
  using kernel = kernels::backward_with_functors<float, detail::fused_extension_t<decltype(softmax(causal(score_mod(
                                                     std::declval<mat<float>&>() * transpose(std::declval<mat<float>&>()), cap))) *
                                                 std::declval<mat<float>&>())>>::kernel;
  REQUIRE(kernel::key_groups(m, d, d) >= 2);
  ref::rng rng(9);
  mat<float> Q(n, d), K(m, d), V(m, d), dO(n, d);
  rng.fill(Q, -2, 2), rng.fill(K, -2, 2), rng.fill(V), rng.fill(dO);
  const auto e = softmax(causal(score_mod(Q * transpose(K), cap))) * V;
  set_threads(1);
  const auto [dQ, dK, dV] = gradient(e, dO, wrt(Q, K, V), qkv::fused);
  for (const std::size_t t : {2, 3}) {
    set_threads(t);
    const auto [dQt, dKt, dVt] = gradient(e, dO, wrt(Q, K, V), qkv::fused);
    INFO(t << " threads");
    CHECK(test::same_bits(dQt, dQ));
    CHECK(test::same_bits(dKt, dK));
    CHECK(test::same_bits(dVt, dV));
  }
}

TEST_CASE("vjp of an attention with a score_mod keeps its forward: the pullback's bits are gradient's",
          "[gradient][score_mod]") {
  const std::size_t n = 50, m = 61, d = 16;
  ref::rng rng(13);
  mat<float> Q(n, d), K(m, d), V(m, d), dO(n, d);
  rng.fill(Q), rng.fill(K), rng.fill(V), rng.fill(dO);
  const auto e = softmax(masked(score_mod(Q * transpose(K) / 4.0f, alibi), window_pred{20})) * V;
  const auto [O, back] = vjp(e);
  CHECK(test::same_bits(O, eval(e)));
  const auto [dQ, dK, dV] = gradient(e, dO, wrt(Q, K, V));
  const auto [dQ2, dK2, dV2] = back(dO, wrt(Q, K, V));
  CHECK(test::same_bits(dQ2, dQ));
  CHECK(test::same_bits(dK2, dK));
  CHECK(test::same_bits(dV2, dV));
}

TEST_CASE("fused backward with a score_mod on grouped-query tensors: each head's matrix gradients, summed in head order",
          "[gradient][score_mod][tensor]") {
  const std::size_t H = 4, n = 37, m = 45, d = 16;
  ref::rng rng(17);
  tensor<float, dyn, dyn, dyn> Q(H, n, d), K(2, m, d), V(2, m, d), dO(H, n, d);
  test::fill(Q, rng, -2, 2), test::fill(K, rng, -2, 2), test::fill(V, rng), test::fill(dO, rng);
  const auto [dQ, dK, dV] =
      gradient(softmax(causal(score_mod(Q * transpose(K) / 4.0f, cap))) * V, dO, wrt(Q, K, V), qkv::fused);
  mat<float> sK(m, d), sV(m, d);
  for (std::size_t h = 0; h < H; ++h) {
    const auto q = Q.matrix_at(h), k = K.matrix_at(h / 2), v = V.matrix_at(h / 2), o = dO.matrix_at(h);
    const auto [gq, gk, gv] = gradient(softmax(causal(score_mod(q * transpose(k) / 4.0f, cap))) * v, o, wrt(q, k, v), qkv::fused);
    INFO("head " << h);
    CHECK(test::same_bits(gq, dQ.matrix_at(h)));
    if (h % 2 == 0) sK = mat<float>(m, d), sV = mat<float>(m, d);
    for (std::size_t j = 0; j < m; ++j)
      for (std::size_t c = 0; c < d; ++c) sK(j, c) += gk(j, c), sV(j, c) += gv(j, c);
    if (h % 2 == 1) {
      CHECK(test::same_bits(sK, dK.matrix_at(h / 2)));
      CHECK(test::same_bits(sV, dV.matrix_at(h / 2)));
    }
  }
}

namespace {

template <class T>
mat<T> transposed(const mat<T>& a) {
  mat<T> r(a.cols(), a.rows());
  for (std::size_t i = 0; i < a.rows(); ++i)
    for (std::size_t j = 0; j < a.cols(); ++j) r(j, i) = a(i, j);
  return r;
}

// additive(Wq, Wk, w) with every weight among the targets, causal or under a
// predicate with an empty row, w a row or a column.
template <class T, class How>
auto additive_grads(bool causal_form, bool w_row, const mat<T>& Q, const mat<T>& K, const mat<T>& V, const mat<T>& Wq,
                    const mat<T>& Wk, const mat<T>& w, const mat<T>& dO, How how) {
  const mat<T> wc = w_row ? w : transposed(w);
  const auto go = [&](const auto& e) { return gradient(e, dO, wrt(Q, K, V, Wq, Wk, wc), how); };
  auto r = causal_form ? go(softmax(causal(similarity(Q, K, additive(Wq, Wk, wc)))) * V)
                       : go(softmax(masked(similarity(Q, K, additive(Wq, Wk, wc)), holes_pred{})) * V);
  if (!w_row) std::get<5>(r) = transposed(std::get<5>(r));
  return r;
}

// A bound on the error of dw_c = Σ_ij x_ij, x_ij = dS_ij t_ij, t_ij =
// tanh(a_ic + b_jc), computed in a precision of unit roundoff u by either
// strategy, from the exact (double) quantities. The sum cancels (each row
// of dS sums to 0), so the bound is in the terms, not in |dw|:
//   - the sum of n·m terms: γ_nm Σ|x_ij|;
//   - dS = P ∘ (dP − D): dP_ij and D_i are products of dv terms,
//     γ_dv (Σ_l |dO_il||V_jl| + Σ_l |dO_il||O_il|) each, times P_ij;
//   - P moves by 2e + 5u + 2γ_m relatively, e ≤ (γ_da + 2u) Σ_c |w_c| the
//     scores' error (attention_bound_from_scores), times |dP_ij − D_i|.
// Each times |t_ij|, summed; the tests allow twice this (second order).
std::vector<double> dw_bound(bool causal_form, const mat<double>& Q, const mat<double>& K, const mat<double>& V,
                             const mat<double>& Wq, const mat<double>& Wk, const mat<double>& w, const mat<double>& dO,
                             double u) {
  const std::size_t n = Q.rows(), m = K.rows(), dv = V.cols(), da = w.cols();
  const auto gamma = [u](double k) { return k * u / (1 - k * u); };
  const mat<double> P = causal_form ? eval(softmax(causal(similarity(Q, K, additive(Wq, Wk, w)))), naive)
                                    : eval(softmax(masked(similarity(Q, K, additive(Wq, Wk, w)), holes_pred{})), naive);
  const mat<double> O = eval(P * V, naive), A = eval(Q * Wq, naive), B = eval(K * Wk, naive);
  double wsum = 0;
  for (std::size_t c = 0; c < da; ++c) wsum += std::fabs(w(0, c));
  const double e = (gamma(double(da)) + 2 * u) * wsum, rel = 2 * e + 5 * u + 2 * gamma(double(m));
  std::vector<double> bound(da, 0.0), terms(da, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    double d = 0, od = 0;
    for (std::size_t l = 0; l < dv; ++l) d += dO(i, l) * O(i, l), od += std::fabs(dO(i, l) * O(i, l));
    for (std::size_t j = 0; j < m; ++j) {
      if (P(i, j) == 0) continue;
      double dp = 0, vd = 0;
      for (std::size_t l = 0; l < dv; ++l) dp += dO(i, l) * V(j, l), vd += std::fabs(dO(i, l) * V(j, l));
      const double ds_err = P(i, j) * (gamma(double(dv)) * (vd + od) + rel * std::fabs(dp - d));
      for (std::size_t c = 0; c < da; ++c) {
        const double t = std::fabs(std::tanh(A(i, c) + B(j, c)));
        bound[c] += ds_err * t, terms[c] += std::fabs(P(i, j) * (dp - d)) * t;
      }
    }
  }
  for (std::size_t c = 0; c < da; ++c) bound[c] = 2 * (bound[c] + gamma(double(n * m)) * terms[c]);
  return bound;
}

// Whether a (a row of da) is within bound of ref elementwise.
template <class T>
bool within(const mat<T>& a, const mat<double>& ref, const std::vector<double>& bound) {
  for (std::size_t c = 0; c < bound.size(); ++c)
    if (!(std::fabs(double(a(0, c)) - ref(0, c)) <= bound[c])) return false;
  return true;
}

}  // namespace

TEST_CASE("fused backward of additive with w among the targets: dw summed in the kernel within its bound, the rest "
          "within a small factor of node by node's error",
          "[gradient][similarity]") {
  // Q, K, V, Wq and Wk as for the forms above: 4× the node-by-node error,
  // and 16u of the largest gradient. dw_c is one sum of n·m terms that
  // cancel, whose two strategies' errors are single draws, too unsteady for
  // a ratio: it is held to dw_bound (both strategies are), in float and,
  // with u = 2⁻⁵³, in double, where a term counted wrongly shows at once.
  const double u = std::ldexp(1.0, -24);
  const auto [n, m, dk, dv] = GENERATE(table<std::size_t, std::size_t, std::size_t, std::size_t>(
      {{1, 1, 1, 1}, {7, 13, 5, 3}, {33, 70, 17, 9}, {70, 33, 64, 40}, {140, 65, 16, 64}}));
  const std::size_t da = 1 + (n + dk) % 13;  // the projection width: 1 to 13, across the vector width
  ref::rng rng(static_cast<std::uint32_t>(n * 5 + m));
  mat<float> Q(n, dk), K(m, dk), V(m, dv), dO(n, dv), Wq(dk, da), Wk(dk, da), w(1, da);
  rng.fill(Q, -2, 2), rng.fill(K, -2, 2), rng.fill(V), rng.fill(dO), rng.fill(Wq), rng.fill(Wk), rng.fill(w);
  for (const bool causal_form : {true, false})
    for (const bool w_row : {true, false}) {
      INFO("n = " << n << ", m = " << m << ", dk = " << dk << ", dv = " << dv << ", da = " << da
                  << (causal_form ? ", causal" : ", a predicate") << (w_row ? ", w a row" : ", w a column"));
      const auto f = additive_grads<float>(causal_form, w_row, Q, K, V, Wq, Wk, w, dO, qkv::fused);
      const auto nv = additive_grads<float>(causal_form, w_row, Q, K, V, Wq, Wk, w, dO, naive);
      const auto r = additive_grads<double>(causal_form, w_row, widened(Q), widened(K), widened(V), widened(Wq),
                                            widened(Wk), widened(w), widened(dO), naive);
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        const auto check = [&](const char* what, const auto& fi, const auto& ni, const auto& ri) {
          INFO("the gradient of " << what);
          const auto [fused_err, scale] = gap(fi, ri);
          CHECK(fused_err <= 4 * gap(ni, ri).first + 16 * u * scale);
        };
        const char* names[] = {"Q", "K", "V", "Wq", "Wk"};
        (check(names[I], std::get<I>(f), std::get<I>(nv), std::get<I>(r)), ...);
      }(std::make_index_sequence<5>{});
      const mat<double> Qd = widened(Q), Kd = widened(K), Vd = widened(V), Wqd = widened(Wq), Wkd = widened(Wk),
                        wd = widened(w), dOd = widened(dO);
      const std::vector<double> bound = dw_bound(causal_form, Qd, Kd, Vd, Wqd, Wkd, wd, dOd, u);
      CHECK(within(std::get<5>(f), std::get<5>(r), bound));
      CHECK(within(std::get<5>(nv), std::get<5>(r), bound));
      const auto fd = additive_grads<double>(causal_form, w_row, Qd, Kd, Vd, Wqd, Wkd, wd, dOd, qkv::fused);
      CHECK(within(std::get<5>(fd), std::get<5>(r), dw_bound(causal_form, Qd, Kd, Vd, Wqd, Wkd, wd, dOd, std::ldexp(1.0, -53))));
      // The fused backward ran: Q's gradient is the bits it has when w is no target.
      const mat<float> wc = w_row ? w : transposed(w);
      const auto [dQ] = causal_form ? gradient(softmax(causal(similarity(Q, K, additive(Wq, Wk, wc)))) * V, dO, wrt(Q), qkv::fused)
                                    : gradient(softmax(masked(similarity(Q, K, additive(Wq, Wk, wc)), holes_pred{})) * V, dO,
                                               wrt(Q), qkv::fused);
      CHECK(test::same_bits(std::get<0>(f), dQ));
    }
}

TEST_CASE("fused backward of additive's w: the same bits on 1, 2 and 3 threads, and tensors sum their heads' dw in "
          "order",
          "[gradient][similarity][threads]") {
  test::threads_guard guard;
  const std::size_t n = 150, m = 3000, d = 16, da = 24;
  ref::rng rng(23);
  mat<float> Q(n, d), K(m, d), V(m, d), dO(n, d), Wq(d, da), Wk(d, da), w(da, 1);
  rng.fill(Q), rng.fill(K), rng.fill(V), rng.fill(dO), rng.fill(Wq), rng.fill(Wk), rng.fill(w);
  const auto e = softmax(causal(similarity(Q, K, additive(Wq, Wk, w)))) * V;
  // Enough keys for two key groups: the weights' sums of two groups are added.
  using kernel = kernels::backward_with_functors<float, detail::fused_extension_t<std::remove_cvref_t<decltype(e)>>>::kernel;
  REQUIRE(kernel::key_groups(m, da, d) >= 2);
  set_threads(1);
  const auto [dQ, dw] = gradient(e, dO, wrt(Q, w), qkv::fused);
  {  // every group's sums counted: within dw_bound of the double gradient
    const mat<double> Qd = widened(Q), Kd = widened(K), Vd = widened(V), Wqd = widened(Wq), Wkd = widened(Wk),
                      wd = widened(transposed(w)), dOd = widened(dO);
    const auto [rw] = gradient(softmax(causal(similarity(Qd, Kd, additive(Wqd, Wkd, wd)))) * Vd, dOd, wrt(wd), naive);
    CHECK(within(transposed(dw), rw, dw_bound(true, Qd, Kd, Vd, Wqd, Wkd, wd, dOd, std::ldexp(1.0, -24))));
  }
  for (const std::size_t t : {2, 3}) {
    set_threads(t);
    const auto [dQt, dwt] = gradient(e, dO, wrt(Q, w), qkv::fused);
    INFO(t << " threads");
    CHECK(test::same_bits(dwt, dw));
    CHECK(test::same_bits(dQt, dQ));
  }

  const std::size_t H = 4, nh = 37, mh = 45;
  tensor<float, dyn, dyn, dyn> TQ(H, nh, d), TK(2, mh, d), TV(2, mh, d), TdO(H, nh, d);
  test::fill(TQ, rng), test::fill(TK, rng), test::fill(TV, rng), test::fill(TdO, rng);
  const auto [tdw] =
      gradient(softmax(causal(similarity(TQ, TK, additive(Wq, Wk, w)))) * TV, TdO, wrt(w), qkv::fused);
  mat<float> sum(da, 1);
  for (std::size_t h = 0; h < H; ++h) {
    const auto q = TQ.matrix_at(h), k = TK.matrix_at(h / 2), v = TV.matrix_at(h / 2), o = TdO.matrix_at(h);
    const auto [gw] = gradient(softmax(causal(similarity(q, k, additive(Wq, Wk, w)))) * v, o, wrt(w), qkv::fused);
    for (std::size_t c = 0; c < da; ++c) sum(c, 0) += gw(c, 0);
  }
  CHECK(test::same_bits(tdw, sum));
}
