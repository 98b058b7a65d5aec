// Paged K/V caches: a pool of pages, a block table and lengths. Attention
// over them must be bit for bit the same expression over each sequence's
// keys gathered into a contiguous tensor, whatever the page size, the page
// order or the thread count; everything a view would read is checked
// before it is read (these tests also run under AddressSanitizer).
#include <catch2/catch.hpp>

#include "reference.hpp"
#include "support.hpp"

#include <qkv/qkv.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <vector>

using namespace qkv;
using test::same_bits;

namespace {

// B sequences' keys in pages of `page_size`, the pages of all sequences
// shuffled through the pool, with `spare` unused pages; unused table
// entries hold -1 (never read).
template <class T>
struct cache {
  std::size_t page_size, heads, dim, pages;
  std::vector<std::int32_t> lengths, table;
  std::size_t width;  // table columns
  std::vector<T> pool;

  cache(const std::vector<std::size_t>& lens, std::size_t ps, std::size_t h, std::size_t d, ref::rng& rng,
        std::size_t spare = 3)
      : page_size(ps), heads(h), dim(d) {
    width = 1;
    std::size_t used = 0;
    for (std::size_t n : lens) {
      lengths.push_back(static_cast<std::int32_t>(n));
      width = std::max(width, (n + ps - 1) / ps + 1);
      used += (n + ps - 1) / ps;
    }
    pages = used + spare;
    std::vector<std::int32_t> order(pages);
    std::iota(order.begin(), order.end(), 0);
    for (std::size_t x = pages; x > 1; --x) std::swap(order[x - 1], order[static_cast<std::size_t>(rng.uniform(0, double(x) - 1e-9))]);
    table.assign(lens.size() * width, -1);
    std::size_t next = 0;
    for (std::size_t b = 0; b < lens.size(); ++b)
      for (std::size_t k = 0; k < (lens[b] + ps - 1) / ps; ++k) table[b * width + k] = order[next++];
    pool.resize(pages * ps * h * d);
    for (T& x : pool) x = static_cast<T>(rng.uniform(-1, 1));
  }
  paged_view<const T, dyn, dyn> view() const {
    return {pool.data(), {pages, page_size, heads, dim}, {table.data(), lengths.size(), width}, lengths};
  }
};

// Sequence b of a paged operand as a [1, H, m, D] tensor.
template <class P>
auto dense(const P& p, std::size_t b) {
  tensor<typename P::value_type, 1, dyn, dyn, dyn> t(std::size_t(1), p.heads(), p.length(b), p.cols());
  for (std::size_t i = 0; i < p.length(b); ++i)
    for (std::size_t h = 0; h < p.heads(); ++h)
      for (std::size_t c = 0; c < p.cols(); ++c) t(0, h, i, c) = p(b, i, h, c);
  return t;
}

// Query b of a [B, H, n, D] tensor as [1, H, n, D].
template <class Q>
auto query(const Q& q, std::size_t b) {
  return tensor_view<const typename Q::value_type, 1, dyn, dyn, dyn>(
      q.data() + b * q.stride(0), {1, q.extent(1), q.extent(2), q.extent(3)});
}

template <class Got, class Want>
void check_sequences(const Got& got, std::size_t B, std::size_t heads, Want want) {
  for (std::size_t b = 0; b < B; ++b) {
    const auto w = want(b);
    for (std::size_t h = 0; h < heads; ++h) {
      INFO("sequence " << b << ", head " << h);
      CHECK(same_bits(got.matrix_at(b, h), w.matrix_at(0, h)));
    }
  }
}

}  // namespace

TEST_CASE("paged_view: what it reads is checked where it is made", "[paged][errors]") {
  std::vector<float> pool(6 * 4 * 2 * 8, 1.0f);
  const std::vector<std::int32_t> table{0, 5, -1, 3, 99, -7};  // 2 sequences of up to 3 pages of 4
  const matrix_view<const std::int32_t, dyn, dyn> bt(table.data(), 2, 3);
  const std::vector<std::int32_t> ok{8, 4};  // reads pages 0, 5 and 3 only
  const paged_view<const float, 2, 8> v(pool.data(), {6, 4, 2, 8}, bt, ok);
  CHECK(v.batch() == 2);
  CHECK(v.length(0) == 8);
  CHECK(v.tokens() == 12);
  CHECK(&v(0, 5, 1, 2) == pool.data() + ((5 * 4 + 1) * 2 + 1) * 8 + 2);  // key 5: page 5, row 1
  CHECK_THROWS_AS(v.at(1, 4, 0, 0), std::out_of_range);
  using lengths = std::vector<std::int32_t>;
  const auto make = [&](const lengths& l, paged_extents x = {6, 4, 2, 8}) {
    return paged_view<const float, dyn, 8>(pool.data(), x, bt, l);
  };
  CHECK_THROWS_WITH(make(lengths{8, 5}), Catch::Contains("names page 99 (entry 1), outside the pool of 6"));
  CHECK_THROWS_WITH(make(lengths{9, 4}), Catch::Contains("names page -1"));
  CHECK_THROWS_WITH(make(lengths{8, 13}), Catch::Contains("beyond its table"));
  CHECK_THROWS_AS(make(lengths{8}), std::invalid_argument);  // B differs
  CHECK_THROWS_AS(make(lengths{8, -1}), std::invalid_argument);
  CHECK_THROWS_AS(make(ok, {6, 0, 2, 8}), std::invalid_argument);
  CHECK_THROWS_AS(make(ok, {5, 4, 2, 8}), std::invalid_argument);  // page 5 outside a pool of 5
  CHECK_THROWS_AS(make(ok, {6, 4, 2, 7}), shape_error);  // static D
  CHECK_THROWS_AS((paged_view<const float, 2, 8>(nullptr, {6, 4, 2, 8}, bt, ok)), std::invalid_argument);
}

TEST_CASE("attention over paged K and V: bit for bit the contiguous keys, any page size and order", "[paged]") {
  const std::vector<std::size_t> m{37, 1, 0, 300, 64};
  const std::size_t B = m.size(), Hq = 4, Hk = 2, d = 24;
  ref::rng rng(60);
  test::threads_guard guard;
  for (std::size_t page : {1, 4, 16}) {
    INFO("pages of " << page);
    const cache<float> k(m, page, Hk, d, rng), v(m, page, Hk, d, rng);
    const auto K = k.view(), V = v.view();
    const float root = qkv::sqrt(float(d));
    for (std::size_t n : {1, 3}) {  // decode; speculative
      INFO(n << " queries per sequence");
      tensor<float, dyn, Hq, dyn, dyn> Q(B, Hq, n, d);
      for (std::size_t x = 0; x < Q.size(); ++x) Q.data()[x] = static_cast<float>(rng.uniform(-1, 1));
      for (std::size_t threads : {1, 2}) {
        set_threads(threads);
        const auto O = eval(softmax(causal(Q * transpose(K) / root)) * V);
        static_assert(tensor_leaf<decltype(O)> && !detail::ragged_leaf<decltype(O)>);
        check_sequences(O, B, Hq, [&](std::size_t b) {
          return eval(softmax(causal(query(Q, b) * transpose(dense(K, b)) / root)) * dense(V, b));
        });
        const auto [O2, L] = eval_with_lse(softmax(window(Q * transpose(K), 8)) * V);
        check_sequences(L, B, Hq, [&](std::size_t b) {
          return eval_with_lse(softmax(window(query(Q, b) * transpose(dense(K, b)), 8)) * dense(V, b)).second;
        });
      }
    }
  }
}

TEST_CASE("paged attention with ragged queries: chunked prefill and decodes in one call", "[paged][ragged]") {
  const std::vector<std::size_t> m{40, 9, 200, 1}, n{40, 1, 17, 1};  // a prompt, a decode, a chunk, a decode
  const std::size_t Hq = 8, Hk = 2, d = 32;
  ref::rng rng(61);
  const cache<bf16> k(m, 16, Hk, d, rng), v(m, 16, Hk, d, rng);
  std::vector<std::int32_t> offsets{0};
  for (std::size_t x : n) offsets.push_back(offsets.back() + static_cast<std::int32_t>(x));
  ragged<float, Hq, dyn> Q(offsets, {Hq, d});
  for (std::size_t x = 0; x < Q.size(); ++x) Q.data()[x] = static_cast<float>(rng.uniform(-1, 1));
  const auto K = k.view(), V = v.view();
  const auto O = eval(softmax(causal(Q * transpose(K) / 4.0f)) * V);
  REQUIRE(O.tokens() == Q.tokens());
  check_sequences(O, n.size(), Hq, [&](std::size_t b) {
    tensor<float, 1, Hq, dyn, dyn> q(std::size_t(1), Hq, n[b], d);
    for (std::size_t i = 0; i < n[b]; ++i)
      for (std::size_t h = 0; h < Hq; ++h)
        for (std::size_t c = 0; c < d; ++c) q(0, h, i, c) = Q(static_cast<std::size_t>(offsets[b]) + i, h, c);
    return eval(softmax(causal(q * transpose(dense(K, b)) / 4.0f)) * dense(V, b));
  });
}

TEST_CASE("append writes each sequence's new rows at its length", "[paged]") {
  const std::size_t page = 4, H = 2, d = 8, pages = 12;
  std::vector<float> pool(pages * page * H * d, -9.0f);
  const std::vector<std::int32_t> table{7, 2, 11, -1, 0, 5, 9, 4};  // 2 sequences, up to 4 pages each
  const matrix_view<const std::int32_t, dyn, dyn> bt(table.data(), 2, 4);
  std::vector<std::int32_t> lengths{0, 0};
  ragged<float, H, d> all(std::vector<std::int32_t>{0, 11, 27}, {H, d});  // the whole sequences
  for (std::size_t x = 0; x < all.size(); ++x) all.data()[x] = float(x);
  // In chunks: 5 + 6 rows for sequence 0, 9 + 7 for sequence 1.
  const std::vector<std::vector<std::size_t>> chunks{{5, 9}, {6, 7}};
  for (const auto& chunk : chunks) {
    ragged<float, H, d> rows(std::vector<std::int32_t>{0, std::int32_t(chunk[0]), std::int32_t(chunk[0] + chunk[1])}, {H, d});
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t i = 0; i < chunk[b]; ++i)
        for (std::size_t h = 0; h < H; ++h)
          for (std::size_t c = 0; c < d; ++c)
            rows(std::size_t(rows.offsets()[b]) + i, h, c) = all(std::size_t(all.offsets()[b]) + lengths[b] + i, h, c);
    append(paged_view<float, H, d>(pool.data(), {pages, page, H, d}, bt, lengths), rows);
    for (std::size_t b = 0; b < 2; ++b) lengths[b] += static_cast<std::int32_t>(chunk[b]);
  }
  const paged_view<const float, H, d> cache(pool.data(), {pages, page, H, d}, bt, lengths);
  for (std::size_t b = 0; b < 2; ++b)
    for (std::size_t t = 0; t < cache.length(b); ++t)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t c = 0; c < d; ++c) CHECK(cache(b, t, h, c) == all(std::size_t(all.offsets()[b]) + t, h, c));
  CHECK(pool[(3 * page * H) * d] == -9.0f);  // page 3 is no one's: untouched
  // Sequence 0 has no page left for a 12th row (entry 3 is -1); nothing is written.
  ragged<float, H, d> more(std::vector<std::int32_t>{0, 2, 2}, {H, d});
  const std::vector<float> before = pool;
  CHECK_THROWS_WITH(append(paged_view<float, H, d>(pool.data(), {pages, page, H, d}, bt, lengths), more),
                    Catch::Contains("names page -1"));
  CHECK(pool == before);
}

TEST_CASE("a decode reads its pages in place: no copy of the cache", "[paged]") {
  const std::vector<std::size_t> m{4096, 3000};
  const std::size_t Hk = 2, d = 64;
  ref::rng rng(62);
  const cache<float> k(m, 16, Hk, d, rng), v(m, 16, Hk, d, rng);
  const auto K = k.view(), V = v.view();
  tensor<float, 2, 8, 1, d> Q;
  for (std::size_t x = 0; x < Q.size(); ++x) Q.data()[x] = static_cast<float>(rng.uniform(-1, 1));
  const auto e = softmax(causal(Q * transpose(K) / 8.0f)) * V;
  static_assert(detail::pages_in_place<decltype(e)>);
  tensor<float, 2, 8, 1, d> O;
  const long long before = detail::allocation_meter::begin();
  eval_into(O, e);
  const long long held = detail::allocation_meter::peak() - before;
  // The cache is 7096 · 2 · 64 floats (3.6 MB) for K and as much for V; the
  // decode parts hold a part's scores and each part's row of output.
  CHECK(held < 256 * 1024);
  CHECK(same_bits(O.matrix_at(1, 5), eval(softmax(causal(query(Q, 1) * transpose(dense(K, 1)) / 8.0f)) * dense(V, 1)).matrix_at(0, 5)));
  // The cost model counts each sequence's own keys.
  const auto alone = [&](std::size_t b) {
    return cost(softmax(causal(query(Q, b) * transpose(dense(K, b)) / 8.0f)) * dense(V, b));
  };
  CHECK(cost(e).flops == alone(0).flops + alone(1).flops);
  // Node by node, or a form that is not the dot product's, copies the pages first.
  static_assert(!detail::pages_in_place<decltype(softmax(similarity(Q, K, neg_sq_l2)) * V)>);
}
