// The extension points, fused against naive, at T = 4096, d = 64, one thread:
// every built-in similarity, a user similarity equal to the dot product, the
// extension guide's two examples, ALiBi, a sliding window of 256 keys as the
// window node (alone, and with a key-aligned ALiBi in the user's unit) and
// as the equivalent predicate (with and without its block hint); and
// a batched layer (B = 2, 8 query heads on 2 key heads, T = 512) with a
// soft-capped window, on one thread and on all; and decoding (decode/...)
// with per-head ALiBi, a soft-cap and per-sequence lengths as a predicate,
// each beside its form without the functor.
// Built twice: qkv_extension_bench with the README's flags (-O2, no -m flag:
// user functors run on SSE2 on x86-64) and qkv_extension_bench_native with
// -march=native.
//   build/bench/qkv_extension_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
//       --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>

#include <qkv/google_benchmark.hpp>
#include <qkv/qkv.hpp>

#include <cmath>
#include <cstddef>
#include <random>
#include <string>

namespace {

using namespace qkv;
using mat = matrix<float, dyn, dyn>;
using heads_t = tensor<float, dyn, dyn, dyn, dyn>;
constexpr std::size_t T = 4096, d = 64;

mat random(std::size_t r, std::size_t c, unsigned seed, float scale = 1) {
  mat x(r, c);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  for (std::size_t k = 0; k < x.size(); ++k) x.data()[k] = u(gen);
  return x;
}

heads_t random_heads(std::size_t b, std::size_t h, std::size_t t, unsigned seed) {
  heads_t x(b, h, t, d);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  for (std::size_t k = 0; k < x.size(); ++k) x.data()[k] = u(gen);
  return x;
}

struct inputs {
  mat Q = random(T, d, 1), K = random(T, d, 2), V = random(T, d, 3), O = mat(T, d);
  mat W = random(d, d, 4, 0.125f), Wq = random(d, 16, 5, 0.125f), Wk = random(d, 16, 6, 0.125f), w = random(1, 16, 7);
  // [B, H, T, d] with B = 2, T = 512: 8 query heads, 2 key and value heads.
  heads_t HQ = random_heads(2, 8, 512, 8), HK = random_heads(2, 2, 512, 9), HV = random_heads(2, 2, 512, 10),
          HO = heads_t(2, 8, 512, d);
};

inputs& data() {
  static inputs x;
  return x;
}

const auto user_dot = [](auto q, auto k) { return q * k; };
const auto neg_l1 = [](auto q, auto k) { return -xsimd::abs(q - k); };
const auto soft_cap = [](auto s, auto, auto) {
  using std::tanh;
  return 30.0f * tanh(s / 30.0f);
};
const auto alibi = [](auto s, auto i, auto j) { return s - 0.0625f * (i - j); };
const auto band = [](std::size_t i, std::size_t j) { return j <= i && i - j < 256; };
// The same window with the block hint: whole key blocks are skipped unseen.
struct window_with_hint {
  bool operator()(std::size_t i, std::size_t j) const { return j <= i && i - j < 256; }
  bool any(std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) const { return j0 < i1 && j1 + 256 > i0 + 1; }
};

// name/fused and name/naive, on `threads` threads (0: all); make(x) gives
// the expression and out(x) where it is evaluated into.
template <class Make, class Out>
void add(const std::string& name, Make make, Out out, std::size_t threads = 1) {
  for (int fuse : {1, 0}) {
    benchmark::RegisterBenchmark((name + (fuse ? "/fused" : "/naive")).c_str(), [make, out, fuse, threads](benchmark::State& state) {
      set_threads(threads);
      inputs& x = data();
      const auto e = make(x);
      auto& o = out(x);
      for (auto _ : state) {
        if (fuse) eval_into(o, e, fused);
        else eval_into(o, e, naive);
        benchmark::DoNotOptimize(o.data());
      }
      set_threads(0);
    })->Unit(benchmark::kMillisecond)->UseRealTime();
  }
}

template <class Make>
void add(const std::string& name, Make make) {
  add(name, make, [](inputs& x) -> mat& { return x.O; });
}

int register_all() {
  const float dk = float(d);
  add("dot", [dk](inputs& x) { return softmax(similarity(x.Q, x.K, dot) / sqrt(dk)) * x.V; });
  add("user_dot", [dk](inputs& x) { return softmax(similarity(x.Q, x.K, user_dot) / sqrt(dk)) * x.V; });
  add("bilinear", [dk](inputs& x) { return softmax(similarity(x.Q, x.K, bilinear(x.W)) / sqrt(dk)) * x.V; });
  add("cosine", [](inputs& x) { return softmax(similarity(x.Q, x.K, cosine) * 8.0f) * x.V; });
  add("neg_sq_l2", [dk](inputs& x) { return softmax(similarity(x.Q, x.K, neg_sq_l2) / sqrt(dk)) * x.V; });
  add("additive_da16", [](inputs& x) { return softmax(similarity(x.Q, x.K, additive(x.Wq, x.Wk, x.w))) * x.V; });
  add("neg_l1", [](inputs& x) { return softmax(similarity(x.Q, x.K, neg_l1)) * x.V; });
  add("soft_cap_causal", [](inputs& x) { return softmax(causal(score_mod(x.Q * transpose(x.K), soft_cap))) * x.V; });
  add("alibi_causal", [dk](inputs& x) { return softmax(causal(score_mod(x.Q * transpose(x.K) / sqrt(dk), alibi))) * x.V; });
  add("causal", [dk](inputs& x) { return softmax(causal(x.Q * transpose(x.K) / sqrt(dk))) * x.V; });
  add("window256_node", [dk](inputs& x) { return softmax(window(x.Q * transpose(x.K) / sqrt(dk), 256)) * x.V; });
  add("window256_node_alibi", [dk](inputs& x) {
    return softmax(window(score_mod(x.Q * transpose(x.K) / sqrt(dk), key_aligned(alibi)), 256)) * x.V;
  });
  add("window256", [dk](inputs& x) { return softmax(masked(x.Q * transpose(x.K) / sqrt(dk), band)) * x.V; });
  add("window256_hint",
      [dk](inputs& x) { return softmax(masked(x.Q * transpose(x.K) / sqrt(dk), window_with_hint{})) * x.V; });
  const auto batched = [dk](inputs& x) {
    return softmax(masked(score_mod(x.HQ * transpose(x.HK) / sqrt(dk), soft_cap), window_with_hint{})) * x.HV;
  };
  const auto heads_out = [](inputs& x) -> heads_t& { return x.HO; };
  add("batched_window256_soft_cap/threads:1", batched, heads_out, 1);
  add("batched_window256_soft_cap/threads:all", batched, heads_out, 0);
  return 0;
}

// Decoding with the user's functors: one query per head, 8 heads, m = 8192
// keys, d = 128, float cache, one thread; per-sequence lengths over [4, 2,
// 8192, 128] as a predicate with a block hint against the same as a bool mask.
struct decode_inputs {
  static constexpr std::size_t H = 8, m = 8192, dd = 128;
  heads_t q = heads_t(1, H, 1, dd), K = heads_t(1, H, m, dd), V = heads_t(1, H, m, dd);
  heads_t lq = heads_t(4, 2, 1, dd), lK = heads_t(4, 2, m, dd), lV = heads_t(4, 2, m, dd);
  tensor<bf16, dyn, dyn, dyn, dyn> Kh = tensor<bf16, dyn, dyn, dyn, dyn>(1, H, m, dd), Vh = tensor<bf16, dyn, dyn, dyn, dyn>(1, H, m, dd);
  tensor<bf16, dyn, dyn, dyn, dyn> lKh = tensor<bf16, dyn, dyn, dyn, dyn>(4, 2, m, dd), lVh = tensor<bf16, dyn, dyn, dyn, dyn>(4, 2, m, dd);
  tensor<bool, dyn, dyn, dyn, dyn> lM = tensor<bool, dyn, dyn, dyn, dyn>(4, 1, 1, m);
  std::size_t len[4] = {8192, 5000, 2000, 700};
  decode_inputs() {
    std::mt19937 g(7);
    std::uniform_real_distribution<float> u(-1, 1);
    for (heads_t* t : {&q, &K, &V, &lq, &lK, &lV})
      for (std::size_t x = 0; x < t->size(); ++x) t->data()[x] = u(g);
    for (std::size_t b = 0; b < 4; ++b)
      for (std::size_t j = 0; j < m; ++j) lM(b, 0, 0, j) = j < len[b];
    for (std::size_t x = 0; x < K.size(); ++x) Kh.data()[x] = bf16(K.data()[x]), Vh.data()[x] = bf16(V.data()[x]);
    for (std::size_t x = 0; x < lK.size(); ++x) lKh.data()[x] = bf16(lK.data()[x]), lVh.data()[x] = bf16(lV.data()[x]);
  }
};
decode_inputs& decode_data() {
  static decode_inputs x;
  return x;
}
struct below_length {
  const std::size_t* len;
  bool operator()(std::size_t b, std::size_t, std::size_t, std::size_t j) const { return j < len[b]; }
  bool any(std::size_t b, std::size_t, std::size_t, std::size_t, std::size_t j0, std::size_t) const { return j0 < len[b]; }
};

int register_decode() {
  decode_inputs& x = decode_data();
  const auto s = [&x] { return x.q * transpose(x.K) / sqrt(dim<128>); };
  const auto heads_alibi = [](auto sc, std::size_t, std::size_t h, auto i, auto j) {
    return sc - decltype(sc)(0.0625f / float(h + 1)) * (i - j);
  };
  // qkv::register_benchmark (<qkv/google_benchmark.hpp>): decode/name/fused and decode/name/naive, one thread.
  register_benchmark("decode/plain", [&x, s] { return softmax(s()) * x.V; }, 1);
  register_benchmark("decode/alibi", [&x, s, heads_alibi] { return softmax(score_mod(s(), heads_alibi)) * x.V; }, 1);
  register_benchmark("decode/soft_cap", [&x, s] { return softmax(score_mod(s(), soft_cap)) * x.V; }, 1);
  const auto ls = [&x] { return x.lq * transpose(x.lK) / sqrt(dim<128>); };
  register_benchmark("decode/lengths_none", [&x, ls] { return softmax(ls()) * x.lV; }, 1);
  register_benchmark("decode/lengths_mask", [&x, ls] { return softmax(masked(ls(), x.lM)) * x.lV; }, 1);
  register_benchmark("decode/lengths_predicate", [&x, ls] { return softmax(masked(ls(), below_length{x.len})) * x.lV; }, 1);
  // The same over a bf16 cache (float queries), read as stored.
  const auto sh = [&x] { return x.q * transpose(x.Kh) / sqrt(dim<128>); };
  register_benchmark("decode_bf16/plain", [&x, sh] { return softmax(sh()) * x.Vh; }, 1);
  register_benchmark("decode_bf16/alibi", [&x, sh, heads_alibi] { return softmax(score_mod(sh(), heads_alibi)) * x.Vh; }, 1);
  register_benchmark("decode_bf16/soft_cap", [&x, sh] { return softmax(score_mod(sh(), soft_cap)) * x.Vh; }, 1);
  const auto lsh = [&x] { return x.lq * transpose(x.lKh) / sqrt(dim<128>); };
  register_benchmark("decode_bf16/lengths_mask", [&x, lsh] { return softmax(masked(lsh(), x.lM)) * x.lVh; }, 1);
  register_benchmark("decode_bf16/lengths_predicate", [&x, lsh] { return softmax(masked(lsh(), below_length{x.len})) * x.lVh; }, 1);
  return 0;
}

[[maybe_unused]] const int registered = register_all();
[[maybe_unused]] const int registered_decode = register_decode();

}  // namespace
