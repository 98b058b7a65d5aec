// Ragged batches: B = 8 sequences of lengths drawn from [64, 2048] (a fixed
// seed), H = 8 heads of d = 64, causal, one thread. The ragged call against
// the same sequences one call each (tensor views of the same packed
// memory), and against the batch padded to its longest sequence with a
// length mask; the backward against per-sequence backward calls.
//   cmake -S . -B build -DQKV_BUILD_BENCHMARKS=ON && cmake --build build -j2 --target qkv_ragged_bench
//   build/bench/qkv_ragged_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <qkv/qkv.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace {

using namespace qkv;
constexpr std::size_t B = 8, H = 8, D = 64;

struct batch {
  std::vector<std::size_t> lengths;
  std::vector<std::int32_t> offsets{0};
  ragged<float, H, D> q, k, v, o, d_o;

  batch() {
    std::mt19937 gen(7);
    std::uniform_int_distribution<std::size_t> len(64, 2048);
    for (std::size_t b = 0; b < B; ++b) {
      lengths.push_back(len(gen));
      offsets.push_back(offsets.back() + static_cast<std::int32_t>(lengths.back()));
    }
    q = k = v = o = d_o = ragged<float, H, D>(offsets, {H, D});
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto* r : {&q, &k, &v, &d_o})
      for (std::size_t x = 0; x < r->size(); ++x) r->data()[x] = u(gen);
  }
  std::size_t longest() const { return *std::max_element(lengths.begin(), lengths.end()); }
  double pairs() const {
    double p = 0;
    for (std::size_t n : lengths) p += double(n) * double(n + 1) / 2;
    return p * H;
  }
  // Sequence b of r as a [1, H, n, D] tensor view of the packed memory.
  template <class T>
  tensor_view<T, 1, H, dyn, D> sequence(T* data, std::size_t b) const {
    const std::size_t t0 = static_cast<std::size_t>(offsets[b]);
    return {data + t0 * H * D, {1, H, lengths[b], D}, {lengths[b] * H * D, D, H * D, 1}};
  }
};

const batch& the_batch() {
  static const batch b;
  return b;
}

struct one_thread {
  std::size_t saved = threads();
  one_thread() { set_threads(1); }
  ~one_thread() { set_threads(saved); }
};

void flops(benchmark::State& state, double pairs) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * double(D) * pairs, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void ragged_prefill(benchmark::State& state) {
  const batch& x = the_batch();
  ragged<float, H, D> o = x.o;
  one_thread scope;
  for (auto _ : state) {
    eval_into(o, softmax(causal(x.q * transpose(x.k) / 8.0f)) * x.v);
    benchmark::DoNotOptimize(o.data());
  }
  flops(state, x.pairs());
}

void per_sequence_prefill(benchmark::State& state) {
  const batch& x = the_batch();
  ragged<float, H, D> o = x.o;
  one_thread scope;
  for (auto _ : state) {
    for (std::size_t b = 0; b < B; ++b) {
      const auto q = x.sequence(x.q.data(), b), k = x.sequence(x.k.data(), b), v = x.sequence(x.v.data(), b);
      eval_into(x.sequence(o.data(), b), softmax(causal(q * transpose(k) / 8.0f)) * v);
    }
    benchmark::DoNotOptimize(o.data());
  }
  flops(state, x.pairs());
}

// Key j of sequence b is padding past its length; a block hint skips the
// blocks of padding keys.
struct length_mask {
  const std::vector<std::size_t>* len;
  bool operator()(std::size_t b, std::size_t, std::size_t, std::size_t j) const { return j < (*len)[b]; }
  bool any(std::size_t b, std::size_t, std::size_t, std::size_t, std::size_t j0, std::size_t) const { return j0 < (*len)[b]; }
};

void padded_prefill(benchmark::State& state) {
  const batch& x = the_batch();
  const std::size_t n = x.longest();
  tensor<float, B, H, dyn, D> q(n), k(n), v(n), o(n);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t i = 0; i < x.lengths[b]; ++i)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t c = 0; c < D; ++c) {
          const std::size_t t = static_cast<std::size_t>(x.offsets[b]) + i;
          q(b, h, i, c) = x.q(t, h, c), k(b, h, i, c) = x.k(t, h, c), v(b, h, i, c) = x.v(t, h, c);
        }
  one_thread scope;
  for (auto _ : state) {
    eval_into(o, softmax(masked(causal(q * transpose(k) / 8.0f), length_mask{&x.lengths})) * v);
    benchmark::DoNotOptimize(o.data());
  }
  flops(state, x.pairs());  // the useful work, as the others
}

void ragged_backward(benchmark::State& state) {
  const batch& x = the_batch();
  one_thread scope;
  for (auto _ : state) {
    auto g = gradient(softmax(causal(x.q * transpose(x.k) / 8.0f)) * x.v, x.d_o, wrt(x.q, x.k, x.v));
    benchmark::DoNotOptimize(std::get<0>(g).data());
  }
}

void per_sequence_backward(benchmark::State& state) {
  const batch& x = the_batch();
  one_thread scope;
  for (auto _ : state) {
    for (std::size_t b = 0; b < B; ++b) {
      const auto q = x.sequence(x.q.data(), b), k = x.sequence(x.k.data(), b), v = x.sequence(x.v.data(), b);
      auto g = gradient(softmax(causal(q * transpose(k) / 8.0f)) * v, x.sequence(x.d_o.data(), b), wrt(q, k, v));
      benchmark::DoNotOptimize(std::get<0>(g).data());
    }
  }
}

BENCHMARK(ragged_prefill)->Unit(benchmark::kMillisecond);
BENCHMARK(per_sequence_prefill)->Unit(benchmark::kMillisecond);
BENCHMARK(padded_prefill)->Unit(benchmark::kMillisecond);
BENCHMARK(ragged_backward)->Unit(benchmark::kMillisecond);
BENCHMARK(per_sequence_backward)->Unit(benchmark::kMillisecond);

}  // namespace
