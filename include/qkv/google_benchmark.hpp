// Google Benchmark for an expression of yours: name/fused and name/naive,
// each iteration evaluating it into storage allocated once, with GFLOP/s
// from cost(e) beside the time. Include <benchmark/benchmark.h> (Debian:
// libbenchmark-dev) and link benchmark::benchmark_main:
//   #include <qkv/google_benchmark.hpp>
//   matrix<float, dyn, dyn> Q(1024, 64), K(1024, 64), V(1024, 64);
//   const int registered = qkv::register_benchmark("my_formula", [&] { return softmax(similarity(Q, K, f)) * V; });
// make() is called once per benchmark run; the operands it reads must
// outlive the runs (benchmark::RunSpecifiedBenchmarks, or the main of
// benchmark_main).
#pragma once

#include "qkv.hpp"

#include <benchmark/benchmark.h>

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

namespace qkv {

// Registers name/fused (by the default strategy where e has no fused form)
// and name/naive on `threads` threads (0: qkv's default); returns 0, so that
// a namespace-scope `const int` can register at start-up.
template <class Make>
int register_benchmark(const std::string& name, Make make, std::size_t threads = 0) {
  for (const bool fuse : {true, false}) {
    benchmark::RegisterBenchmark((name + (fuse ? "/fused" : "/naive")).c_str(), [make, fuse, threads](benchmark::State& state) {
      const std::size_t before = qkv::threads();
      if (threads != 0) set_threads(threads);
      const auto e = make();
      auto out = eval(e);
      for (auto _ : state) {
        if (!fuse) eval_into(out, e, naive);
        else if constexpr (detail::has_fused_form<std::remove_cvref_t<decltype(e)>>) eval_into(out, e, fused);
        else eval_into(out, e);
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
      }
      state.counters["GFLOP/s"] =
          benchmark::Counter(static_cast<double>(cost(e).flops) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
      if (threads != 0) set_threads(before);
    })->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  return 0;
}

}  // namespace qkv
