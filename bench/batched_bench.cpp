// Batched and multi-head attention: scaling over threads, per-head
// throughput against one head alone, decoding against the time to read K and
// V from memory, and the lecture's self-test (e) configuration.
//   cmake -S . -B build -DQKV_BUILD_BENCHMARKS=ON && cmake --build build -j2 --target qkv_batched_bench
//   build/bench/qkv_batched_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <qkv/qkv.hpp>

#include "kv_read_floor.hpp"

#include <cstddef>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace qkv;
using heads_t = tensor<float, dyn, dyn, dyn, dyn>;

heads_t random_heads(std::size_t b, std::size_t h, std::size_t t, std::size_t d, unsigned seed) {
  heads_t x(b, h, t, d);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (std::size_t k = 0; k < x.size(); ++k) x.data()[k] = u(gen);
  return x;
}

struct threads_scope {
  std::size_t saved = threads();
  explicit threads_scope(std::size_t n) { set_threads(n); }
  ~threads_scope() { set_threads(saved); }
};

void flops_counter(benchmark::State& state, double pairs, std::size_t d) {
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * double(d) * pairs, benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}

// softmax(Q Kᵀ / √d) V over B × H heads (H / Hkv query heads per key head).
void heads(benchmark::State& state, std::size_t B, std::size_t H, std::size_t Hkv, std::size_t n, std::size_t m,
           std::size_t d, bool is_causal, std::size_t t) {
  const heads_t Q = random_heads(B, H, n, d, 1), K = random_heads(B, Hkv, m, d, 2), V = random_heads(B, Hkv, m, d, 3);
  heads_t O(B, H, n, d);
  threads_scope scope(t);
  const float dk = float(d);
  for (auto _ : state) {
    if (is_causal) eval_into(O, softmax(causal(Q * transpose(K) / sqrt(dk))) * V);
    else eval_into(O, softmax(Q * transpose(K) / sqrt(dk)) * V);
    benchmark::DoNotOptimize(O.data());
  }
  const double pairs = is_causal ? double(n) * double(n + 1) / 2 : double(n) * double(m);
  flops_counter(state, double(B * H) * pairs, d);
  state.counters["bytes"] = double(B * (2 * H * n + 2 * Hkv * m) * d * sizeof(float));
}

// One head, as a matrix: the single-head figure per-head throughput is compared with.
void single(benchmark::State& state, std::size_t n, std::size_t d, bool is_causal, std::size_t t) {
  const heads_t q = random_heads(1, 1, n, d, 1), k = random_heads(1, 1, n, d, 2), v = random_heads(1, 1, n, d, 3);
  const auto Q = q.matrix_at(0, 0), K = k.matrix_at(0, 0), V = v.matrix_at(0, 0);
  matrix<float, dyn, dyn> O(n, d);
  threads_scope scope(t);
  const float dk = float(d);
  for (auto _ : state) {
    if (is_causal) eval_into(O, softmax(causal(Q * transpose(K) / sqrt(dk))) * V);
    else eval_into(O, softmax(Q * transpose(K) / sqrt(dk)) * V);
    benchmark::DoNotOptimize(O.data());
  }
  flops_counter(state, is_causal ? double(n) * double(n + 1) / 2 : double(n) * double(n), d);
}

// The memory-read floor of decoding: every float of K and V read once (summed).
void read_kv(benchmark::State& state, std::size_t H, std::size_t m, std::size_t d, std::size_t t) {
  const heads_t K = random_heads(1, H, m, d, 2), V = random_heads(1, H, m, d, 3);
  threads_scope scope(t);
  // The pool is not public: two halves on two std::threads when t = 2.
  auto sum = [](const float* p, std::size_t count) {
    float acc[16] = {};
    for (std::size_t x = 0; x + 16 <= count; x += 16)
      for (std::size_t l = 0; l < 16; ++l) acc[l] += p[x + l];
    float s = 0;
    for (float a : acc) s += a;
    return s;
  };
  for (auto _ : state) {
    float total = 0;
    if (t == 1) {
      total = sum(K.data(), K.size()) + sum(V.data(), V.size());
    } else {
      float other = 0;
      std::thread helper([&] { other = sum(K.data(), K.size()); });
      total = sum(V.data(), V.size());
      helper.join();
      total += other;
    }
    benchmark::DoNotOptimize(total);
  }
  state.counters["GB/s"] = benchmark::Counter(double(K.size() + V.size()) * sizeof(float),
                                              benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

// Decoding from a key/value cache stored as T (float, bf16 or f16): one
// float query per head, n = 1, the H = 8, m = 262144, d = 128.
template <class T>
void decode_cache(benchmark::State& state, std::size_t H, std::size_t m, std::size_t d) {
  const heads_t Q = random_heads(1, H, 1, d, 1), Kf = random_heads(1, H, m, d, 2), Vf = random_heads(1, H, m, d, 3);
  tensor<T, dyn, dyn, dyn, dyn> K(1, H, m, d), V(1, H, m, d);
  for (std::size_t k = 0; k < K.size(); ++k) K.data()[k] = T(Kf.data()[k]), V.data()[k] = T(Vf.data()[k]);
  heads_t O(1, H, 1, d);
  threads_scope scope(1);
  const float dk = float(d);
  for (auto _ : state) {
    eval_into(O, softmax(Q * transpose(K) / sqrt(dk)) * V);
    benchmark::DoNotOptimize(O.data());
  }
  state.counters["GB/s"] = benchmark::Counter(double(K.size() + V.size()) * sizeof(T),
                                              benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

// Its floor: every element of the 2-byte K and V read once, converted with
// this machine's widest vectors and summed (kv_read_floor.cpp).
template <class T>
void read_kv_16(benchmark::State& state, std::size_t H, std::size_t m, std::size_t d) {
  tensor<T, dyn, dyn, dyn, dyn> K(1, H, m, d), V(1, H, m, d);
  for (std::size_t k = 0; k < K.size(); ++k) K.data()[k] = T(float(k % 7) / 8), V.data()[k] = T(float(k % 5) / 8);
  for (auto _ : state) {
    float total = bench::sum_converted(K.data(), K.size()) + bench::sum_converted(V.data(), V.size());
    benchmark::DoNotOptimize(total);
  }
  state.counters["GB/s"] = benchmark::Counter(double(K.size() + V.size()) * sizeof(T),
                                              benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

template <class F>
void add(const std::string& name, F f) {
  benchmark::RegisterBenchmark(name.c_str(), f)->Unit(benchmark::kMillisecond)->UseRealTime();
}

int register_all() {
  for (std::size_t t : {1, 2}) {
    const std::string th = "/threads=" + std::to_string(t);
    // Two threads against one: the B = 1, H = 8, T = 4096, d = 64.
    for (bool c : {false, true})
      add("heads/B=1/H=8/T=4096/d=64/causal=" + std::to_string(int(c)) + th,
          [=](benchmark::State& s) { heads(s, 1, 8, 8, 4096, 4096, 64, c, t); });
    // Per-head throughput, batched against one head, at each T.
    for (std::size_t T : {256, 1024, 4096}) {
      add("heads/B=2/H=8/T=" + std::to_string(T) + "/d=64/causal=0" + th,
          [=](benchmark::State& s) { heads(s, 2, 8, 8, T, T, 64, false, t); });
      add("single/T=" + std::to_string(T) + "/d=64/causal=0" + th,
          [=](benchmark::State& s) { single(s, T, 64, false, t); });
    }
    // Decoding: one query per head, 32 heads of 128 over 4096 keys (K and V:
    // 128 MiB, far beyond the caches), plus grouped-query with 8 key heads.
    add("decode/H=32/Hkv=32/m=4096/d=128" + th, [=](benchmark::State& s) { heads(s, 1, 32, 32, 1, 4096, 128, false, t); });
    add("decode/H=32/Hkv=8/m=4096/d=128" + th, [=](benchmark::State& s) { heads(s, 1, 32, 8, 1, 4096, 128, false, t); });
    // Multi-query: 8 query heads over one key/value head of 65536 keys (64
    // MiB): one group, its pieces spread over the threads.
    add("decode/H=8/Hkv=1/m=65536/d=128" + th, [=](benchmark::State& s) { heads(s, 1, 8, 1, 1, 65536, 128, false, t); });
    add("read_kv/H=32/m=4096/d=128" + th, [=](benchmark::State& s) { read_kv(s, 32, 4096, 128, t); });
    // Self-test (e): T = 4096, d_model = 4096 as 32 heads of 128 or one of 4096.
    add("selftest_e/h=32/T=4096/dk=128" + th, [=](benchmark::State& s) { heads(s, 1, 32, 32, 4096, 4096, 128, false, t); });
    add("selftest_e/h=1/T=4096/dk=4096" + th, [=](benchmark::State& s) { heads(s, 1, 1, 1, 4096, 4096, 4096, false, t); });
  }
  // A 16-bit key/value cache against a float one, and the 16-bit read floor.
  add("decode_cache/float/H=8/m=262144/d=128", [](benchmark::State& s) { decode_cache<float>(s, 8, 262144, 128); });
  add("decode_cache/bf16/H=8/m=262144/d=128", [](benchmark::State& s) { decode_cache<bf16>(s, 8, 262144, 128); });
  add("decode_cache/f16/H=8/m=262144/d=128", [](benchmark::State& s) { decode_cache<f16>(s, 8, 262144, 128); });
  add("read_kv_16/bf16/H=8/m=262144/d=128", [](benchmark::State& s) { read_kv_16<bf16>(s, 8, 262144, 128); });
  add("read_kv_16/f16/H=8/m=262144/d=128", [](benchmark::State& s) { read_kv_16<f16>(s, 8, 262144, 128); });
  return 0;
}

[[maybe_unused]] const int registered = register_all();

}  // namespace
