// The attention backward, one thread: qkv's fused backward (the pullback of
// vjp, which keeps the forward's O and row log-sum-exp) beside the fused
// forward, and the backward a BLAS user writes by hand: S and P again, then
// dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − rowsum(dP ∘ P)), dQ = c·dS K and
// dK = c·dSᵀ Q, each product a cblas_sgemm, every n×m matrix materialised.
// GFLOP/s count 10·d per visible query-key pair for a backward (2.5 times the
// forward's 4·d, FlashAttention-2's convention), whatever an implementation
// recomputes. With a soft-capping score_mod and a user similarity equal to
// the dot product too, whose backward runs in this unit
// (qkv_gradient_bench_native: -march=native). And additive(Wq, Wk, w) with
// and without w's gradient, fused and node by node; one head on two
// threads, and eight. A learned relative-position bias as a table the
// modifier reads (score_mod(S, f, P), its gradient scatter-added by the
// kernel) against the same as an n×m bias matrix (S + B), and against none.
#include "bench_common.hpp"

#include <qkv/kernels/api.hpp>

#ifdef QKV_BENCH_OPENBLAS
#include <cblas.h>
extern "C" void openblas_set_num_threads(int);
#endif

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace {

std::vector<bench::config> sizes() {
  std::vector<bench::config> c;
  for (std::size_t d : {64, 128})
    for (bool causal : {false, true})
      for (std::size_t t : {256, 1024, 4096, 8192}) c.push_back({t, t, d, causal});
  return c;
}

void set_backward_counters(benchmark::State& state, const bench::config& c) {
  state.counters["GFLOP/s"] = benchmark::Counter(10.0 * double(c.d) * bench::visible_pairs(c),
                                                 benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
}

struct gradient_inputs : bench::inputs {
  qkv::matrix<float, qkv::dyn, qkv::dyn> dO;
  explicit gradient_inputs(const bench::config& c) : bench::inputs(c), dO(c.n, c.d) {
    for (std::size_t k = 0; k < dO.size(); ++k) dO.data()[k] = Q.data()[(k * 7) % Q.size()] * 0.5f;
  }
};

template <class F>
void with_attention(const bench::config& c, gradient_inputs& in, F f) {
  const float scale = 1.0f / std::sqrt(float(c.d));
  if (c.causal) f(softmax(causal(in.Q * transpose(in.K)) * scale) * in.V);
  else f(softmax(in.Q * transpose(in.K) * scale) * in.V);
}

void forward(benchmark::State& state, const bench::config& c) {
  qkv::set_threads(1);
  gradient_inputs in(c);
  with_attention(c, in, [&](const auto& e) {
    for (auto _ : state) {
      qkv::eval_into(in.O, e);
      benchmark::DoNotOptimize(in.O.data());
    }
  });
  bench::set_counters(state, c);
}

// On `threads` threads: one head's key groups split over them (dK, dV),
// then its query blocks (dQ). With two against one: what the second
// thread gives, which the key groups' size decides at small T.
void fused_backward_on(benchmark::State& state, const bench::config& c, std::size_t threads) {
  qkv::set_threads(threads);
  gradient_inputs in(c);
  with_attention(c, in, [&](const auto& e) {
    const auto [O, back] = qkv::vjp(e);
    for (auto _ : state) {
      auto g = back(in.dO, qkv::wrt(in.Q, in.K, in.V));
      benchmark::DoNotOptimize(std::get<0>(g).data());
    }
  });
  set_backward_counters(state, c);
  qkv::set_threads(1);
}

void fused_backward(benchmark::State& state, const bench::config& c) { fused_backward_on(state, c, 1); }

// The same with soft-capping, 30·tanh(s / 30), a score_mod that the fused
// backward differentiates with dual numbers inside its loop. The functor
// runs on the instruction set this unit is compiled for:
// qkv_gradient_bench_native is this file with -march=native.
void soft_capped_backward(benchmark::State& state, const bench::config& c) {
  qkv::set_threads(1);
  gradient_inputs in(c);
  const float scale = 1.0f / std::sqrt(float(c.d));
  const auto cap = [](auto s, auto, auto) { using std::tanh; return 30.0f * tanh(s / 30.0f); };
  const auto run = [&](const auto& e) {
    const auto [O, back] = qkv::vjp(e);
    for (auto _ : state) {
      auto g = back(in.dO, qkv::wrt(in.Q, in.K, in.V));
      benchmark::DoNotOptimize(std::get<0>(g).data());
    }
  };
  if (c.causal) run(softmax(causal(score_mod(in.Q * transpose(in.K) * scale, cap))) * in.V);
  else run(softmax(score_mod(in.Q * transpose(in.K) * scale, cap)) * in.V);
  set_backward_counters(state, c);
}

// A similarity of the user's equal to the dot product, q·k term by term:
// its backward's dQ and dK are sums of dS times the term's derivatives
// (dual batches), not products. Against fused_backward: what a user term
// costs over the built-in.
void user_dot_backward(benchmark::State& state, const bench::config& c) {
  qkv::set_threads(1);
  gradient_inputs in(c);
  const float scale = 1.0f / std::sqrt(float(c.d));
  const auto dot = [](auto q, auto k) { return q * k; };
  const auto run = [&](const auto& e) {
    const auto [O, back] = qkv::vjp(e);
    for (auto _ : state) {
      auto g = back(in.dO, qkv::wrt(in.Q, in.K, in.V));
      benchmark::DoNotOptimize(std::get<0>(g).data());
    }
  };
  if (c.causal) run(softmax(causal(similarity(in.Q, in.K, dot)) * scale) * in.V);
  else run(softmax(similarity(in.Q, in.K, dot) * scale) * in.V);
  set_backward_counters(state, c);
}

#ifdef QKV_BENCH_OPENBLAS
void openblas_backward(benchmark::State& state, const bench::config& c) {
  openblas_set_num_threads(1);
  qkv::set_threads(1);
  gradient_inputs in(c);
  const int n = int(c.n), m = int(c.m), d = int(c.d);
  const float scale = 1.0f / std::sqrt(float(c.d));
  qkv::matrix<float, qkv::dyn, qkv::dyn> P(c.n, c.m), dP(c.n, c.m), dQ(c.n, c.d), dK(c.m, c.d), dV(c.m, c.d);
  const qkv::kernels::strided<float> p{P.data(), c.n, c.m, m, 1};
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, d, scale, in.Q.data(), d, in.K.data(), d, 0.0f,
                P.data(), m);
    if (c.causal) qkv::kernels::mask_causal(p);
    qkv::kernels::softmax_rows(p);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, d, n, 1.0f, P.data(), m, in.dO.data(), d, 0.0f,
                dV.data(), d);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, d, 1.0f, in.dO.data(), d, in.V.data(), d, 0.0f,
                dP.data(), m);
    for (std::size_t i = 0; i < c.n; ++i) {
      float* pr = P.data() + i * c.m;
      float* dr = dP.data() + i * c.m;
      float r = 0;
      for (std::size_t j = 0; j < c.m; ++j) r += pr[j] * dr[j];
      for (std::size_t j = 0; j < c.m; ++j) dr[j] = pr[j] * (dr[j] - r);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, m, scale, dP.data(), m, in.K.data(), d, 0.0f,
                dQ.data(), d);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, d, n, scale, dP.data(), m, in.Q.data(), d, 0.0f,
                dK.data(), d);
    benchmark::DoNotOptimize(dK.data());
  }
  set_backward_counters(state, c);
}
#endif

// 8 heads of T = 4096, d = 64, causal, on 1 and 2 threads: the heads go
// over the threads, each in one pass.
void fused_backward_heads(benchmark::State& state) {
  const std::size_t threads = static_cast<std::size_t>(state.range(0)), t = 4096, d = 64;
  qkv::set_threads(threads);
  qkv::tensor<float, 8, qkv::dyn, 64> Q(t), K(t), V(t), dO(t);
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto* x : {&Q, &K, &V, &dO})
    for (std::size_t k = 0; k < x->size(); ++k) x->data()[k] = u(gen);
  const auto e = softmax(causal(Q * transpose(K)) / qkv::sqrt(qkv::dim<64>)) * V;
  for (auto _ : state) {
    auto g = qkv::gradient(e, dO, qkv::wrt(Q, K, V));
    benchmark::DoNotOptimize(std::get<0>(g).data());
  }
  // The forward runs again inside gradient: credited as 4·d, the backward 10·d.
  const bench::config c{t, t, d, true};
  state.counters["GFLOP/s"] = benchmark::Counter(8 * 14.0 * double(d) * bench::visible_pairs(c),
                                                 benchmark::Counter::kIsIterationInvariantRate,
                                                 benchmark::Counter::kIs1000);
  qkv::set_threads(1);
}

// additive(Wq, Wk, w) with a projection width of d: dQ, dK, dV, dWq and
// dWk, and w's too when with_w (summed beside dK by the fused backward);
// node by node for comparison, which materialises every n×m matrix.
void additive_backward(benchmark::State& state, const bench::config& c, bool with_w, bool fused) {
  qkv::set_threads(1);
  gradient_inputs in(c);
  qkv::matrix<float, qkv::dyn, qkv::dyn> Wq(c.d, c.d), Wk(c.d, c.d), w(1, c.d);
  for (auto* x : {&Wq, &Wk, &w})
    for (std::size_t k = 0; k < x->size(); ++k) x->data()[k] = in.K.data()[(k * 5) % in.K.size()] / 8;
  const auto run = [&](const auto& e) {
    for (auto _ : state) {
      if (with_w && fused) benchmark::DoNotOptimize(qkv::gradient(e, in.dO, qkv::wrt(in.Q, in.K, in.V, Wq, Wk, w), qkv::fused));
      else if (with_w) benchmark::DoNotOptimize(qkv::gradient(e, in.dO, qkv::wrt(in.Q, in.K, in.V, Wq, Wk, w), qkv::naive));
      else benchmark::DoNotOptimize(qkv::gradient(e, in.dO, qkv::wrt(in.Q, in.K, in.V, Wq, Wk), qkv::fused));
    }
  };
  if (c.causal) run(softmax(causal(similarity(in.Q, in.K, qkv::additive(Wq, Wk, w)))) * in.V);
  else run(softmax(similarity(in.Q, in.K, qkv::additive(Wq, Wk, w))) * in.V);
  state.counters["pairs/s"] = benchmark::Counter(bench::visible_pairs(c), benchmark::Counter::kIsIterationInvariantRate);
}

// Node by node (qkv::naive), every n×m matrix materialised: the built-in
// dot product against the same written as a term of the user's, whose
// derivatives the dual numbers give over batches of keys (grad/extensions.hpp).
void node_by_node_backward(benchmark::State& state, const bench::config& c, bool user) {
  qkv::set_threads(1);
  gradient_inputs in(c);
  const float scale = 1.0f / std::sqrt(float(c.d));
  const auto dot = [](auto q, auto k) { return q * k; };
  const auto run = [&](const auto& e) {
    for (auto _ : state) {
      auto g = qkv::gradient(e, in.dO, qkv::wrt(in.Q, in.K, in.V), qkv::naive);
      benchmark::DoNotOptimize(std::get<0>(g).data());
    }
  };
  if (user) run(softmax(causal(similarity(in.Q, in.K, dot)) * scale) * in.V);
  else run(softmax(causal(in.Q * transpose(in.K)) * scale) * in.V);
}

// The relative-position bias three ways, causal, forward (eval) or fused
// backward (gradient with respect to Q, K, V and the bias's parameters):
// form 0 the table P (1 × m, entry i − j), 1 the n×m matrix B it amounts
// to, 2 no bias.
void relative_bias(benchmark::State& state, const bench::config& c, int form, bool backward) {
  qkv::set_threads(1);
  gradient_inputs in(c);
  const float scale = 1.0f / std::sqrt(float(c.d));
  qkv::matrix<float, qkv::dyn, qkv::dyn> P(1, c.m), B(c.n, c.m);
  for (std::size_t k = 0; k < c.m; ++k) P(0, k) = -0.01f * float(k % 97);
  for (std::size_t i = 0; i < c.n; ++i)
    for (std::size_t j = 0; j < c.m; ++j) B(i, j) = j <= i ? P(0, i - j) : 0.0f;
  const auto rel = qkv::key_aligned([](auto s, auto i, auto j, auto p) { return s + p(i - j); });
  const auto run = [&](const auto& e, const auto& bias) {
    for (auto _ : state) {
      if (backward) {
        auto g = qkv::gradient(e, in.dO, qkv::wrt(in.Q, in.K, in.V, bias), qkv::fused);
        benchmark::DoNotOptimize(std::get<0>(g).data());
      } else {
        qkv::eval_into(in.O, e);
        benchmark::DoNotOptimize(in.O.data());
      }
    }
  };
  if (form == 0) run(softmax(causal(qkv::score_mod(in.Q * transpose(in.K) * scale, rel, P))) * in.V, P);
  else if (form == 1) run(softmax(causal(in.Q * transpose(in.K) * scale + B)) * in.V, B);
  else run(softmax(causal(in.Q * transpose(in.K) * scale)) * in.V, in.V);
  if (backward) set_backward_counters(state, c);
  else bench::set_counters(state, c);
}

template <class F>
void register_each(const std::string& impl, F fn) {
  for (const bench::config& c : sizes())
    benchmark::RegisterBenchmark((impl + "/" + c.name()).c_str(), [fn, c](benchmark::State& s) { fn(s, c); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
}

const int registered = [] {
  register_each("forward", forward);
  register_each("fused_backward", fused_backward);
  register_each("soft_capped_backward", soft_capped_backward);
  register_each("user_dot_backward", user_dot_backward);
  for (const bool user : {false, true}) {
    const bench::config c{1024, 1024, 64, true};
    benchmark::RegisterBenchmark(((user ? "user_dot_node_by_node/" : "dot_node_by_node/") + c.name()).c_str(),
                                 [c, user](benchmark::State& s) { node_by_node_backward(s, c, user); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  for (const bool backward : {false, true})
    for (int form = 0; form < 3; ++form) {
      const bench::config c{2048, 2048, 64, true};
      const char* forms[] = {"table", "bias_matrix", "none"};
      benchmark::RegisterBenchmark((std::string("relative_bias/") + (backward ? "backward/" : "forward/") + forms[form] +
                                    "/" + c.name()).c_str(),
                                   [c, form, backward](benchmark::State& s) { relative_bias(s, c, form, backward); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
#ifdef QKV_BENCH_OPENBLAS
  register_each("openblas_backward", openblas_backward);
#endif
  for (const std::size_t t : {256, 1024})
    for (const bool causal : {false, true}) {
      const bench::config c{t, t, 64, causal};
      for (const auto& [name, with_w, fused] : {std::tuple{"additive_backward/fused", false, true},
                                                std::tuple{"additive_backward_with_w/fused", true, true},
                                                std::tuple{"additive_backward_with_w/naive", true, false}})
        benchmark::RegisterBenchmark((std::string(name) + "/" + c.name()).c_str(),
                                     [c, with_w = with_w, fused = fused](benchmark::State& s) {
                                       additive_backward(s, c, with_w, fused);
                                     })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
    }
  for (const std::size_t d : {64, 128})
    for (const std::size_t t : {256, 1024, 4096})
      for (const std::size_t threads : {1, 2}) {
        const bench::config c{t, t, d, false};
        benchmark::RegisterBenchmark(("fused_backward_one_head/" + c.name() + "/threads:" + std::to_string(threads)).c_str(),
                                     [c, threads](benchmark::State& s) { fused_backward_on(s, c, threads); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
  benchmark::RegisterBenchmark("fused_gradient_8_heads/T=4096/d=64/causal=1", fused_backward_heads)
      ->Arg(1)
      ->Arg(2)
      ->ArgName("threads")
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  return 0;
}();

}  // namespace
