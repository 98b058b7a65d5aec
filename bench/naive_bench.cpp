// The naive strategy's speed: the matrix product kernel alone, and whole
// attention evaluated node by node (the baseline the fused path must beat).
//   cmake -S . -B build -DQKV_BUILD_BENCHMARKS=ON && cmake --build build -j2
//   build/bench/qkv_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <qkv/qkv.hpp>

#include <cstddef>
#include <random>

namespace {

using namespace qkv;

template <class M>
void fill(M& m, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (std::size_t i = 0; i < m.rows(); ++i)
    for (std::size_t j = 0; j < m.cols(); ++j) m(i, j) = u(gen);
}

void gemm(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  matrix<float, dyn, dyn> A(n, n), B(n, n), C(n, n);
  fill(A, 1);
  fill(B, 2);
  for (auto _ : state) {
    eval_into(C, A * B);
    benchmark::DoNotOptimize(C.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(n) * double(n) * double(n), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.SetLabel(active_arch());
}
BENCHMARK(gemm)->Arg(64)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

// softmax(Q Kᵀ / √d) V with n = m = T, d = range(1); causal if range(2).
void naive_attention(benchmark::State& state) {
  const auto T = static_cast<std::size_t>(state.range(0));
  const auto d = static_cast<std::size_t>(state.range(1));
  const bool is_causal = state.range(2) != 0;
  const auto n = static_cast<std::size_t>(state.range(3)) == 0 ? T : static_cast<std::size_t>(state.range(3));
  matrix<float, dyn, dyn> Q(n, d), K(T, d), V(T, d), O(n, d);
  fill(Q, 1);
  fill(K, 2);
  fill(V, 3);
  const float scale = qkv::sqrt(float(d));
  for (auto _ : state) {
    if (is_causal) {
      eval_into(O, softmax(causal(Q * transpose(K) / scale)) * V, naive);
    } else {
      eval_into(O, softmax(Q * transpose(K) / scale) * V, naive);
    }
    benchmark::DoNotOptimize(O.data());
  }
  // 4·n·m·d: two products of 2·n·m·d each (all of them computed, causal or not).
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * double(n) * double(T) * double(d), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.counters["score_MiB"] = double(n * T * sizeof(float)) / (1 << 20);
  state.SetLabel(active_arch());
}
BENCHMARK(naive_attention)
    ->ArgNames({"T", "d", "causal", "n"})
    ->Args({256, 64, 0, 0})
    ->Args({1024, 64, 0, 0})
    ->Args({4096, 64, 0, 0})
    ->Args({1024, 128, 0, 0})
    ->Args({1024, 64, 1, 0})
    ->Args({4096, 64, 0, 1})
    ->Unit(benchmark::kMillisecond);

}  // namespace
