// The batched fused attention kernel: a batch gives, bit for bit, what its
// problems give one by one, whatever the number of threads; grouped-query
// heads share one K and V; decoding split over parts of the keys is as
// accurate as the naive evaluation and keeps the masked-row and NaN rules.
#include <catch2/catch.hpp>

#include "support.hpp"

#include <qkv/qkv.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

using namespace qkv;

namespace {

template <class T>
using dense = matrix<T, dyn, dyn>;

template <class T>
kernels::strided<const T> view(const dense<T>& x) {
  return {x.data(), x.rows(), x.cols(), static_cast<std::ptrdiff_t>(x.cols()), 1};
}

template <class T>
kernels::strided<T> output(dense<T>& x) {
  return {x.data(), x.rows(), x.cols(), static_cast<std::ptrdiff_t>(x.cols()), 1};
}

// A query head: its queries, output, and optionally a bias and a mask.
template <class T>
struct head {
  dense<T> q, out, bias;
  dense<bool> mask;
  bool causal = false;
};

// A key/value head, read by one or more query heads.
template <class T>
struct kv_head {
  dense<T> k, v;
};

template <class T>
kernels::attention_problem<T> problem_of(head<T>& h, const kv_head<T>& kv) {
  kernels::attention_problem<T> p;
  p.q = view(h.q);
  p.k = view(kv.k);
  p.v = view(kv.v);
  p.out = output(h.out);
  p.scale = T(1) / std::sqrt(T(h.q.cols() == 0 ? 1 : h.q.cols()));
  p.bounds.causal = h.causal;
  if (h.bias.rows() != 0) p.bias = view(h.bias);
  if (h.mask.rows() != 0) p.mask = view(h.mask);
  return p;
}

// The outputs of a batch computed through the batch entry, and through the
// single entry one problem at a time.
template <class T>
std::vector<dense<T>> through_batch(std::vector<kernels::attention_problem<T>> problems) {
  std::vector<dense<T>> outs;
  for (auto& p : problems) {
    outs.emplace_back(p.out.rows, p.out.cols);
    p.out = output(outs.back());
  }
  kernels::attention(problems.data(), problems.size());
  return outs;
}

template <class T>
std::vector<dense<T>> one_by_one(std::vector<kernels::attention_problem<T>> problems) {
  std::vector<dense<T>> outs;
  for (auto& p : problems) {
    outs.emplace_back(p.out.rows, p.out.cols);
    p.out = output(outs.back());
    kernels::attention(p);
  }
  return outs;
}

// Batch and single entry, on 1, 2 and 3 threads: all bit-identical.
template <class T>
void check_bit_identical(const std::vector<kernels::attention_problem<T>>& problems) {
  test::threads_guard guard;
  set_threads(1);
  const auto want = one_by_one(problems);
  for (std::size_t t : {1, 2, 3}) {
    set_threads(t);
    const auto batched = through_batch(problems);
    const auto single = one_by_one(problems);
    for (std::size_t i = 0; i < problems.size(); ++i) {
      INFO("threads = " << t << ", problem " << i);
      CHECK(test::same_bits(batched[i], want[i]));
      CHECK(test::same_bits(single[i], want[i]));
    }
  }
}

}  // namespace

TEST_CASE("a batch of heads equals its problems one by one bit for bit on 1 2 and 3 threads", "[batch][threads]") {
  // Grouped-query (6 query heads on 2 key/value heads), multi-query (5 on 1)
  // and multi-head (8 on 8: at least two groups per thread, so each thread
  // takes whole groups); decoding (n ≤ 4) with one part or several.
  const auto [hq, hkv] = GENERATE(table<std::size_t, std::size_t>({{6, 2}, {5, 1}, {8, 8}}));
  const auto [n, m, d] = GENERATE(table<std::size_t, std::size_t, std::size_t>({
      {1, 5000, 64}, {3, 3000, 17}, {1, 500, 17}, {3, 1, 64}, {70, 500, 64}, {200, 1, 17}, {70, 3000, 17},
      {200, 500, 64},
  }));
  INFO(hq << " query heads on " << hkv << ", n = " << n << ", m = " << m << ", d = " << d);
  ref::rng rng(std::uint32_t(n * 31 + m + d));
  std::vector<kv_head<float>> kvs(hkv);
  for (auto& kv : kvs) {
    kv.k = dense<float>(m, d);
    kv.v = dense<float>(m, d);
    rng.fill(kv.k, -2, 2);
    rng.fill(kv.v);
  }
  std::vector<head<float>> heads(hq);
  for (std::size_t h = 0; h < hq; ++h) {
    head<float>& x = heads[h];
    x.q = dense<float>(n, d);
    x.out = dense<float>(n, d);
    rng.fill(x.q, -2, 2);
    x.causal = h % 2 == 1;
    if (h % 3 == 2) {
      x.mask = dense<bool>(n, m);
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < m; ++j) x.mask(i, j) = rng.coin(0.6);
    }
    if (h >= 3) {
      x.bias = dense<float>(n, m);
      rng.fill(x.bias, -2, 2);
    }
  }
  std::vector<kernels::attention_problem<float>> problems;
  for (std::size_t h = 0; h < hq; ++h) problems.push_back(problem_of(heads[h], kvs[h * hkv / hq]));
  check_bit_identical(problems);
}

TEST_CASE("a mixed batch: decodes and query blocks on one K and V and empty problems", "[batch]") {
  ref::rng rng(77);
  auto kv_of = [&](std::size_t m, std::size_t dk, std::size_t dv) {
    kv_head<double> kv{dense<double>(m, dk), dense<double>(m, dv)};
    rng.fill(kv.k);
    rng.fill(kv.v);
    return kv;
  };
  auto head_of = [&](std::size_t n, std::size_t dk, std::size_t dv, bool causal) {
    head<double> h{dense<double>(n, dk), dense<double>(n, dv), {}, {}, causal};
    rng.fill(h.q);
    return h;
  };
  const kv_head<double> shared = kv_of(2100, 33, 40), other = kv_of(2100, 33, 40), no_keys = kv_of(0, 8, 8),
                        no_width = kv_of(50, 8, 0);
  struct row {
    std::size_t n, dk, dv;
    bool causal;
    const kv_head<double>* kv;
  };
  // A group on `shared` of decodes, query blocks and an empty problem; no
  // keys; zero-width values; `shared` again.
  const row rows[] = {{1, 33, 40, false, &shared}, {70, 33, 40, true, &shared}, {4, 33, 40, true, &shared},
                      {0, 33, 40, false, &shared}, {5, 33, 40, false, &shared}, {3, 8, 8, false, &no_keys},
                      {70, 8, 8, true, &no_keys},  {6, 8, 0, false, &no_width}, {2, 33, 40, false, &shared},
                      {70, 33, 40, false, &shared}, {70, 33, 40, false, &shared}, {70, 33, 40, true, &shared}};
  std::vector<head<double>> heads;
  for (const row& r : rows) heads.push_back(head_of(r.n, r.dk, r.dv, r.causal));
  std::vector<kernels::attention_problem<double>> problems;
  for (std::size_t h = 0; h < heads.size(); ++h) problems.push_back(problem_of(heads[h], *rows[h].kv));
  // After problems on `shared`, two that must not join their group (or read
  // its packing): the same K with other values, and the first 1000 keys and
  // values of the same memory.
  problems[10].v = view(other.v);
  problems[11].k.rows = problems[11].v.rows = 1000;
  check_bit_identical(problems);

  const auto outs = through_batch(problems);
  for (std::size_t h : {5, 6}) {  // no keys: as fully masked rows
    for (std::size_t i = 0; i < outs[h].rows(); ++i)
      for (std::size_t l = 0; l < outs[h].cols(); ++l) CHECK(outs[h](i, l) == 0.0);
  }
}

namespace {

enum class variant { plain, causal, mask, bias, bias_causal };

const char* name(variant v) {
  const char* names[] = {"plain", "causal", "mask", "bias", "bias + causal"};
  return names[int(v)];
}

// A decode (n ≤ 4 queries) over m keys, through the kernel, held to the
// reference as tests/attention_test.cpp holds the fused evaluation: within
// attention_bound, and its error at most twice the naive evaluation's (with
// a floor of 8 units of roundoff of the largest output); bit-identical on 1,
// 2 and 3 threads.
template <class T>
void check_decode(std::size_t n, std::size_t m, std::size_t dk, std::size_t dv, variant var, std::uint32_t seed) {
  test::threads_guard guard;
  ref::rng rng(seed);
  dense<T> Q(n, dk), K(m, dk), V(m, dv), B(n, m);
  rng.fill(Q, -2, 2);
  rng.fill(K, -2, 2);
  rng.fill(V);
  rng.fill(B, -2, 2);
  dense<bool> M(n, m);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) M(i, j) = rng.coin(0.7);
  const bool has_bias = var == variant::bias || var == variant::bias_causal;
  const bool is_causal = var == variant::causal || var == variant::bias_causal;

  head<T> h{Q, dense<T>(n, dv), {}, {}, is_causal};
  if (has_bias) h.bias = B;
  if (var == variant::mask) h.mask = M;
  const kv_head<T> kv{K, V};
  const kernels::attention_problem<T> p = problem_of(h, kv);

  const auto q = ref::from(Q), k = ref::from(K), v = ref::from(V), b = ref::from(B);
  const ref::real rscale = static_cast<ref::real>(p.scale);
  ref::mat s = ref::scale(ref::matmul(q, ref::transpose(k)), rscale);
  if (has_bias)
    for (std::size_t x = 0; x < s.v.size(); ++x) s.v[x] += b.v[x];
  if (is_causal) s = ref::causal(s);
  if (var == variant::mask) s = ref::masked(s, M);
  const ref::mat w = ref::softmax(s);
  const ref::mat want = ref::matmul(w, v);
  const ref::mat bound = ref::attention_bound<T>(q, k, v, rscale, s, w);

  const T sc = p.scale;
  dense<T> got_naive;
  switch (var) {
    case variant::plain: got_naive = eval(softmax(Q * transpose(K) * sc) * V, naive); break;
    case variant::causal: got_naive = eval(softmax(causal(Q * transpose(K) * sc)) * V, naive); break;
    case variant::mask: got_naive = eval(softmax(masked(Q * transpose(K) * sc, M)) * V, naive); break;
    case variant::bias: got_naive = eval(softmax(Q * transpose(K) * sc + B) * V, naive); break;
    case variant::bias_causal: got_naive = eval(softmax(causal(Q * transpose(K) * sc + B)) * V, naive); break;
  }
  set_threads(1);
  const dense<T> got = through_batch(std::vector{p})[0];

  INFO("n = " << n << ", m = " << m << ", dk = " << dk << ", dv = " << dv << ", " << name(var) << ", "
              << (sizeof(T) == 4 ? "float" : "double") << ", kernels " << active_arch());
  CHECK(ref::worst_ratio(got_naive, want, bound) <= 1);
  CHECK(ref::worst_ratio(got, want, bound) <= 1);
  const ref::real floor = 8 * ref::unit_roundoff<T> * ref::max_abs(want);
  CHECK(ref::max_error(got, want) <= 2 * std::fmax(ref::max_error(got_naive, want), floor));
  for (std::size_t t : {2, 3}) {
    set_threads(t);
    CHECK(test::same_bits(through_batch(std::vector{p})[0], got));
  }
}

}  // namespace

TEST_CASE("decoding split over parts of the keys matches the reference", "[batch][decode]") {
  // m = 5000: five parts of 1024 keys, the last one short (emulated: three,
  // the last one short, as much of a test at half the cost); dv = 19
  // leaves columns to the element-by-element loop.
  const auto [n, dk, dv] =
      GENERATE(table<std::size_t, std::size_t, std::size_t>({{1, 64, 64}, {3, 64, 19}, {4, 17, 40}}));
  const std::size_t m = test::emulated() ? 2100 : 5000;
  for (variant var : {variant::plain, variant::causal, variant::mask, variant::bias, variant::bias_causal}) {
    check_decode<float>(n, m, dk, dv, var, std::uint32_t(n * 13 + dv));
    check_decode<double>(n, m, dk, dv, var, std::uint32_t(n * 17 + dv));
  }
}

TEST_CASE("split decoding: a fully masked row gives zeros and NaN poisons only its row", "[batch][decode]") {
  test::threads_guard guard;
  constexpr std::size_t n = 4, m = 5000, d = 32;
  ref::rng rng(91);
  dense<float> Q(n, d), K(m, d), V(m, d), B(n, m);
  rng.fill(Q);
  rng.fill(K);
  rng.fill(V);
  rng.fill(B);
  dense<bool> M(n, m);
  for (std::size_t j = 0; j < m; ++j) {
    M(0, j) = false;                     // row 0: nothing visible
    M(1, j) = true;                      // row 1: a NaN query
    M(2, j) = j >= 2100 && j < 2200;     // row 2: keys of one part only, the others empty
    M(3, j) = true;                      // row 3: a NaN bias on a key of the last part
  }
  Q(1, 7) = std::numeric_limits<float>::quiet_NaN();
  B(3, 4500) = std::numeric_limits<float>::quiet_NaN();

  head<float> h{Q, dense<float>(n, d), B, M, false};
  const kv_head<float> kv{K, V};
  const kernels::attention_problem<float> p = problem_of(h, kv);
  set_threads(1);
  const dense<float> got = through_batch(std::vector{p})[0];
  for (std::size_t l = 0; l < d; ++l) {
    CHECK(got(0, l) == 0.0f);
    CHECK(std::isnan(got(1, l)));
    CHECK(std::isfinite(got(2, l)));
    CHECK(std::isnan(got(3, l)));
  }
  // Row 2 against the reference (each row of it depends on its own query only).
  const auto q = ref::from(Q), k = ref::from(K), v = ref::from(V), b = ref::from(B);
  const ref::real rscale = static_cast<ref::real>(p.scale);
  ref::mat s = ref::scale(ref::matmul(q, ref::transpose(k)), rscale);
  for (std::size_t x = 0; x < s.v.size(); ++x) s.v[x] += b.v[x];
  s = ref::masked(s, M);
  const ref::mat w = ref::softmax(s);
  const ref::mat want = ref::matmul(w, v);
  const ref::mat bound = ref::attention_bound<float>(q, k, v, rscale, s, w);
  for (std::size_t l = 0; l < d; ++l)
    CHECK(std::fabs(static_cast<ref::real>(got(2, l)) - want(2, l)) <= bound(2, l));
  for (std::size_t t : {2, 3}) {
    set_threads(t);
    CHECK(test::same_bits(through_batch(std::vector{p})[0], got));
  }
}

// The row maximum the kernel keeps (row_stats, what the backward and the
// log-sum-exp rest on) is the largest visible score. The keys a row may not
// see score higher than every key it sees, so a maximum taken over hidden
// scores (from the tile's registers before the mask, say) is off by far
// more than the scores' rounding.
template <class S>
void check_visible_maximum(std::size_t n, std::size_t m, bool by_mask) {
  const std::size_t dk = 16, dv = 8;
  std::vector<float> q(n * dk, 1.0f), out(n * dv), stats(2 * n);
  std::vector<S> k(m * dk), v(m * dv, S(1.0f));
  for (std::size_t j = 0; j < m; ++j)
    for (std::size_t c = 0; c < dk; ++c) k[j * dk + c] = S(4.0f * float(j + 1) / float(m));
  const std::unique_ptr<bool[]> keep(new bool[n * m]);
  const std::size_t shift = m - n;  // causal's alignment: row i sees keys j ≤ i + shift
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) keep[i * m + j] = j < i + shift;  // the mask hides the diagonal too
  kernels::attention_problem<float, S> p;
  p.q = {q.data(), n, dk, std::ptrdiff_t(dk), 1};
  p.k = {k.data(), m, dk, std::ptrdiff_t(dk), 1};
  p.v = {v.data(), m, dv, std::ptrdiff_t(dv), 1};
  p.out = {out.data(), n, dv, std::ptrdiff_t(dv), 1};
  p.scale = 0.25f;
  p.row_stats = stats.data();
  p.queries_in_storage_type = !std::is_same_v<S, float>;  // Q's ones are bf16 values: the pair kernel
  if (by_mask) p.mask = {keep.get(), n, m, std::ptrdiff_t(m), 1};
  else p.bounds.causal = true;
  kernels::attention(&p, 1);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t last = by_mask ? i + shift : i + shift + 1;  // keys [0, last) visible
    INFO("n = " << n << ", m = " << m << (by_mask ? ", mask" : ", causal") << ", row " << i << ", kernels "
                << active_arch());
    if (last == 0) {
      CHECK(stats[2 * i] == -std::numeric_limits<float>::infinity());
      CHECK(stats[2 * i + 1] == 0.0f);
      continue;
    }
    // 16 equal products summed: within 16 roundings of the exact score;
    // the next key's score is larger by 16·4/m·0.25 = 16/m, far more.
    const double exact = 0.25 * 16.0 * double(float(k[(last - 1) * dk]));
    CHECK(std::abs(stats[2 * i] - exact) <= 16 * 6e-8 * exact);
  }
}

TEST_CASE("the kept row maximum is the largest visible score, under causal and masks", "[attention][mask]") {
  for (const auto& [n, m] : {std::pair<std::size_t, std::size_t>{70, 70}, {70, 300}, {300, 300}}) {
    for (bool by_mask : {false, true}) {
      check_visible_maximum<float>(n, m, by_mask);
      check_visible_maximum<bf16>(n, m, by_mask);
    }
  }
}
