// Partial results (parts/lse.hpp) and sinks, one thread: eval_with_lse
// against eval at T = 4096, d = 64, with and without causal (the log-sum-exp
// is kept by the kernel: the difference is a logarithm per row), and eval
// with a sink (softmax(S, sink): one more term that starts each row's
// maximum and sum) against eval without; and decoding 4 queries
// from a cache of 131072 keys, d = 128, whole against its two halves each
// with eval_with_lse, then merge.
//   cmake -S . -B build -DQKV_BUILD_BENCHMARKS=ON && cmake --build build -j2 --target qkv_lse_bench
//   build/bench/qkv_lse_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
//       --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>

#include <qkv/qkv.hpp>

#include <cstddef>
#include <random>

namespace {

using namespace qkv;
using mat = matrix<float, dyn, dyn>;

mat random(std::size_t r, std::size_t c, unsigned seed) {
  mat x(r, c);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (std::size_t k = 0; k < x.size(); ++k) x.data()[k] = u(gen);
  return x;
}

constexpr std::size_t T = 4096, d = 64;

enum class mode { eval, with_lse, sink };

template <bool causal_, mode how>
void prefill(benchmark::State& state) {
  set_threads(1);
  const mat Q = random(T, d, 1), K = random(T, d, 2), V = random(T, d, 3);
  const auto run = [&](const auto& e) {
    for (auto _ : state) {
      if constexpr (how == mode::with_lse) {
        auto r = eval_with_lse(e);
        benchmark::DoNotOptimize(r.second.data());
      } else {
        auto o = eval(e);
        benchmark::DoNotOptimize(o.data());
      }
    }
  };
  if constexpr (how == mode::sink) {
    if constexpr (causal_) run(softmax(causal(Q * transpose(K)) / 8.0f, 0.5f) * V);
    else run(softmax(Q * transpose(K) / 8.0f, 0.5f) * V);
  } else {
    if constexpr (causal_) run(softmax(causal(Q * transpose(K)) / 8.0f) * V);
    else run(softmax(Q * transpose(K) / 8.0f) * V);
  }
}

constexpr std::size_t n = 4, m = 131072, dv = 128;

void decode_whole(benchmark::State& state) {
  set_threads(1);
  const mat Q = random(n, dv, 4), K = random(m, dv, 5), V = random(m, dv, 6);
  for (auto _ : state) {
    auto o = eval(softmax(Q * transpose(K) / 11.0f) * V);
    benchmark::DoNotOptimize(o.data());
  }
}

void decode_halves_merged(benchmark::State& state) {
  set_threads(1);
  const mat Q = random(n, dv, 4), K = random(m, dv, 5), V = random(m, dv, 6);
  const std::size_t h = m / 2;
  const matrix_view<const float, dyn, dyn> K1(K.data(), h, dv), K2(K.data() + h * dv, m - h, dv);
  const matrix_view<const float, dyn, dyn> V1(V.data(), h, dv), V2(V.data() + h * dv, m - h, dv);
  for (auto _ : state) {
    const auto [O1, L1] = eval_with_lse(softmax(Q * transpose(K1) / 11.0f) * V1);
    const auto [O2, L2] = eval_with_lse(softmax(Q * transpose(K2) / 11.0f) * V2);
    auto r = merge(O1, L1, O2, L2);
    benchmark::DoNotOptimize(r.first.data());
  }
}

}  // namespace

BENCHMARK(prefill<false, mode::eval>)->Name("eval/T=4096/d=64/causal=0")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(prefill<false, mode::with_lse>)->Name("eval_with_lse/T=4096/d=64/causal=0")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(prefill<false, mode::sink>)->Name("eval_sink/T=4096/d=64/causal=0")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(prefill<true, mode::eval>)->Name("eval/T=4096/d=64/causal=1")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(prefill<true, mode::with_lse>)->Name("eval_with_lse/T=4096/d=64/causal=1")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(prefill<true, mode::sink>)->Name("eval_sink/T=4096/d=64/causal=1")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(decode_whole)->Name("decode_whole/n=4/m=131072/d=128")->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(decode_halves_merged)->Name("decode_halves_merged/n=4/m=131072/d=128")->Unit(benchmark::kMicrosecond)->UseRealTime();
