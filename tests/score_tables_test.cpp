// score_mod(S, f, P...): a modifier that reads tables which have gradients
// (a relative-position bias, per-head slopes), forward against the bias it
// amounts to, the tables' gradients against that bias's gradient summed
// over the entries' positions and against central differences, fused
// against node by node, and the same bits on any number of threads.
#include <catch2/catch.hpp>

#include "extension_support.hpp"

#include <qkv/qkv.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

using namespace qkv;
using namespace test::ext;

namespace {

// A relative-position bias: key j seen from row i' (the row's position
// among the keys) adds table(h, i' − j); keys after i' read outside and
// are hidden by causal.
const auto relative = [](auto s, std::size_t, std::size_t h, auto i, auto j, auto p) { return s + p(h, i - j); };

// The bias the table amounts to for head h, row i' = i + (m − n).
template <class T>
dmat<T> expanded(const dmat<T>& table, std::size_t h, std::size_t n, std::size_t m) {
  dmat<T> b(n, m);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) {
      const std::ptrdiff_t at = std::ptrdiff_t(i + m) - std::ptrdiff_t(n), back = at - std::ptrdiff_t(j);
      b(i, j) = back >= 0 ? table(h, std::size_t(back)) : T(0);  // (hidden by causal where back < 0)
    }
  return b;
}

template <class T>
double max_gap(const dmat<T>& a, const dmat<double>& b) {
  double worst = 0;
  for (std::size_t r = 0; r < b.rows(); ++r)
    for (std::size_t c = 0; c < b.cols(); ++c) worst = std::fmax(worst, std::fabs(double(a(r, c)) - b(r, c)));
  return worst;
}

template <class X>
void fill_tensor(X& x, ref::rng& rng, double lo = -1, double hi = 1) {
  for (std::size_t a = 0; a < x.extent(0); ++a)
    for (std::size_t b = 0; b < x.extent(1); ++b)
      for (std::size_t i = 0; i < x.extent(2); ++i)
        for (std::size_t j = 0; j < x.extent(3); ++j) x(a, b, i, j) = static_cast<typename X::value_type>(rng.uniform(lo, hi));
}

dmat<double> widened(const dmat<float>& x) {
  dmat<double> r(x.rows(), x.cols());
  for (std::size_t i = 0; i < x.rows(); ++i)
    for (std::size_t j = 0; j < x.cols(); ++j) r(i, j) = x(i, j);
  return r;
}
template <class X>
auto widened_tensor(const X& x) {
  tensor<double, dyn, dyn, dyn, dyn> r(x.extent(0), x.extent(1), x.extent(2), x.extent(3));
  for (std::size_t a = 0; a < x.extent(0); ++a)
    for (std::size_t b = 0; b < x.extent(1); ++b)
      for (std::size_t i = 0; i < x.extent(2); ++i)
        for (std::size_t j = 0; j < x.extent(3); ++j) r(a, b, i, j) = x(a, b, i, j);
  return r;
}

template <class T>
dmat<T> table_of(std::size_t heads, std::size_t m, std::uint32_t seed) {
  dmat<T> t(heads, m);
  ref::rng rng(seed);
  rng.fill(t, -1, 1);
  return t;
}

template <class T>
void check_forward(std::size_t n, std::size_t m, std::size_t d, std::size_t dv, std::uint32_t seed) {
  if (test::emulation_skips(n, m, d, dv)) return;
  inputs<T> in(n, m, d, d, dv, seed, 1.5);
  const dmat<T> table = table_of<T>(1, m, seed + 1);
  const dmat<T> bias = expanded(table, 0, n, m);
  const T root = qkv::sqrt(T(d));
  const auto f = key_aligned(relative);
  auto e = softmax(causal(score_mod(in.Q * transpose(in.K) / root, f, table))) * in.V;
  const ref::mat b = ref::from(bias);
  scores sc = scaled<T>(dot_scores<T>(ref::from(in.Q), ref::from(in.K)), 1 / static_cast<real>(root), &b);
  sc.s = ref::causal(sc.s);
  INFO("n = " << n << ", m = " << m << ", d = " << d << ", dv = " << dv << ", " << type_name(T()) << ", kernels "
              << active_arch());
  check_pair<T>(eval(e, naive), eval(e, fused), sc, ref::from(in.V));
}

}  // namespace

TEST_CASE("score_mod(S, f, P) reads its table as the bias it amounts to", "[extension][score_mod][tables]") {
  const auto [n, m, d, dv] = GENERATE(extension_sizes());
  check_forward<float>(n, m, d, dv, std::uint32_t(n * 7 + m + d));
  check_forward<double>(n, m, d, dv, std::uint32_t(n * 3 + m + dv));
}

TEST_CASE("a table read outside its extents gives NaN, and a hidden pair's read changes nothing",
          "[extension][score_mod][tables]") {
  inputs<float> in(9, 13, 8, 8, 5, 17);
  const dmat<float> table = table_of<float>(1, 13, 4);
  // Without causal, row 0 sees keys 1.. whose i' − j < 0: outside.
  const auto e = softmax(score_mod(in.Q * transpose(in.K), key_aligned(relative), table)) * in.V;
  for (const auto& o : {eval(e, naive), eval(e, fused)}) {
    CHECK(std::isnan(o(0, 0)));
    CHECK(!std::isnan(o(8, 0)));  // the last row sees every key at i' − j ≥ 0
  }
  // One index for a table of one row; a one-column table too.
  dmat<float> row(1, 4), col(4, 1);
  for (std::size_t k = 0; k < 4; ++k) row(0, k) = col(k, 0) = float(k) - 1.5f;
  const auto slope = [](auto s, std::size_t, std::size_t, auto i, auto j, auto p) { return s + p(i) - p(j); };
  const auto a = eval(softmax(score_mod(in.Q * transpose(in.K), slope, row)) * in.V);
  const auto b = eval(softmax(score_mod(in.Q * transpose(in.K), slope, col)) * in.V);
  CHECK(test::same_bits(a, b));
  CHECK(std::isnan(a(0, 0)));  // key 4 on: outside a 4-entry table
}

TEST_CASE("a table's gradient is the bias's gradient summed over the pairs that read each entry",
          "[gradient][score_mod][tables]") {
  const std::size_t n = 11, m = 19, d = 6, dv = 5;
  inputs<double> in(n, m, d, d, dv, 8);
  dmat<double> dO(n, dv);
  ref::rng(9).fill(dO);
  const dmat<double> table = table_of<double>(1, m, 10);
  const dmat<double> bias = expanded(table, 0, n, m);
  auto e = softmax(causal(score_mod(in.Q * transpose(in.K), key_aligned(relative), table))) * in.V;
  auto plain = softmax(causal(in.Q * transpose(in.K) + bias)) * in.V;
  const auto [dB] = gradient(plain, dO, wrt(bias), naive);
  dmat<double> want(1, m);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j <= i + (m - n); ++j) want(0, i + (m - n) - j) += dB(i, j);
  const auto [naive_dt, naive_dq] = gradient(e, dO, wrt(table, in.Q), naive);
  const auto [fused_dt, fused_dq] = gradient(e, dO, wrt(table, in.Q), fused);
  const auto [plain_dq] = gradient(plain, dO, wrt(in.Q), naive);
  // The same sums in another order: a few ulps of the largest summand.
  double scale = 0;
  for (std::size_t k = 0; k < m; ++k) scale = std::fmax(scale, std::fabs(want(0, k)));
  CHECK(max_gap(naive_dt, want) <= 1e-14 * (1 + scale));
  CHECK(max_gap(fused_dt, want) <= 1e-14 * (1 + scale));
  CHECK(max_gap(fused_dq, plain_dq) <= 1e-14);
  CHECK(max_gap(naive_dq, plain_dq) <= 1e-14);
  // vjp's pullback, from what the forward kept.
  const auto [value, back] = vjp(e);
  const auto [vjp_dt] = back(dO, wrt(table));
  CHECK(max_gap(vjp_dt, want) <= 1e-14 * (1 + scale));
}

TEST_CASE("per-head tables inside a nonlinear modifier agree with central differences, over tensors and GQA",
          "[gradient][score_mod][tables]") {
  // Per-head temperature and ALiBi slope, read from a 2 × H table: f is
  // nonlinear in the table (s · t_h), so the check is not a sum of biases.
  const std::size_t B = 2, H = 4, Hkv = 2, n = 7, m = 10, d = 5, dv = 3;
  tensor<double, dyn, dyn, dyn, dyn> Q(B, H, n, d), K(B, Hkv, m, d), V(B, Hkv, m, dv), dO(B, H, n, dv);
  ref::rng rng(31);
  fill_tensor(Q, rng), fill_tensor(K, rng), fill_tensor(V, rng), fill_tensor(dO, rng);
  dmat<double> t(2, H);
  for (std::size_t h = 0; h < H; ++h) t(0, h) = 0.7 + 0.2 * double(h), t(1, h) = 0.1 * double(h + 1);
  const auto f = [](auto s, std::size_t, std::size_t h, auto i, auto j, auto p) {
    using std::tanh;
    return tanh(s * p(0, h)) * decltype(s)(3) - p(1, h) * (i - j);
  };
  const auto value = [&] { return eval(softmax(causal(score_mod(Q * transpose(K), f, t))) * V, naive); };
  const auto [naive_dt] = gradient(softmax(causal(score_mod(Q * transpose(K), f, t))) * V, dO, wrt(t), naive);
  const auto [fused_dt] = gradient(softmax(causal(score_mod(Q * transpose(K), f, t))) * V, dO, wrt(t), fused);
  // Central differences at h = 1e-5: truncation h²·|f‴| ≲ 1e-10, rounding
  // 1e-16/h ≈ 1e-11, of gradients of order 1.
  double worst = 0, gap = 0;
  for (std::size_t r = 0; r < 2; ++r)
    for (std::size_t c = 0; c < H; ++c) {
      const double keep = t(r, c), step = 1e-5;
      t(r, c) = keep + step;
      const auto up = value();
      t(r, c) = keep - step;
      const auto down = value();
      t(r, c) = keep;
      double fd = 0;
      for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < H; ++h)
          for (std::size_t i = 0; i < n; ++i)
            for (std::size_t l = 0; l < dv; ++l) fd += dO(b, h, i, l) * (up(b, h, i, l) - down(b, h, i, l)) / (2 * step);
      worst = std::fmax(worst, std::fabs(naive_dt(r, c) - fd));
      gap = std::fmax(gap, std::fabs(naive_dt(r, c) - fused_dt(r, c)));
    }
  CHECK(worst < 1e-8);
  CHECK(gap < 1e-13);
}

TEST_CASE("a table's fused gradient in float: within the naive one's error, the same bits on 1 and 2 threads",
          "[gradient][score_mod][tables][threads]") {
  // 700 keys in blocks of 64 make two key groups, which two threads split
  // (key groups, then query blocks); one thread runs the groups in turn.
  const std::size_t n = 700, m = 700, d = 32, dv = 24;
  inputs<float> in(n, m, d, d, dv, 5);
  dmat<float> dO(n, dv);
  ref::rng(6).fill(dO);
  const dmat<float> table = table_of<float>(1, m, 7);
  const dmat<double> Qw = widened(in.Q), Kw = widened(in.K), Vw = widened(in.V), dOw = widened(dO), tw = widened(table);
  const float root = qkv::sqrt(float(d));
  const auto f = key_aligned(relative);
  auto e = softmax(causal(score_mod(in.Q * transpose(in.K) / root, f, table))) * in.V;
  auto e_wide = softmax(causal(score_mod(Qw * transpose(Kw) / double(root), f, tw))) * Vw;
  const auto [want] = gradient(e_wide, dOw, wrt(tw), naive);
  const auto [by_nodes] = gradient(e, dO, wrt(table), naive);
  const std::size_t before = threads();
  set_threads(1);
  const auto [one] = gradient(e, dO, wrt(table), fused);
  set_threads(2);
  const auto [two] = gradient(e, dO, wrt(table), fused);
  set_threads(before);
  CHECK(test::same_bits(one, two));
  // Fused and node by node round the same sums in other orders: the fused
  // error within twice the node-by-node one, floored at 8u of the largest.
  const auto within = [](const auto& fused_got, const auto& naive_got, const dmat<double>& exact) {
    double top = 0;
    for (std::size_t r = 0; r < exact.rows(); ++r)
      for (std::size_t c = 0; c < exact.cols(); ++c) top = std::fmax(top, std::fabs(exact(r, c)));
    const double floor = 8 * double(std::numeric_limits<float>::epsilon()) / 2 * top;
    return max_gap(fused_got, exact) <= 2 * std::fmax(max_gap(naive_got, exact), floor);
  };
  CHECK(within(one, by_nodes, want));
  // Many heads at once (one a thread) as one head at a time.
  tensor<float, dyn, dyn, dyn, dyn> Qt(1, 3, 200, d), Kt(1, 3, 200, d), Vt(1, 3, 200, dv), dOt(1, 3, 200, dv);
  ref::rng rng(12);
  fill_tensor(Qt, rng), fill_tensor(Kt, rng), fill_tensor(Vt, rng), fill_tensor(dOt, rng);
  const dmat<float> heads = table_of<float>(3, 200, 13);
  const auto per_head = [](auto s, std::size_t, std::size_t h, auto i, auto j, auto p) { return s + p(h, i - j); };
  auto et = softmax(causal(score_mod(Qt * transpose(Kt), per_head, heads))) * Vt;
  set_threads(1);
  const auto [t1] = gradient(et, dOt, wrt(heads), fused);
  set_threads(2);
  const auto [t2] = gradient(et, dOt, wrt(heads), fused);
  set_threads(before);
  CHECK(test::same_bits(t1, t2));
  const auto [tn] = gradient(et, dOt, wrt(heads), naive);
  const auto Qtw = widened_tensor(Qt), Ktw = widened_tensor(Kt), Vtw = widened_tensor(Vt), dOtw = widened_tensor(dOt);
  const dmat<double> heads_w = widened(heads);
  const auto [tw_want] =
      gradient(softmax(causal(score_mod(Qtw * transpose(Ktw), per_head, heads_w))) * Vtw, dOtw, wrt(heads_w), naive);
  CHECK(within(t1, tn, tw_want));
}

TEST_CASE("a float table in a bf16 attention", "[extension][score_mod][tables][half]") {
  inputs<float> in(33, 47, 16, 16, 8, 21);
  const dmat<float> table = table_of<float>(1, 47, 22);
  matrix<bf16, dyn, dyn> Qb(33, 16), Kb(47, 16), Vb(47, 8);
  dmat<float> Qr(33, 16), Kr(47, 16), Vr(47, 8);
  for (std::size_t i = 0; i < 33; ++i)
    for (std::size_t c = 0; c < 16; ++c) Qb(i, c) = bf16(in.Q(i, c)), Qr(i, c) = float(Qb(i, c));
  for (std::size_t j = 0; j < 47; ++j) {
    for (std::size_t c = 0; c < 16; ++c) Kb(j, c) = bf16(in.K(j, c)), Kr(j, c) = float(Kb(j, c));
    for (std::size_t c = 0; c < 8; ++c) Vb(j, c) = bf16(in.V(j, c)), Vr(j, c) = float(Vb(j, c));
  }
  const auto f = key_aligned(relative);
  const auto half = eval(softmax(causal(score_mod(Qb * transpose(Kb), f, table))) * Vb);
  const auto full = eval(softmax(causal(score_mod(Qr * transpose(Kr), f, table))) * Vr);
  // The result rounded once to bf16 (2⁻⁹ of it) and the weights perhaps held
  // in bf16 for the second product (2⁻⁹ of Σ p|v| ≤ max|V| = 1): within 2⁻⁸.
  dmat<double> exact(33, 8);
  dmat<float> rounded(33, 8);
  for (std::size_t i = 0; i < 33; ++i)
    for (std::size_t c = 0; c < 8; ++c) exact(i, c) = full(i, c), rounded(i, c) = float(half(i, c));
  CHECK(max_gap(rounded, exact) <= std::ldexp(1.0, -8));
  dmat<float> dO(33, 8);
  ref::rng(23).fill(dO);
  const auto [dt_half] = gradient(softmax(causal(score_mod(Qb * transpose(Kb), f, table))) * Vb, dO, wrt(table));
  const auto [dt_full] = gradient(softmax(causal(score_mod(Qr * transpose(Kr), f, table))) * Vr, dO, wrt(table));
  CHECK(test::same_bits(dt_half, dt_full));  // the backward runs in float on float copies
}

TEST_CASE("a modifier that reads its table more often than the gradient follows says so",
          "[gradient][score_mod][tables]") {
  inputs<double> in(5, 6, 4, 4, 3, 2);
  dmat<double> dO(5, 3), table(1, 40);
  ref::rng(3).fill(dO), ref::rng(4).fill(table);
  const auto many = [](auto s, auto, auto, auto p) {
    for (int k = 0; k < 33; ++k) s = s + p(k) * decltype(s)(0.01);
    return s;
  };
  auto e = softmax(score_mod(in.Q * transpose(in.K), many, table)) * in.V;
  CHECK_THROWS_AS(gradient(e, dO, wrt(table)), std::invalid_argument);
  CHECK_THROWS_AS(gradient(e, dO, wrt(table), naive), std::invalid_argument);
  CHECK_NOTHROW(gradient(e, dO, wrt(in.Q)));  // the tables are not among the X: nothing to follow
}
