// The peak to quote the others against: one core running 12 independent
// chains of fused multiply-adds on the widest float vectors this CPU has
// (the file is compiled with -march=native), enough to cover an FMA's
// latency on both pipes of a Zen or Intel core. Its GFLOP/s counts 2 per
// lane per FMA, as the attention benchmarks count theirs.
#include <benchmark/benchmark.h>

#include <xsimd/xsimd.hpp>

#include <array>
#include <cstddef>
#include <string>

namespace {

void fma_probe(benchmark::State& state) {
  using batch = xsimd::batch<float>;
  constexpr std::size_t chains = 12, steps = 1000;
  std::array<batch, chains> acc;
  for (std::size_t c = 0; c < chains; ++c) acc[c] = batch(float(c) * 1e-3f);
  batch a(0.999999f), b(1e-7f);
  for (auto _ : state) {
    benchmark::DoNotOptimize(a);
    benchmark::DoNotOptimize(b);
    for (std::size_t s = 0; s < steps; ++s)
      for (std::size_t c = 0; c < chains; ++c) acc[c] = xsimd::fma(acc[c], a, b);
  }
  for (std::size_t c = 0; c < chains; ++c) benchmark::DoNotOptimize(acc[c]);
  state.counters["GFLOP/s"] = benchmark::Counter(double(2 * batch::size * chains * steps),
                                                 benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
  state.SetLabel(std::string(xsimd::default_arch::name()) + ", " + std::to_string(batch::size) + " lanes");
}

BENCHMARK(fma_probe)->Name("fma_probe");

}  // namespace
