// qkv's attention, fused and naive, and the fused kernel called directly
// (the expression layer must cost nothing on top of it); one thread, and the
// fused path on two; the fused path on bf16 and f16 inputs.
//   cmake -S . -B build -DQKV_BUILD_BENCHMARKS=ON && cmake --build build -j2 --target qkv_bench
//   build/bench/qkv_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include "bench_common.hpp"

#include <qkv/kernels/api.hpp>

namespace {

using namespace qkv;

// The expression, evaluated by the strategy named, on Threads threads.
template <class Strategy, std::size_t Threads = 1>
void expression(benchmark::State& state, const bench::config& c) {
  set_threads(Threads);
  bench::inputs in(c);
  const float dk = float(c.d);
  for (auto _ : state) {
    if (c.causal) {
      eval_into(in.O, softmax(causal(in.Q * transpose(in.K) / sqrt(dk))) * in.V, Strategy{});
    } else {
      eval_into(in.O, softmax(in.Q * transpose(in.K) / sqrt(dk)) * in.V, Strategy{});
    }
    benchmark::DoNotOptimize(in.O.data());
  }
  bench::set_counters(state, c);
  state.SetLabel(active_arch());
}

// The same on 2-byte inputs (the float inputs rounded), into a float output.
template <class T>
void expression_16(benchmark::State& state, const bench::config& c) {
  set_threads(1);
  bench::inputs in(c);
  auto narrow = [](const matrix<float, dyn, dyn>& x) {
    matrix<T, dyn, dyn> r(x.rows(), x.cols());
    for (std::size_t k = 0; k < x.size(); ++k) r.data()[k] = T(x.data()[k]);
    return r;
  };
  const auto Q = narrow(in.Q), K = narrow(in.K), V = narrow(in.V);
  const float dk = float(c.d);
  for (auto _ : state) {
    if (c.causal) eval_into(in.O, softmax(causal(Q * transpose(K) / sqrt(dk))) * V, fused);
    else eval_into(in.O, softmax(Q * transpose(K) / sqrt(dk)) * V, fused);
    benchmark::DoNotOptimize(in.O.data());
  }
  bench::set_counters(state, c);
  state.SetLabel(active_arch());
}

// The kernel the fused strategy calls, without the expression layer.
void kernel_direct(benchmark::State& state, const bench::config& c) {
  set_threads(1);
  bench::inputs in(c);
  kernels::attention_problem<float> p;
  p.q = {in.Q.data(), c.n, c.d, std::ptrdiff_t(c.d), 1};
  p.k = {in.K.data(), c.m, c.d, std::ptrdiff_t(c.d), 1};
  p.v = {in.V.data(), c.m, c.d, std::ptrdiff_t(c.d), 1};
  p.out = {in.O.data(), c.n, c.d, std::ptrdiff_t(c.d), 1};
  p.scale = 1.0f / std::sqrt(float(c.d));
  p.bounds.causal = c.causal;
  for (auto _ : state) {
    kernels::attention(p);
    benchmark::DoNotOptimize(in.O.data());
  }
  bench::set_counters(state, c);
  state.SetLabel(active_arch());
}

const int registered = [] {
  bench::register_all("qkv_fused", expression<fused_t>);
  bench::register_all("qkv_kernel", kernel_direct);
  bench::register_all("qkv_naive", expression<naive_t>);
  bench::register_all("qkv_fused_2threads", expression<fused_t, 2>);
  bench::register_all("qkv_fused_bf16", expression_16<bf16>);
  bench::register_all("qkv_fused_f16", expression_16<f16>);
  return 0;
}();

}  // namespace
