// Paged K/V caches: B = 16 sequences of lengths drawn from [1024, 16384] (a
// fixed seed), 32 query heads over 8 key/value heads of d = 128, a bf16
// pool, pages of 16 and of 128 tokens in shuffled order: a decode step over
// the pages against the same decode over contiguous caches (the sequences
// packed end to end), on one thread and on two. Then a mixed batch, 4
// prefill chunks of 512 queries and 28 decodes over paged caches in one
// call, against its two parts in two calls.
//
// Every cache, paged or contiguous, is in memory of one kind: 4 KiB pages,
// or (the ../huge cases) memory the kernel is asked to back with huge
// pages. Rows of one head are 2 KiB apart, so 4 KiB pages put a TLB miss on
// every second row, and page tables the shuffled pages scatter.
//   cmake -S . -B build -DQKV_BUILD_BENCHMARKS=ON && cmake --build build -j2 --target qkv_paged_bench
//   build/bench/qkv_paged_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <qkv/qkv.hpp>
#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <new>
#include <numeric>
#include <utility>
#include <random>
#include <vector>

#include <cstdlib>
#include <sys/mman.h>

namespace {

using namespace qkv;
constexpr std::size_t Hq = 32, Hkv = 8, D = 128;

// 64-byte aligned, as an engine allocates its pool: each row starts a cache
// line; with `huge`, 2 MiB aligned and advised to be backed by huge pages.
template <class T>
struct pool_allocator {
  using value_type = T;
  bool huge = false;
  pool_allocator() = default;
  explicit pool_allocator(bool h) : huge(h) {}
  template <class U>
  pool_allocator(const pool_allocator<U>& a) : huge(a.huge) {}
  T* allocate(std::size_t n) {
    const std::size_t align = huge ? std::size_t{2} << 20 : 64, bytes = (n * sizeof(T) + align - 1) / align * align;
    void* p = std::aligned_alloc(align, bytes);
    if (p == nullptr) throw std::bad_alloc();
    if (huge) madvise(p, bytes, MADV_HUGEPAGE);
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) { std::free(p); }
  template <class U>
  bool operator==(const pool_allocator<U>& a) const { return huge == a.huge; }
};
using memory = std::vector<bf16, pool_allocator<bf16>>;

// Sequences of the given lengths in pages of `page` tokens, and the same
// keys packed end to end.
struct caches {
  std::size_t page;
  std::vector<std::int32_t> lengths, table, offsets{0};
  std::size_t width = 1, pages = 0;
  memory k_pool, v_pool, k_flat, v_flat;
  ragged_view<const bf16, Hkv, D> k, v;

  caches(const std::vector<std::size_t>& lens, std::size_t page_size, unsigned seed, bool huge)
      : page(page_size), k_pool(pool_allocator<bf16>(huge)), v_pool(k_pool.get_allocator()), k_flat(k_pool.get_allocator()),
        v_flat(k_pool.get_allocator()), k(nullptr, std::vector<std::int32_t>{0}, {Hkv, D}), v(k) {
    for (std::size_t n : lens) {
      lengths.push_back(static_cast<std::int32_t>(n));
      offsets.push_back(offsets.back() + static_cast<std::int32_t>(n));
      width = std::max(width, (n + page - 1) / page);
      pages += (n + page - 1) / page;
    }
    std::vector<std::int32_t> order(pages);
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 gen(seed);
    std::shuffle(order.begin(), order.end(), gen);
    table.assign(lens.size() * width, -1);
    std::size_t next = 0;
    for (std::size_t b = 0; b < lens.size(); ++b)
      for (std::size_t x = 0; x < (lens[b] + page - 1) / page; ++x) table[b * width + x] = order[next++];
    k_flat.resize(static_cast<std::size_t>(offsets.back()) * Hkv * D), v_flat.resize(k_flat.size());
    std::uniform_real_distribution<float> u(-1, 1);
    for (std::size_t x = 0; x < k_flat.size(); ++x) k_flat[x] = bf16(u(gen)), v_flat[x] = bf16(u(gen));
    k = {k_flat.data(), offsets, {Hkv, D}}, v = {v_flat.data(), offsets, {Hkv, D}};
    k_pool.resize(pages * page * Hkv * D), v_pool.resize(k_pool.size());
    for (std::size_t b = 0; b < lens.size(); ++b)
      for (std::size_t t = 0; t < lens[b]; ++t)
        for (std::size_t h = 0; h < Hkv; ++h)
          for (std::size_t c = 0; c < D; ++c) {
            const std::size_t at = ((static_cast<std::size_t>(table[b * width + t / page]) * page + t % page) * Hkv + h) * D + c;
            k_pool[at] = k(static_cast<std::size_t>(offsets[b]) + t, h, c), v_pool[at] = v(static_cast<std::size_t>(offsets[b]) + t, h, c);
          }
  }
  paged_view<const bf16, Hkv, D> paged_k() const { return {k_pool.data(), {pages, page, Hkv, D}, {table.data(), lengths.size(), width}, lengths}; }
  paged_view<const bf16, Hkv, D> paged_v() const { return {v_pool.data(), {pages, page, Hkv, D}, {table.data(), lengths.size(), width}, lengths}; }
};

std::vector<std::size_t> draw(std::size_t count, std::size_t lo, std::size_t hi, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::size_t> len(lo, hi);
  std::vector<std::size_t> l(count);
  for (std::size_t& x : l) x = len(gen);
  return l;
}

// Made when first asked for: each is about 1.2 GB.
const caches& decode_caches(std::size_t page, bool huge) {
  static std::map<std::pair<std::size_t, bool>, std::unique_ptr<caches>> made;
  auto& c = made[{page, huge}];
  if (!c) c = std::make_unique<caches>(draw(16, 1024, 16384, 11), page, 1, huge);
  return *c;
}

struct threads_scope {
  std::size_t saved = threads();
  explicit threads_scope(std::size_t n) { set_threads(n); }
  ~threads_scope() { set_threads(saved); }
};

template <class Q>
void fill(Q& q) {
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> u(-1, 1);
  for (std::size_t x = 0; x < q.size(); ++x) q.data()[x] = u(gen);
}

void bytes(benchmark::State& state, const caches& c) {
  state.counters["GB/s"] = benchmark::Counter(double(2 * c.k.size() * sizeof(bf16)), benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}

void paged_decode(benchmark::State& state) {
  const caches& c = decode_caches(static_cast<std::size_t>(state.range(0)), state.range(2) != 0);
  tensor<float, 16, Hq, 1, D> q, o;
  fill(q);
  const auto K = c.paged_k(), V = c.paged_v();
  threads_scope scope(static_cast<std::size_t>(state.range(1)));
  for (auto _ : state) {
    eval_into(o, softmax(causal(q * transpose(K) / sqrt(dim<D>))) * V);
    benchmark::DoNotOptimize(o.data());
  }
  bytes(state, c);
}

void contiguous_decode(benchmark::State& state) {
  const caches& c = decode_caches(16, state.range(1) != 0);
  std::vector<std::int32_t> one(17);
  std::iota(one.begin(), one.end(), 0);
  ragged<float, Hq, D> q(one, {Hq, D}), o(one, {Hq, D});
  fill(q);
  threads_scope scope(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) {
    eval_into(o, softmax(causal(q * transpose(c.k) / sqrt(dim<D>))) * c.v);
    benchmark::DoNotOptimize(o.data());
  }
  bytes(state, c);
}

// 4 prompts of 2048 tokens whose last 512 are this step's chunk, and 28
// sequences of [1024, 4096] tokens decoding one.
struct mixed {
  std::vector<std::size_t> lens;
  caches c;
  std::vector<std::int32_t> q_offsets{0};
  ragged<float, Hq, D> q, o;
  mixed() : lens(lengths()), c(lens, 16, 2, false) {
    for (std::size_t b = 0; b < 32; ++b) q_offsets.push_back(q_offsets.back() + (b < 4 ? 512 : 1));
    q = o = ragged<float, Hq, D>(q_offsets, {Hq, D});
    fill(q);
  }
  static std::vector<std::size_t> lengths() {
    std::vector<std::size_t> l(4, 2048);
    const auto rest = draw(28, 1024, 4096, 13);
    l.insert(l.end(), rest.begin(), rest.end());
    return l;
  }
  // Sequences [first, last) alone: their queries, pages and lengths.
  struct part {
    std::vector<std::int32_t> q_offsets{0}, lengths;
    ragged<float, Hq, D> q, o;
    const mixed* m;
    std::size_t first;
    part(const mixed& whole, std::size_t f, std::size_t l) : m(&whole), first(f) {
      for (std::size_t b = f; b < l; ++b) {
        q_offsets.push_back(q_offsets.back() + static_cast<std::int32_t>(whole.q.length(b)));
        lengths.push_back(whole.c.lengths[b]);
      }
      q = o = ragged<float, Hq, D>(q_offsets, {Hq, D});
      fill(q);
    }
    template <class Pool>
    paged_view<const bf16, Hkv, D> view(const Pool& pool) const {
      return {pool.data(), {m->c.pages, m->c.page, Hkv, D}, {m->c.table.data() + first * m->c.width, lengths.size(), m->c.width}, lengths};
    }
    void run() {
      eval_into(o, softmax(causal(q * transpose(view(m->c.k_pool)) / sqrt(dim<D>))) * view(m->c.v_pool));
    }
  };
};

const mixed& the_mix() {
  static const mixed m;
  return m;
}

void mixed_batch(benchmark::State& state) {
  const mixed& m = the_mix();
  ragged<float, Hq, D> o = m.o;
  const auto K = m.c.paged_k(), V = m.c.paged_v();
  threads_scope scope(1);
  for (auto _ : state) {
    eval_into(o, softmax(causal(m.q * transpose(K) / sqrt(dim<D>))) * V);
    benchmark::DoNotOptimize(o.data());
  }
}

void mixed_parts(benchmark::State& state) {
  const mixed& m = the_mix();
  mixed::part prefill(m, 0, 4), decode(m, 4, 32);
  threads_scope scope(1);
  for (auto _ : state) {
    prefill.run();
    decode.run();
    benchmark::DoNotOptimize(prefill.o.data());
  }
}

// Arguments: the page size, the threads, huge pages (1) or not (0).
BENCHMARK(paged_decode)
    ->ArgsProduct({{16, 128}, {1, 2}, {0, 1}})
    ->ArgNames({"page", "threads", "huge"})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(contiguous_decode)->ArgsProduct({{1, 2}, {0, 1}})->ArgNames({"threads", "huge"})->Unit(benchmark::kMillisecond);
BENCHMARK(mixed_batch)->Unit(benchmark::kMillisecond);
BENCHMARK(mixed_parts)->Unit(benchmark::kMillisecond);

}  // namespace
