// The row-block path of fused attention with an extension
// (kernels/attention_rows.hpp: the user's functors here, the softmax and the
// product with V on the library's kernels), called directly so that it runs
// whatever this unit's flags: key blocks that a predicate's hint empties are
// never computed, and windowed attention through it matches the reference
// at every tail, bit-identical over thread counts and with or without a hint.
#include "support.hpp"

#include <catch2/catch.hpp>
#include <qkv/kernels/attention_with.hpp>
#include <qkv/qkv.hpp>

#include <array>
#include <cstddef>
#include <vector>

namespace {

using namespace qkv;
using ref::real;
using test::same_bits;

// Key j is visible from query i when it is among the w keys ending at the
// query's own position i + (m − n) (bottom-right aligned, as causal is).
struct sliding {
  std::size_t n, m, w;
  bool keep(std::size_t i, std::size_t j) const {
    const std::ptrdiff_t pos = std::ptrdiff_t(i + m) - std::ptrdiff_t(n), jj = std::ptrdiff_t(j);
    return jj <= pos && pos - jj < std::ptrdiff_t(w);
  }
  // Exactly whether block [i0, i1) × [j0, j1) holds a visible pair.
  bool any(std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) const {
    const std::ptrdiff_t lo = std::ptrdiff_t(i0 + m) - std::ptrdiff_t(n) - std::ptrdiff_t(w) + 1;
    const std::ptrdiff_t hi = std::ptrdiff_t(i1 + m) - std::ptrdiff_t(n) - 1;  // visible keys of the block: [lo, hi]
    return i0 < i1 && j0 < j1 && std::ptrdiff_t(j0) <= hi && std::ptrdiff_t(j1) - 1 >= lo && hi >= 0;
  }
};

// The extension objects the kernel is given (kernels/extension.hpp): the
// window with its exact hint, without one, with one that keeps every block,
// and with one that knows nothing.
struct hinted {
  sliding win;
  bool keep(std::size_t i, std::size_t j, std::size_t, std::size_t) const { return win.keep(i, j); }
  int keep_any(std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1, std::size_t, std::size_t) const {
    return win.any(i0, i1, j0, j1) ? 1 : 0;
  }
};
struct plain {
  sliding win;
  bool keep(std::size_t i, std::size_t j, std::size_t, std::size_t) const { return win.keep(i, j); }
};
struct everywhere {  // says every block may hold a visible pair
  sliding win;
  bool keep(std::size_t i, std::size_t j, std::size_t, std::size_t) const { return win.keep(i, j); }
  int keep_any(std::size_t, std::size_t, std::size_t, std::size_t, std::size_t, std::size_t) const { return 1; }
};
struct unknowing {
  sliding win;
  bool keep(std::size_t i, std::size_t j, std::size_t, std::size_t) const { return win.keep(i, j); }
  int keep_any(std::size_t, std::size_t, std::size_t, std::size_t, std::size_t, std::size_t) const { return -1; }
};
// The window with a user similarity equal to the dot product: its scores
// come from this unit's register tile instead of the library's product.
struct hinted_term : hinted {
  template <class V>
  V term(const V& q, const V& k, std::size_t) const {
    return q * k;
  }
};

// Records the blocks the hint says are empty, and every pair the predicate
// or the modifier is then asked about inside one of them (one thread).
struct hint_log {
  std::vector<std::array<std::size_t, 4>> empty;
  std::size_t keeps = 0, modified = 0, in_empty = 0;
  void note(std::size_t i, std::size_t j) {
    for (const auto& b : empty)
      if (i >= b[0] && i < b[1] && j >= b[2] && j < b[3]) ++in_empty;
  }
};
struct recording {
  sliding win;
  hint_log* log;
  bool keep(std::size_t i, std::size_t j, std::size_t, std::size_t) const {
    ++log->keeps;
    log->note(i, j);
    return win.keep(i, j);
  }
  int keep_any(std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1, std::size_t, std::size_t) const {
    const bool any = win.any(i0, i1, j0, j1);
    if (!any) log->empty.push_back({i0, i1, j0, j1});
    return any ? 1 : 0;
  }
  template <class V>
  V modify(const V& s, const V& i, const V& j, std::size_t, std::size_t) const {
    if constexpr (std::is_floating_point_v<V>) {
      ++log->modified;
      log->note(std::size_t(i), std::size_t(j));
    } else {
      alignas(64) typename V::value_type is[V::size], js[V::size];
      i.store_aligned(is);
      j.store_aligned(js);
      for (std::size_t l = 0; l < V::size; ++l) {
        ++log->modified;
        log->note(std::size_t(is[l]), std::size_t(js[l]));
      }
    }
    return s;
  }
};

template <class T>
struct problem_data {
  std::size_t n, m, d, dv;
  matrix<T, dyn, dyn> Q, K, V, O;
  problem_data(std::size_t n_, std::size_t m_, std::size_t d_, std::size_t dv_, std::uint32_t seed)
      : n(n_), m(m_), d(d_), dv(dv_), Q(n_, d_), K(m_, d_), V(m_, dv_), O(n_, dv_) {
    ref::rng rng(seed);
    rng.fill(Q);
    rng.fill(K);
    rng.fill(V);
  }
  kernels::attention_problem<T> problem(T scale, bool causal) {
    kernels::attention_problem<T> p;
    p.q = {Q.data(), n, d, std::ptrdiff_t(d), 1};
    p.k = {K.data(), m, d, std::ptrdiff_t(d), 1};
    p.v = {V.data(), m, dv, std::ptrdiff_t(dv), 1};
    p.out = {O.data(), n, dv, std::ptrdiff_t(dv), 1};
    p.scale = scale;
    p.bounds.causal = causal;
    return p;
  }
  template <class Ext>
  matrix<T, dyn, dyn> rows(T scale, bool causal, const Ext& ext) {
    kernels::attention_rows_with(problem(scale, causal), ext);
    return O;
  }
};

}  // namespace

TEST_CASE("the row-block path never computes a key block the predicate's hint empties", "[extension][mask][rows]") {
  test::threads_guard guard;
  set_threads(1);  // the log is not shared between threads
  for (const std::array<std::size_t, 3> nmw : {std::array<std::size_t, 3>{512, 512, 32}, {300, 700, 100}, {130, 90, 1}}) {
    const std::size_t n = nmw[0], m = nmw[1], w = nmw[2];
    INFO("n = " << n << ", m = " << m << ", w = " << w);
    problem_data<float> in(n, m, 16, 8, 7);
    hint_log log;
    const sliding win{n, m, w};
    const auto got = in.rows(0.25f, false, recording{win, &log});
    CHECK(!log.empty.empty());
    CHECK(log.keeps > 0);
    CHECK(log.modified > 0);
    // Neither the predicate nor the modifier saw a pair of an emptied block.
    CHECK(log.in_empty == 0);
    // The work follows the window: at most the pairs of the blocks of rows
    // and keys it touches (64 × 64 each; the w + 63 keys a block of rows
    // sees lie in at most ⌈(w + 63) / 64⌉ + 1 key blocks), not n · m.
    const std::size_t blocks = (w + 63 + 63) / 64 + 1, bound = (n + 63) / 64 * 64 * blocks * 64;
    CHECK(log.keeps <= bound);
    CHECK(log.modified <= bound);
    CHECK(same_bits(got, in.rows(0.25f, false, hinted{win})));
  }
}

namespace {

// Windowed attention through the row-block path against the reference
// (ref::real_for<T>), with the bound of reference.hpp (the same products and softmax
// as the naive evaluation, restricted to the span of visible keys: the bound
// for m terms covers any fewer).
// The reference of one window, causal or not, from the raw scores Q Kᵀ:
// computed once for every functor checked against it.
template <class T>
struct window_reference {
  ref::mat_for<T> s, want, bound;
};

template <class T>
window_reference<T> reference_of(const problem_data<T>& in, const ref::mat_for<T>& qk, const sliding& win, bool causal) {
  using R = ref::real_for<T>;
  const T scale = T(1) / qkv::sqrt(T(in.d));
  const ref::mat_for<T> q = ref::from<R>(in.Q), k = ref::from<R>(in.K), v = ref::from<R>(in.V);
  const R sf = static_cast<R>(scale);
  ref::mat_for<T> s = ref::masked(ref::scale(qk, sf), [&](std::size_t i, std::size_t j) { return win.keep(i, j); });
  if (causal) s = ref::causal(s);
  const ref::mat_for<T> p = ref::softmax(s);
  ref::mat_for<T> want = ref::matmul(p, v);
  ref::mat_for<T> bound = ref::attention_bound<T>(q, k, v, sf, s, p);
  return {std::move(s), std::move(want), std::move(bound)};
}

template <class T, class Ext>
void check_rows(const char* what, problem_data<T>& in, const sliding& win, bool causal, const Ext& ext,
                const window_reference<T>& r) {
  INFO(what << ", n = " << in.n << ", m = " << in.m << ", w = " << win.w << (causal ? ", causal" : ""));
  const T scale = T(1) / qkv::sqrt(T(in.d));
  const auto got = in.rows(scale, causal, ext);
  CHECK(ref::worst_ratio(got, r.want, r.bound) <= 1);
  // Rows that see no key give zeros.
  for (std::size_t i = 0; i < in.n; ++i) {
    bool any = false;
    for (std::size_t j = 0; j < in.m; ++j) any = any || (win.keep(i, j) && (!causal || j + in.n <= i + in.m));
    if (!any)
      for (std::size_t c = 0; c < in.dv; ++c) CHECK(got(i, c) == T(0));
  }
}

template <class T>
void check_windows(std::uint32_t seed) {
  const std::array<std::size_t, 2> shapes[] = {{1, 1}, {5, 3}, {63, 64}, {65, 129}, {130, 70}, {200, 333}, {257, 300}};
  for (const auto& nm : shapes) {
    for (std::size_t w : {1, 37, 100, 1000}) {
      problem_data<T> in(nm[0], nm[1], 24, 10, seed++);
      using R = ref::real_for<T>;
      const ref::mat_for<T> qk = ref::matmul(ref::from<R>(in.Q), ref::transpose(ref::from<R>(in.K)));
      const sliding win{in.n, in.m, w};
      for (bool causal : {false, true}) {
        const window_reference<T> r = reference_of(in, qk, win, causal);
        check_rows("hinted", in, win, causal, hinted{win}, r);
        check_rows("plain", in, win, causal, plain{win}, r);
        check_rows("user term", in, win, causal, hinted_term{{win}}, r);
      }
    }
  }
}

}  // namespace

TEST_CASE("windowed attention in the row-block path matches the reference at every tail", "[extension][mask][rows]") {
  check_windows<float>(100);
  check_windows<double>(200);
}

TEST_CASE("the row-block path gives the same bits with or without a hint and for any thread count",
          "[extension][mask][rows][threads]") {
  test::threads_guard guard;
  for (const std::array<std::size_t, 3> nmw : {std::array<std::size_t, 3>{300, 700, 100}, {257, 257, 64}, {70, 1030, 300}}) {
    problem_data<float> in(nmw[0], nmw[1], 32, 16, 11);
    const sliding win{nmw[0], nmw[1], nmw[2]};
    INFO("n = " << in.n << ", m = " << in.m << ", w = " << win.w);
    set_threads(1);
    const auto one = in.rows(0.125f, false, hinted{win});
    const auto causal_one = in.rows(0.125f, true, hinted_term{{win}});
    CHECK(same_bits(one, in.rows(0.125f, false, plain{win})));
    CHECK(same_bits(one, in.rows(0.125f, false, unknowing{win})));
    CHECK(same_bits(one, in.rows(0.125f, false, everywhere{win})));
    for (std::size_t t : {2, 3}) {
      set_threads(t);
      CHECK(same_bits(one, in.rows(0.125f, false, hinted{win})));
      CHECK(same_bits(causal_one, in.rows(0.125f, true, hinted_term{{win}})));
    }
  }
}
