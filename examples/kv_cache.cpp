// Decoding with a key/value cache, one token at a time, as a gpt-oss-style
// layer attends: grouped-query heads (4 query heads on 2 key/value heads), a
// sliding window of 128 keys and one learned sink logit per head. Each step
// appends the token's keys and values to the cache and attends from its
// query; every step is checked against a float64 reference computed here.
// Then the cache is split in two parts, each attended on its own with
// eval_with_lse, and the parts merged: the whole's result. Last, the cache
// kept in 8 and in 4 bits (quantize<q8>, quantize<q4>): the attention over
// the values the codes stand for, and how far quantizing moved the result.
//
//   cache     [capacity, 2, 32] floats, token by token (as serving engines
//             lay it out), read as [1, 2, t, 32] in place
//   O_t = softmax(window(q_t K_tᵀ / √32, 128), sinks) V_t
#include <qkv/qkv.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

using namespace qkv;

namespace {

constexpr std::size_t H = 4, Hk = 2, d = 32, steps = 300, w = 128;

// The first t tokens of a cache laid out [token, head, d], as [1, Hk, t, d].
tensor_view<const float, 1, Hk, dyn, d> cached(const std::vector<float>& cache, std::size_t t) {
  return {cache.data(), {1, Hk, t, d}, {steps * Hk * d, d, Hk * d, 1}};
}

// Deterministic inputs in [−1, 1].
float value(std::size_t token, std::size_t head, std::size_t c, double salt) {
  return float(std::sin(salt * double(token * 131 + head * 17 + c) + 0.1 * salt));
}

// O for the query of token t (all heads) over keys [first, t] of the cache,
// with the sinks, in float64.
std::vector<double> reference(const tensor<float, 1, H, 1, d>& q, const std::vector<float>& k,
                              const std::vector<float>& v, const matrix<float, 1, H>& sinks, std::size_t t) {
  std::vector<double> o(H * d, 0);
  const std::size_t first = t + 1 > w ? t + 1 - w : 0;
  for (std::size_t h = 0; h < H; ++h) {
    const std::size_t g = h / (H / Hk);
    std::vector<double> s;
    double mx = sinks(0, h);
    for (std::size_t j = first; j <= t; ++j) {
      double dot = 0;
      for (std::size_t c = 0; c < d; ++c) dot += double(q(0, h, 0, c)) * k[(j * Hk + g) * d + c];
      s.push_back(dot / std::sqrt(double(d)));
      mx = std::max(mx, s.back());
    }
    double sum = std::exp(double(sinks(0, h)) - mx);
    for (double x : s) sum += std::exp(x - mx);
    for (std::size_t j = first; j <= t; ++j)
      for (std::size_t c = 0; c < d; ++c) o[h * d + c] += std::exp(s[j - first] - mx) / sum * v[(j * Hk + g) * d + c];
  }
  return o;
}

template <class O>
double worst_against(const O& got, const std::vector<double>& want) {
  double worst = 0;
  for (std::size_t h = 0; h < H; ++h)
    for (std::size_t c = 0; c < d; ++c) worst = std::max(worst, std::abs(double(got(0, h, 0, c)) - want[h * d + c]));
  return worst;
}

}  // namespace

int main() {
  std::vector<float> k_cache(steps * Hk * d), v_cache(steps * Hk * d);
  matrix<float, 1, H> sinks{{0.5f, -1.0f, 2.0f, 0.0f}};
  tensor<float, 1, H, 1, d> q;
  // Scores are at most √32 ≈ 5.7 with a float error of γ_32·√32 < 1.1e-5;
  // weights move by twice that relatively, outputs (≤ 1) by < 3e-5.
  const double bound = 5e-5;
  double worst = 0;
  for (std::size_t t = 0; t < steps; ++t) {
    for (std::size_t g = 0; g < Hk; ++g)
      for (std::size_t c = 0; c < d; ++c) {
        k_cache[(t * Hk + g) * d + c] = value(t, g, c, 0.7);
        v_cache[(t * Hk + g) * d + c] = value(t, g, c, 1.3);
      }
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t c = 0; c < d; ++c) q(0, h, 0, c) = value(t, h, c, 0.3);
    const auto K = cached(k_cache, t + 1), V = cached(v_cache, t + 1);
    const auto O = eval(softmax(window(q * transpose(K) / sqrt(dim<d>), w), sinks) * V);
    worst = std::max(worst, worst_against(O, reference(q, k_cache, v_cache, sinks, t)));
  }
  std::printf("decoded %zu tokens, window %zu, sinks per head: worst error against float64 %.2g (bound %.0g): %s\n",
              steps, w, worst, bound, worst < bound ? "ok" : "FAILED");

  // The last step again, from two parts of the cache: tokens [0, 200) and
  // [200, 300). positions(S, q0, k0) says where each part's query and keys
  // stand in the sequence (the query at t − 1, the second part's keys from
  // 200), so the window is written as over the whole. The sink belongs to
  // one part only.
  const std::size_t t = steps, split = 200;
  const tensor_view<const float, 1, Hk, dyn, d> Ka(k_cache.data(), {1, Hk, split, d}, {steps * Hk * d, d, Hk * d, 1});
  const tensor_view<const float, 1, Hk, dyn, d> Va(v_cache.data(), {1, Hk, split, d}, {steps * Hk * d, d, Hk * d, 1});
  const tensor_view<const float, 1, Hk, dyn, d> Kb(k_cache.data() + split * Hk * d, {1, Hk, t - split, d},
                                                   {steps * Hk * d, d, Hk * d, 1});
  const tensor_view<const float, 1, Hk, dyn, d> Vb(v_cache.data() + split * Hk * d, {1, Hk, t - split, d},
                                                   {steps * Hk * d, d, Hk * d, 1});
  const auto [Oa, La] = eval_with_lse(softmax(window(positions(q * transpose(Ka) / sqrt(dim<d>), t - 1, 0), w)) * Va);
  const auto [Ob, Lb] = eval_with_lse(softmax(window(positions(q * transpose(Kb) / sqrt(dim<d>), t - 1, split), w), sinks) * Vb);
  const auto [merged, L] = merge(Oa, La, Ob, Lb);
  const auto whole = eval(softmax(window(q * transpose(cached(k_cache, t)) / sqrt(dim<d>), w), sinks) * cached(v_cache, t));
  double apart = 0;
  for (std::size_t h = 0; h < H; ++h)
    for (std::size_t c = 0; c < d; ++c) apart = std::max(apart, std::abs(double(merged(0, h, 0, c)) - whole(0, h, 0, c)));
  const double merged_error = worst_against(merged, reference(q, k_cache, v_cache, sinks, t - 1));
  std::printf("two parts merged: %.2g from the whole, %.2g from float64 (bound %.0g): %s\n", apart, merged_error, bound,
              merged_error < bound && apart < 2 * bound ? "equal to the whole" : "FAILED");

  // The cache in 8 bits and in 4 (a scale per 32 values; q4 a minimum too).
  // Attention over a quantized cache is the float attention over the values
  // its codes stand for: checked against float64 over those values, with
  // the same bound. How far they are from the float cache's values is the
  // price of the bytes saved, printed.
  bool quantized_ok = true;
  const auto quantized_step = [&](const auto& Kq, const auto& Vq, const char* name, std::size_t bytes) {
    const auto O = eval(softmax(window(q * transpose(Kq) / sqrt(dim<d>), w), sinks) * Vq);
    const auto Kd = dequantize(Kq), Vd = dequantize(Vq);
    std::vector<float> k(steps * Hk * d), v(steps * Hk * d);
    for (std::size_t j = 0; j < t; ++j)
      for (std::size_t g = 0; g < Hk; ++g)
        for (std::size_t c = 0; c < d; ++c) k[(j * Hk + g) * d + c] = Kd(0, g, j, c), v[(j * Hk + g) * d + c] = Vd(0, g, j, c);
    const double exact = worst_against(O, reference(q, k, v, sinks, t - 1));
    double moved = 0;
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t c = 0; c < d; ++c) moved = std::max(moved, std::abs(double(O(0, h, 0, c)) - whole(0, h, 0, c)));
    std::printf("%s cache (%zu bytes a row of %zu, float %zu): %.2g from the float cache's result, %.2g from float64 over its values (bound %.0g): %s\n",
                name, bytes, d, d * sizeof(float), moved, exact, bound, exact < bound ? "ok" : "FAILED");
    quantized_ok = quantized_ok && exact < bound;
  };
  const auto K8 = quantize<q8>(cached(k_cache, t)), V8 = quantize<q8>(cached(v_cache, t));
  const auto K4 = quantize<q4>(cached(k_cache, t)), V4 = quantize<q4>(cached(v_cache, t));
  quantized_step(K8, V8, "q8", K8.row_bytes());
  quantized_step(K4, V4, "q4", K4.row_bytes());
  return worst < bound && merged_error < bound && apart < 2 * bound && quantized_ok ? 0 : 1;
}
