// masked(S, pred): predicate masks against the materialised mask and the
// reference; block hints; key blocks skipped.
#include <catch2/catch.hpp>

#include "extension_support.hpp"

#include <qkv/qkv.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>

using namespace qkv;
using namespace test::ext;

namespace {

struct prefix_lm_t {  // a bidirectional prefix of p keys, causal after it
  std::ptrdiff_t n, m, p;
  bool operator()(std::size_t i, std::size_t j) const {
    return std::ptrdiff_t(j) < p || std::ptrdiff_t(j) <= std::ptrdiff_t(i) + m - n;
  }
};

struct block_sparse_t {  // blocks of 64 queries × 256 keys, a checkerboard of thirds
  bool operator()(std::size_t i, std::size_t j) const {
    return (i / 64 + j / 256) % 3 != 1 || (i % 13 == 0 && j % 97 == 5);
  }
};

struct empty_rows_t {  // rows 2, 6, 10, ... see nothing; the others every third key
  bool operator()(std::size_t i, std::size_t j) const { return i % 4 != 2 && j % 3 == 0; }
};

struct odd_key_blocks_t {  // keys 256–511, 768–1023, ... are masked for every query: skipped whole
  bool operator()(std::size_t, std::size_t j) const { return (j / 256) % 2 == 1; }
};

template <class P>
bmat materialise(std::size_t n, std::size_t m, const P& pred) {
  bmat M(n, m);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) M(i, j) = pred(i, j);
  return M;
}

// softmax(masked(S, pred)) * V against softmax(masked(S, M)) * V with M the
// predicate materialised, and both against the reference.
template <class T, class P>
void check_predicate(const char* what, std::size_t n, std::size_t m, std::size_t d, std::size_t dv, const P& pred,
                     std::uint32_t seed) {
  if (test::emulation_skips(n, m, d, dv)) return;
  INFO(what << ", n = " << n << ", m = " << m << ", d = " << d << ", dv = " << dv << ", " << type_name(T())
            << ", kernels " << active_arch());
  inputs<T> in(n, m, d, d, dv, seed);
  const bmat M = materialise(n, m, pred);
  const T root = qkv::sqrt(T(d));
  const auto q = ref::from(in.Q), k = ref::from(in.K), v = ref::from(in.V);

  const auto pn = eval(softmax(masked(in.Q * transpose(in.K) / root, pred)) * in.V, naive);
  const auto pf = eval(softmax(masked(in.Q * transpose(in.K) / root, pred)) * in.V, fused);
  const auto mn = eval(softmax(masked(in.Q * transpose(in.K) / root, M)) * in.V, naive);
  const auto mf = eval(softmax(masked(in.Q * transpose(in.K) / root, M)) * in.V, fused);
  scores sc = scaled<T>(dot_scores<T>(q, k), 1 / static_cast<real>(root));
  sc.s = ref::masked(sc.s, M);
  check_pair<T>(pn, pf, sc, v);
  check_pair<T>(mn, mf, sc, v);
  // Node by node, both masks write −∞ into the same scores: the same bits.
  CHECK(same_bits(pn, mn));
  // Fused, the predicate runs in the kernel instantiated here (this
  // translation unit's instruction set), the matrix in the compiled one:
  // the same loop when those sets agree and the queries are more than the
  // compiled kernels' decoding path takes (4).
  if (kernels::runs_like_library<xsimd::default_arch>() && n > 4) CHECK(same_bits(pf, mf));
  // Fully masked rows give zeros, in every evaluation.
  for (std::size_t i = 0; i < n; ++i) {
    bool any = false;
    for (std::size_t j = 0; j < m; ++j) any = any || M(i, j);
    if (!any) {
      CHECK(zero_row(pn, i));
      CHECK(zero_row(pf, i));
    }
  }

  // With causal and a similarity of the user's.
  const auto cn = eval(softmax(causal(masked(similarity(in.Q, in.K, neg_l1_t{}) / root, pred))) * in.V, naive);
  const auto cf = eval(softmax(causal(masked(similarity(in.Q, in.K, neg_l1_t{}) / root, pred))) * in.V, fused);
  const auto cm = eval(softmax(causal(masked(similarity(in.Q, in.K, neg_l1_t{}) / root, M))) * in.V, fused);
  scores sl = scaled<T>(neg_l1_scores<T>(q, k), 1 / static_cast<real>(root));
  sl.s = ref::causal(ref::masked(sl.s, M));
  check_pair<T>(cn, cf, sl, v);
  // The user's similarity runs in this unit's kernel either way: the same bits.
  CHECK(same_bits(cf, cm));
  // A predicate and a mask matrix together.
  const auto both = eval(softmax(masked(masked(in.Q * transpose(in.K) / root, in.M), pred)) * in.V, fused);
  scores sb = scaled<T>(dot_scores<T>(q, k), 1 / static_cast<real>(root));
  sb.s = ref::masked(ref::masked(sb.s, M), in.M);
  check_pair<T>(eval(softmax(masked(masked(in.Q * transpose(in.K) / root, in.M), pred)) * in.V, naive), both, sb, v);
}

}  // namespace

TEST_CASE("predicate masks equal the materialised mask and the reference", "[extension][mask]") {
  const auto [n, m, d, dv] = GENERATE(table<std::size_t, std::size_t, std::size_t, std::size_t>({
      {1, 300, 8, 8}, {3, 1100, 17, 5}, {70, 1100, 64, 32}, {130, 300, 17, 17}, {130, 1100, 8, 12}, {70, 1, 8, 3}}));
  const auto sn = std::ptrdiff_t(n), sm = std::ptrdiff_t(m);
  check_predicate<float>("sliding window", n, m, d, dv, window_t{sn, sm, 64}, 1);
  check_predicate<double>("sliding window", n, m, d, dv, window_t{sn, sm, 200}, 2);
  check_predicate<float>("prefix-LM", n, m, d, dv, prefix_lm_t{sn, sm, 100}, 3);
  check_predicate<double>("prefix-LM", n, m, d, dv, prefix_lm_t{sn, sm, 7}, 4);
  check_predicate<float>("block-sparse", n, m, d, dv, block_sparse_t{}, 5);
  check_predicate<double>("block-sparse", n, m, d, dv, block_sparse_t{}, 6);
  check_predicate<float>("rows masked whole", n, m, d, dv, empty_rows_t{}, 7);
  check_predicate<double>("rows masked whole", n, m, d, dv, empty_rows_t{}, 8);
  check_predicate<float>("stretches of 256 keys emptied", n, m, d, dv, odd_key_blocks_t{}, 9);
  check_predicate<double>("stretches of 256 keys emptied", n, m, d, dv, odd_key_blocks_t{}, 10);
}

TEST_CASE("a predicate that masks everything gives zeros and a lambda predicate works", "[extension][mask]") {
  inputs<float> in(70, 600, 16, 16, 8, 40);
  const auto none = [](std::size_t, std::size_t) { return false; };
  const auto On = eval(softmax(masked(in.Q * transpose(in.K), none)) * in.V, naive);
  const auto Of = eval(softmax(masked(similarity(in.Q, in.K, neg_l1_t{}), none)) * in.V, fused);
  for (std::size_t i = 0; i < 70; ++i) {
    CHECK(zero_row(On, i));
    CHECK(zero_row(Of, i));
  }
  // The masked scores themselves are −∞.
  const auto S = eval(masked(in.Q * transpose(in.K), [](std::size_t i, std::size_t j) { return i >= j; }));
  CHECK(S(0, 1) == -std::numeric_limits<float>::infinity());
  CHECK(S(1, 0) != -std::numeric_limits<float>::infinity());
  // A lambda with captures, as a sliding window.
  const std::size_t w = 16;
  const auto band = [w = w](std::size_t i, std::size_t j) { return j <= i + 530 && i + 530 - j < w; };
  const window_t same{70, 600, 16};
  CHECK(same_bits(eval(softmax(masked(in.Q * transpose(in.K), band)) * in.V, fused),
                  eval(softmax(masked(in.Q * transpose(in.K), same)) * in.V, fused)));
}

namespace {

// A sliding window that also tells whether a block of queries [i0, i1) and
// keys [j0, j1) keeps anything (the kernel then asks no pair of it).
struct window_with_hint_t : window_t {
  bool any(std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) const {
    if (i1 <= i0 || j1 <= j0) return false;
    const std::ptrdiff_t first = std::ptrdiff_t(i0) + m - n, last = std::ptrdiff_t(i1 - 1) + m - n;
    return std::ptrdiff_t(j0) <= last && first - std::ptrdiff_t(j1 - 1) < w;
  }
};

}  // namespace

TEST_CASE("a predicate's block hint gives the same results", "[extension][mask]") {
  for (std::size_t n : {3, 70, 300}) {
    inputs<float> in(n, 1100, 16, 16, 8, 42);
    const window_t plain{std::ptrdiff_t(n), 1100, 100};
    const window_with_hint_t hinted{plain};
    INFO("n = " << n);
    CHECK(same_bits(eval(softmax(masked(in.Q * transpose(in.K), hinted)) * in.V, fused),
                    eval(softmax(masked(in.Q * transpose(in.K), plain)) * in.V, fused)));
    CHECK(same_bits(eval(softmax(causal(masked(similarity(in.Q, in.K, neg_l1_t{}), hinted))) * in.V, fused),
                    eval(softmax(causal(masked(similarity(in.Q, in.K, neg_l1_t{}), plain))) * in.V, fused)));
    CHECK(same_bits(eval(softmax(masked(in.Q * transpose(in.K), hinted)) * in.V, naive),
                    eval(softmax(masked(in.Q * transpose(in.K), plain)) * in.V, naive)));
  }
}

TEST_CASE("key blocks a predicate empties are skipped, whatever this unit's instruction set", "[extension][mask]") {
  // The similarity counts its term's calls (the count does not change its
  // results): with every other block of 256 keys masked for every query,
  // the fused kernel computes about half the scores.
  std::atomic<std::size_t> calls{0};
  inputs<float> in(130, 1024, 16, 16, 8, 41);
  const auto all = [](std::size_t, std::size_t) { return true; };
  calls = 0;
  const auto full = eval(softmax(masked(similarity(in.Q, in.K, counting_dot{&calls}), all)) * in.V, fused);
  const std::size_t full_calls = calls;
  calls = 0;
  const auto half = eval(softmax(masked(similarity(in.Q, in.K, counting_dot{&calls}), odd_key_blocks_t{})) * in.V, fused);
  const std::size_t half_calls = calls;
  CHECK(full_calls > 0);
  // Both the online loop (which runs here when this unit is compiled for the
  // instruction set the library runs) and the row-block path skip the
  // emptied blocks: half the terms, and a margin for the predicate's checks.
  CHECK(half_calls * 10 <= full_calls * 6);
  scores sc = scaled<float>(dot_scores<float>(ref::from(in.Q), ref::from(in.K)), 1);
  sc.s = masked_by(sc.s, odd_key_blocks_t{});
  check_pair<float>(eval(softmax(masked(similarity(in.Q, in.K, counting_dot{&calls}), odd_key_blocks_t{})) * in.V, naive),
                    half, sc, ref::from(in.V));
  (void)full;
}
