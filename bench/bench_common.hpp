// What every attention benchmark shares: the problem sizes, the inputs, and
// the counters (FLOPs counted as 4·d per visible query-key pair, so a causal
// run is credited only with the work it must do).
#pragma once

#include <benchmark/benchmark.h>

#include <qkv/qkv.hpp>

#include <cstddef>
#include <random>
#include <string>
#include <vector>

namespace bench {

struct config {
  std::size_t n, m, d;
  bool causal;
  std::string name() const {
    return "n=" + std::to_string(n) + "/m=" + std::to_string(m) + "/d=" + std::to_string(d) +
           "/causal=" + std::to_string(int(causal));
  }
};

// Self-attention at T ∈ {256, 1024, 4096, 8192}, d ∈ {64, 128}, with and
// without the causal mask; d = 32 and 256 up to T = 4096; and decoding, one
// query against 4096 keys.
inline std::vector<config> configs() {
  std::vector<config> c;
  for (std::size_t d : {32, 64, 128, 256})
    for (bool causal : {false, true})
      for (std::size_t t : {256, 1024, 4096, 8192})
        if (t < 8192 || d == 64 || d == 128) c.push_back({t, t, d, causal});
  for (std::size_t d : {64, 128}) c.push_back({1, 4096, d, false});
  return c;
}

inline double visible_pairs(const config& c) {
  if (!c.causal) return double(c.n) * double(c.m);
  double pairs = 0;  // row i sees keys j ≤ i + (m − n)
  for (std::size_t i = 0; i < c.n; ++i) pairs += double(std::min(c.m, i + c.m - c.n + 1));
  return pairs;
}

struct inputs {
  qkv::matrix<float, qkv::dyn, qkv::dyn> Q, K, V, O;
  explicit inputs(const config& c) : Q(c.n, c.d), K(c.m, c.d), V(c.m, c.d), O(c.n, c.d) {
    std::mt19937 gen(42);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto* x : {&Q, &K, &V})
      for (std::size_t k = 0; k < x->size(); ++k) x->data()[k] = u(gen);
  }
};

inline void set_counters(benchmark::State& state, const config& c) {
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * double(c.d) * visible_pairs(c),
                                                 benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
  // Bytes that must cross memory at least once: Q, K, V read, O written.
  state.counters["bytes"] = double((2 * c.n + 2 * c.m) * c.d * sizeof(float));
}

// Registers fn(state, config) once per configuration as "impl/config".
template <class F>
void register_all(const std::string& impl, F fn) {
  for (const config& c : configs()) {
    benchmark::RegisterBenchmark((impl + "/" + c.name()).c_str(), [fn, c](benchmark::State& s) { fn(s, c); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
}

}  // namespace bench
