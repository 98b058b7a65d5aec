// qkv::mpi across processes (run under mpirun -np 1, 2, 3 and 4; see
// tests/CMakeLists.txt): every rank builds the whole sequence from one seed,
// takes its consecutive rows, and checks its rows of mpi::eval against the
// whole in long double (matrices) or double (tensors) within part_forms.hpp's
// bound of P merged parts; for every form that uses positions, lengths that P
// does not divide, a rank with no rows, grouped-query tensors, decoding from a
// sharded cache, the same bits on a second run, and the error every rank
// throws when one passes another form.
#include <catch2/catch.hpp>

#include "part_forms.hpp"

#include <qkv/mpi.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

using namespace test::parts;

namespace {

int rank_of() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int ranks() {
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}

// Where each rank's rows start: [r·T/P, (r+1)·T/P), or with `empty_one` rank 1 holding none.
std::vector<std::size_t> split_points(std::size_t t, int p, bool empty_one) {
  std::vector<std::size_t> at;
  for (int r = 0; r <= p; ++r) at.push_back(t * static_cast<std::size_t>(r) / static_cast<std::size_t>(p));
  if (empty_one && p > 1) at[1] = 0;
  return at;
}

template <class O>
std::vector<double> values(const O& o, std::size_t n) {
  return std::vector<double>(o.data(), o.data() + n);
}

// This rank's rows [r0, r0 + n) of each batch index's t rows.
std::vector<double> my_rows(const std::vector<double>& whole, std::size_t batches, std::size_t t, std::size_t dv,
                            std::size_t r0, std::size_t n) {
  std::vector<double> x;
  for (std::size_t b = 0; b < batches; ++b)
    for (std::size_t i = r0; i < r0 + n; ++i)
      for (std::size_t c = 0; c < dv; ++c) x.push_back(whole[(b * t + i) * dv + c]);
  return x;
}

// The rows of x (one batch index's t rows, or [b0, b1, t, cols]) from r0 on, as a dense copy.
template <class T>
std::vector<T> cut(const std::vector<T>& x, std::size_t batches, std::size_t t, std::size_t cols, std::size_t r0,
                   std::size_t n) {
  std::vector<T> y;
  for (std::size_t b = 0; b < batches; ++b) y.insert(y.end(), x.begin() + (b * t + r0) * cols, x.begin() + (b * t + r0 + n) * cols);
  return y;
}

// A sequence of t rows of Q, K and V (one batch index, width d) made from
// seed on every rank alike, and this rank's consecutive rows of it.
struct share {
  rng gen;
  data q, k, v;
  std::size_t r0 = 0, n = 0;
  std::vector<float> ql, kl, vl;
  share(std::uint32_t seed, std::size_t t, std::size_t d, bool empty_one = false)
      : gen(seed), q(1, t, d, gen), k(1, t, d, gen), v(1, t, d, gen) {
    const auto at = split_points(t, ranks(), empty_one);
    const auto r = static_cast<std::size_t>(rank_of());
    r0 = at[r], n = at[r + 1] - r0;
    ql = cut(q.f, 1, t, d, r0, n), kl = cut(k.f, 1, t, d, r0, n), vl = cut(v.f, 1, t, d, r0, n);
  }
};

// Form f over the whole (in T), over b0 × b1 query heads on b1 / g key heads.
template <class T, class Run>
auto over(int f, const std::vector<T>& q, const std::vector<T>& k, const std::vector<T>& v, std::size_t b0,
          std::size_t b1, std::size_t g, std::size_t nq, std::size_t nk, std::size_t d, std::size_t dv, Run&& run) {
  if (b0 * b1 == 1) return with_form(f, rows_matrix(q, d, 0, nq), rows_matrix(k, d, 0, nk), rows_matrix(v, dv, 0, nk), run);
  return with_form(f, rows_tensor(q, b0, b1, nq, d, 0, nq), rows_tensor(k, b0, b1 / g, nk, d, 0, nk),
                   rows_tensor(v, b0, b1 / g, nk, dv, 0, nk), run);
}

void check_ring(int f, std::size_t b0, std::size_t b1, std::size_t g, std::size_t t, std::size_t d, std::size_t dv,
                bool empty_one) {
  const int r = rank_of(), p = ranks();
  INFO("P = " << p << ", rank " << r << ", form " << form_name(f) << ", [" << b0 << ", " << b1 << "] on " << b1 / g
              << " heads, T = " << t << ", d = " << d << ", dv = " << dv << (empty_one ? ", rank 1 empty" : ""));
  rng gen(static_cast<std::uint32_t>(11 + f + 7 * t));
  const std::size_t bq = b0 * b1, bk = b0 * b1 / g;
  const data q(bq, t, d, gen), k(bk, t, d, gen), v(bk, t, dv, gen);
  const auto whole = [&](const auto& e) { return values(eval(e), bq * t * dv); };
  const auto ref = over(f, q.d, k.d, v.d, b0, b1, g, t, t, d, dv, whole);
  const auto one = over(f, q.f, k.f, v.f, b0, b1, g, t, t, d, dv, whole);
  const auto at = split_points(t, p, empty_one);
  const std::size_t r0 = at[static_cast<std::size_t>(r)], n = at[static_cast<std::size_t>(r) + 1] - r0;
  const auto ql = cut(q.f, bq, t, d, r0, n), kl = cut(k.f, bk, t, d, r0, n), vl = cut(v.f, bk, t, dv, r0, n);
  const auto dist = [&](const auto& e) { return values(qkv::mpi::eval(e, MPI_COMM_WORLD), bq * n * dv); };
  const auto got = over(f, ql, kl, vl, b0, b1, g, n, n, d, dv, dist);
  const auto again = over(f, ql, kl, vl, b0, b1, g, n, n, d, dv, dist);
  // Matrices against the long-double reference, tensors against their
  // heads in double (the long-double one for matrices checks the forms).
  const auto want = b0 * b1 == 1 ? my_rows(long_double_form(f, q.d, k.d, v.d, t, d, dv), 1, t, dv, r0, n)
                                 : my_rows(ref, bq, t, dv, r0, n);
  const auto single = my_rows(one, bq, t, dv, r0, n);
  const double w = max_diff(single, want, want.size());
  const double bound = split_bound(w, static_cast<std::size_t>(p), 16 * std::sqrt(double(d)) + 0.25 * double(t) + 2, t, 2);
  INFO("whole in float: " << w << ", across ranks: " << max_diff(got, want, want.size()) << ", bound " << bound);
  CHECK(max_diff(got, want, want.size()) <= bound);
  CHECK(std::memcmp(got.data(), again.data(), got.size() * sizeof(double)) == 0);
}

}  // namespace

TEST_CASE("ring attention: matrices, every form, lengths the ranks do not divide", "[mpi]") {
  for (int f = 0; f < form_count; ++f) {
    check_ring(f, 1, 1, 1, 77, 16, 24, false);
    check_ring(f, 1, 1, 1, 301, 64, 32, false);
  }
}

TEST_CASE("ring attention: a rank with no rows", "[mpi]") {
  for (int f : {0, 1, 6}) check_ring(f, 1, 1, 1, 50, 8, 8, true);
}

TEST_CASE("ring attention: grouped-query tensors", "[mpi]") {
  for (int f : {0, 1, 3, 4, 5}) check_ring(f, 2, 4, 2, 45, 16, 8, false);
}

TEST_CASE("ring attention: {O, L}", "[mpi]") {
  const std::size_t t = 40, d = 8;
  const share my(5, t, d);
  const auto &q = my.q, &k = my.k, &v = my.v;
  const auto &ql = my.ql, &kl = my.kl, &vl = my.vl;
  const std::size_t r0 = my.r0, n = my.n;
  const auto [o, l] = qkv::mpi::eval_with_lse(softmax(causal(rows_matrix(ql, d, 0, n) * transpose(rows_matrix(kl, d, 0, n)))) *
                                                  rows_matrix(vl, d, 0, n),
                                              MPI_COMM_WORLD);
  const auto [ow, lw] = eval_with_lse(softmax(causal(rows_matrix(q.d, d, 0, t) * transpose(rows_matrix(k.d, d, 0, t)))) *
                                      rows_matrix(v.d, d, 0, t));
  REQUIRE(l.rows() == n);
  for (std::size_t i = 0; i < n; ++i) CHECK(std::fabs(l(i, 0) - lw(r0 + i, 0)) <= 1e-5 * (1 + std::fabs(lw(r0 + i, 0))));
}

TEST_CASE("the zig-zag assignment: chunks r and 2P - 1 - r, rows moved there and back", "[mpi]") {
  namespace md = qkv::mpi::detail;
  const int r = rank_of(), p = ranks();
  for (const std::size_t t : {std::size_t(3), std::size_t(77), std::size_t(301)})
    for (const bool empty_one : {false, true}) {
      INFO("P = " << p << ", rank " << r << ", T = " << t << (empty_one ? ", rank 1 empty" : ""));
      const auto at = split_points(t, p, empty_one);
      std::vector<std::size_t> rows;
      for (int x = 0; x < p; ++x) rows.push_back(at[static_cast<std::size_t>(x) + 1] - at[static_cast<std::size_t>(x)]);
      const md::assignment given = md::consecutive(rows), zz = md::zigzag(t, p);
      // Every row once, in chunks of c or c + 1 rows, rank x's the x-th and the x-th from the end.
      const std::size_t c = t / (2 * static_cast<std::size_t>(p));
      std::vector<int> seen(t, 0);
      for (int x = 0; x < p; ++x) {
        const auto& ranges = zz.of[static_cast<std::size_t>(x)];
        REQUIRE(ranges.size() == 2);
        CHECK(ranges[0].begin == t * static_cast<std::size_t>(x) / (2 * static_cast<std::size_t>(p)));
        CHECK(ranges[1].end == t * (2 * static_cast<std::size_t>(p) - static_cast<std::size_t>(x)) / (2 * static_cast<std::size_t>(p)));
        for (const auto& g : ranges) {
          CHECK((g.size() == c || g.size() == c + 1));
          for (std::size_t i = g.begin; i < g.end; ++i) ++seen[i];
        }
      }
      CHECK(std::count(seen.begin(), seen.end(), 1) == static_cast<std::ptrdiff_t>(t));
      // Rows named by batch index, position and column, two batch indices of three columns.
      const std::size_t b = 2, cols = 3;
      const auto name = [&](std::size_t x, std::size_t i, std::size_t col) { return double(x * 1000000 + i * 10 + col); };
      std::vector<double> mine, want;
      for (std::size_t x = 0; x < b; ++x) {
        for (std::size_t i = at[static_cast<std::size_t>(r)]; i < at[static_cast<std::size_t>(r) + 1]; ++i)
          for (std::size_t col = 0; col < cols; ++col) mine.push_back(name(x, i, col));
        for (const auto& g : zz.of[static_cast<std::size_t>(r)])
          for (std::size_t i = g.begin; i < g.end; ++i)
            for (std::size_t col = 0; col < cols; ++col) want.push_back(name(x, i, col));
      }
      const auto there = md::move_rows(mine, b, cols, given, zz, r, 7, MPI_COMM_WORLD);
      CHECK(there == want);
      CHECK(md::move_rows(there, b, cols, zz, given, r, 7, MPI_COMM_WORLD) == mine);
    }
}

TEST_CASE("ring attention under causal: every rank computes as many pairs at every step", "[mpi]") {
  const int r = rank_of(), p = ranks();
  for (const bool empty_one : {false, true}) {
    INFO("P = " << p << ", rank " << r << (empty_one ? ", rank 1 empty" : ""));
    const std::size_t t = 301, d = 8, ps = static_cast<std::size_t>(p);
    const share my(3, t, d, empty_one);
    qkv::mpi::detail::ring_profile prof;
    (void)qkv::mpi::detail::ring(softmax(causal(rows_matrix(my.ql, d, 0, my.n) * transpose(rows_matrix(my.kl, d, 0, my.n)))) *
                                     rows_matrix(my.vl, d, 0, my.n),
                                 MPI_COMM_WORLD, &prof);
    CHECK(prof.zigzag == (p > 1));
    REQUIRE(prof.step_pairs.size() == ps);
    const std::vector<unsigned long long> mine(prof.step_pairs.begin(), prof.step_pairs.end());
    std::vector<unsigned long long> all(ps * ps);
    MPI_Allgather(mine.data(), p, MPI_UNSIGNED_LONG_LONG, all.data(), p, MPI_UNSIGNED_LONG_LONG, MPI_COMM_WORLD);
    // Every visible pair exactly once over all ranks and steps.
    CHECK(std::accumulate(all.begin(), all.end(), 0ull) == t * (t + 1) / 2);
    // Chunks have c or c + 1 rows, c = ⌊T/2P⌋. At step 0 rank x computes
    // s(s + 1)/2 pairs (its two chunks, s rows, causal among themselves), at
    // a later step s·(a key chunk's rows) or (a query chunk's rows)·s: so the
    // ranks' counts at one step differ by at most a factor ((c + 1)/c)².
    // (Consecutive rows would leave rank 0 nothing to compute at step 1.)
    const double c = double(t / (2 * ps)), most = (c + 1) * (c + 1) / (c * c);
    for (std::size_t step = 0; step < ps; ++step) {
      unsigned long long lo = all[step], hi = all[step];
      for (std::size_t x = 0; x < ps; ++x) lo = std::min(lo, all[x * ps + step]), hi = std::max(hi, all[x * ps + step]);
      INFO("step " << step << ": " << lo << " to " << hi << " pairs");
      CHECK(double(hi) <= most * double(lo));
    }
  }
}

TEST_CASE("ring attention under a causal window: the slices go no further than the queries see", "[mpi]") {
  const int p = ranks();
  const std::size_t t = 301, d = 8;
  const share my(4, t, d);
  const std::size_t n = my.n;
  const auto s = rows_matrix(my.ql, d, 0, n) * transpose(rows_matrix(my.kl, d, 0, n));
  const auto vm = rows_matrix(my.vl, d, 0, n);
  // 13 keys back, fewer than a rank's 75 rows: its own slice and the previous one.
  qkv::mpi::detail::ring_profile causal_window, two_sided;
  (void)qkv::mpi::detail::ring(softmax(window(causal(s), 13)) * vm, MPI_COMM_WORLD, &causal_window);
  CHECK_FALSE(causal_window.zigzag);
  CHECK(causal_window.steps == std::size_t(std::min(p, 2)));
  CHECK(causal_window.bytes_sent == (p > 1 ? 2 * n * d * sizeof(float) : 0));
  // A window that also reaches forward needs the next rank's slice, which
  // comes round last: every step.
  (void)qkv::mpi::detail::ring(softmax(window(s, 13, 4)) * vm, MPI_COMM_WORLD, &two_sided);
  CHECK(two_sided.steps == std::size_t(p));
}

TEST_CASE("ring attention on bf16 and f16 inputs, and float queries on a 2-byte cache", "[mpi]") {
  const int r = rank_of(), p = ranks();
  const std::size_t t = 150, d = 32;
  const share my(9, t, d);
  const auto &q = my.q, &k = my.k, &v = my.v;
  const std::size_t r0 = my.r0, n = my.n;
  const auto as = [](const std::vector<float>& x, auto h) {
    return std::vector<decltype(h)>(x.begin(), x.end());  // rounded to nearest even
  };
  // The parts round their weights to bf16 against their own maxima, and
  // both results are rounded once to 2 bytes: each differs from the exact
  // attention by at most 2⁻⁸·max|V| (weights) and half an ulp (2⁻⁸·max|O|),
  // so the two differ by at most 4·2⁻⁸·max|V| with max|V| = 2.
  const double bound = 4 * 2.0 / 256;
  const auto check = [&](auto h, bool float_queries) {
    INFO("P = " << p << ", rank " << r << (float_queries ? ", float queries" : ", 2-byte queries"));
    const auto qh = as(q.f, h), kh = as(k.f, h), vh = as(v.f, h);
    const auto kl = cut(kh, 1, t, d, r0, n), vl = cut(vh, 1, t, d, r0, n);
    const auto run = [&](const auto& qw) {
      const auto ql = cut(qw, 1, t, d, r0, n);
      for (int f : {0, 1, 3}) {
        INFO("form " << form_name(f));
        const auto whole = [&](const auto& e) { return values(eval(e), t * d); };
        const auto dist = [&](const auto& e) { return values(qkv::mpi::eval(e, MPI_COMM_WORLD), n * d); };
        const auto one = with_form(f, rows_matrix(qw, d, 0, t), rows_matrix(kh, d, 0, t), rows_matrix(vh, d, 0, t), whole);
        const auto got = with_form(f, rows_matrix(ql, d, 0, n), rows_matrix(kl, d, 0, n), rows_matrix(vl, d, 0, n), dist);
        const auto want = my_rows(one, 1, t, d, r0, n);
        INFO("across ranks against one process: " << max_diff(got, want, want.size()) << ", bound " << bound);
        CHECK(max_diff(got, want, want.size()) <= bound);
      }
    };
    if (float_queries) run(q.f);
    else run(qh);
  };
  check(qkv::bf16{}, false);
  check(qkv::f16{}, false);
  check(qkv::bf16{}, true);
}

TEST_CASE("decoding from a cache sharded across ranks", "[mpi]") {
  const int r = rank_of(), p = ranks();
  for (int f : {0, 1, 2, 4, 5, 6}) {
    for (const std::size_t m : {std::size_t(300), std::size_t(3)}) {
      INFO("P = " << p << ", rank " << r << ", form " << form_name(f) << ", m = " << m);
      rng gen(static_cast<std::uint32_t>(21 + f));
      const std::size_t n = 3, d = 32, dv = 16;
      const data q(1, n, d, gen), k(1, m, d, gen), v(1, m, dv, gen);
      const auto whole = [&](const auto& e) { return values(eval(e), n * dv); };
      const auto ref = over(f, q.d, k.d, v.d, 1, 1, 1, n, m, d, dv, whole);
      const auto one = over(f, q.f, k.f, v.f, 1, 1, 1, n, m, d, dv, whole);
      const auto at = split_points(m, p, false);
      const std::size_t k0 = at[static_cast<std::size_t>(r)], mk = at[static_cast<std::size_t>(r) + 1] - k0;
      const auto kl = cut(k.f, 1, m, d, k0, mk), vl = cut(v.f, 1, m, dv, k0, mk);
      const auto got = over(f, q.f, kl, vl, 1, 1, 1, n, mk, d, dv,
                            [&](const auto& e) { return values(qkv::mpi::decode(e, MPI_COMM_WORLD), n * dv); });
      const double w = max_diff(one, ref, ref.size());
      const double bound = split_bound(w, static_cast<std::size_t>(p), 16 * std::sqrt(double(d)) + 0.25 * double(m) + 2, m, 2);
      INFO("whole in float: " << w << ", sharded: " << max_diff(got, ref, ref.size()) << ", bound " << bound);
      CHECK(max_diff(got, ref, ref.size()) <= bound);
      // Every rank has the same bits: rank 0's, broadcast.
      std::vector<double> zero = got;
      MPI_Bcast(zero.data(), static_cast<int>(zero.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD);
      CHECK(std::memcmp(zero.data(), got.data(), got.size() * sizeof(double)) == 0);
    }
  }
}

TEST_CASE("ranks that pass different forms all get one qkv: error", "[mpi]") {
  const int r = rank_of();
  if (ranks() < 2) return;
  // Rank 1 has dk = 8, the others 16: every rank throws, none waits forever.
  const std::size_t d = r == 1 ? 8 : 16, n = 5;
  std::vector<float> x(n * d, 0.5f);
  const auto q = rows_matrix(x, d, 0, n);
  try {
    (void)qkv::mpi::eval(softmax(q * transpose(q)) * q, MPI_COMM_WORLD);
    FAIL("no error");
  } catch (const qkv::shape_error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).rfind("qkv: mpi::eval(e, comm): the ranks passed different forms: columns of Q (dk) is 16 on rank 0 but 8 on rank 1", 0) == 0);
  }
}
