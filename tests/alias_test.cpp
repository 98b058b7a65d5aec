// eval_into when the destination overlaps memory the expression reads
// through a similarity's functor or a score modifier's: the result is the
// one an evaluation into fresh storage gives.
#include <catch2/catch.hpp>

#include "support.hpp"

#include <qkv/qkv.hpp>

#include <cstddef>
#include <tuple>

using namespace qkv;

namespace {

using fmat = matrix<float, dyn, dyn>;
using fview = matrix_view<float, dyn, dyn>;

// A score modifier adding a per-key bias read from a matrix it holds by
// pointer: it names that matrix through operands(), as docs/extending.md asks.
struct key_bias {
  const fview* table;
  template <class V>
  V operator()(V s, V, V j) const {
    V b(0);
    if constexpr (std::is_arithmetic_v<V>) {
      b = (*table)(0, static_cast<std::size_t>(j));
    } else {
      alignas(64) float lanes[V::size], js[V::size];
      j.store_aligned(js);
      for (std::size_t l = 0; l < V::size; ++l) lanes[l] = (*table)(0, static_cast<std::size_t>(js[l]));
      b = V::load_aligned(lanes);
    }
    return s + b;
  }
  auto operands() const { return std::tie(*table); }
};

}  // namespace

TEST_CASE("eval_into: additive(Wq, Wk, w) with w a view into the output", "[alias][extension]") {
  // n = 65: the rows after the first query block used to read a w the first
  // block had already overwritten.
  const std::size_t n = 65, m = 40, d = 6, da = 2;
  ref::rng rng(3);
  fmat Q(n, d), K(m, d), Wq(d, da), Wk(d, da), V(m, da), O(n, da);
  rng.fill(Q), rng.fill(K), rng.fill(Wq), rng.fill(Wk), rng.fill(V), rng.fill(O);
  const fview w(O.data(), 1, da);  // the output's first row
  const auto e = softmax(similarity(Q, K, additive(Wq, Wk, w))) * V;
  for (const bool fused_path : {false, true}) {
    fmat Oc = O;
    const fview wc(Oc.data(), 1, da);
    const auto ec = softmax(similarity(Q, K, additive(Wq, Wk, wc))) * V;
    // The same strategy into fresh storage, before Oc changes.
    const fmat want = fused_path ? eval(ec, fused) : eval(ec, naive);
    if (fused_path) eval_into(Oc, ec, fused);
    else eval_into(Oc, ec, naive);
    INFO((fused_path ? "fused" : "naive"));
    CHECK(test::same_bits(Oc, want));
  }
  (void)e;
}

TEST_CASE("eval_into: a score modifier that names the matrix it reads", "[alias][extension]") {
  // The modifier reads the output's first row; the query blocks after the
  // first (64 rows or more) used to read it after the first had written it.
  const test::threads_guard restore;
  set_threads(1);
  const std::size_t n = 70, m = 3, d = 4;
  ref::rng rng(5);
  fmat Q(n, d), K(m, d), V(m, m), O(n, m);
  rng.fill(Q), rng.fill(K), rng.fill(V), rng.fill(O);
  const fview table(O.data(), 1, m);
  const auto e = softmax(score_mod(Q * transpose(K), key_bias{&table})) * V;
  const fmat want = eval(e);  // into fresh storage, before O changes
  eval_into(O, e);
  CHECK(test::same_bits(O, want));
}
