// The lecture's next steps in the notation: self-attention (Q, K and V are
// projections of one sequence X) and multi-head attention (h heads of
// d_model / h, concatenated, projected by Wo), for a batch of sequences, with
// grouped-query attention as a variant. Checked against a float64
// reference computed here, loop by loop.
//
//   X  [B, T, d_model]               Wq, Wo: d_model × d_model
//   Q = X Wq is [B, T, d_model] = [B, T, h, dh]: read as [B, h, T, dh] in place
//   O_bh = softmax(causal(Q_bh K_bhᵀ / √dh)) V_bh, written into [B, T, h, dh]
//   Y = concat(O) Wo
#include <qkv/qkv.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

using namespace qkv;

namespace {

constexpr std::size_t B = 2, T = 200, d_model = 256, h = 8, dh = d_model / h;

// A [B, T, h·dh] tensor's memory read as [B, h, T, dh]: the heads side by side
// in each row become a batch extent, without a copy.
template <class T_>
auto heads(T_* data, std::size_t n_heads) {
  return tensor_view<T_, dyn, dyn, dyn, dh>(data, {B, n_heads, T, dh},
                                             {T * n_heads * dh, dh, n_heads * dh, 1});
}

// Y = MultiHead(X) in double, loop by loop: the reference.
std::vector<double> reference(const tensor<float, B, T, d_model>& X, const matrix<float, d_model, d_model>& Wq,
                              const matrix<float, dyn, dyn>& Wk, const matrix<float, dyn, dyn>& Wv,
                              const matrix<float, d_model, d_model>& Wo, std::size_t h_kv) {
  const std::size_t dkv = h_kv * dh, group = h / h_kv;
  std::vector<double> Y(B * T * d_model), q(T * d_model), k(T * dkv), v(T * dkv), cat(T * d_model), p(T);
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t t = 0; t < T; ++t) {
      for (std::size_t c = 0; c < d_model; ++c) {
        double s = 0;
        for (std::size_t x = 0; x < d_model; ++x) s += double(X(b, t, x)) * Wq(x, c);
        q[t * d_model + c] = s;
      }
      for (std::size_t c = 0; c < dkv; ++c) {
        double sk = 0, sv = 0;
        for (std::size_t x = 0; x < d_model; ++x) sk += double(X(b, t, x)) * Wk(x, c), sv += double(X(b, t, x)) * Wv(x, c);
        k[t * dkv + c] = sk, v[t * dkv + c] = sv;
      }
    }
    for (std::size_t head = 0; head < h; ++head) {
      const std::size_t kh = head / group;
      for (std::size_t i = 0; i < T; ++i) {
        double mx = -INFINITY, sum = 0;
        for (std::size_t j = 0; j <= i; ++j) {  // causal
          double s = 0;
          for (std::size_t c = 0; c < dh; ++c) s += q[i * d_model + head * dh + c] * k[j * dkv + kh * dh + c];
          p[j] = s / std::sqrt(double(dh));
          mx = std::max(mx, p[j]);
        }
        for (std::size_t j = 0; j <= i; ++j) sum += p[j] = std::exp(p[j] - mx);
        for (std::size_t c = 0; c < dh; ++c) {
          double o = 0;
          for (std::size_t j = 0; j <= i; ++j) o += p[j] / sum * v[j * dkv + kh * dh + c];
          cat[i * d_model + head * dh + c] = o;
        }
      }
    }
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t c = 0; c < d_model; ++c) {
        double s = 0;
        for (std::size_t x = 0; x < d_model; ++x) s += cat[t * d_model + x] * Wo(x, c);
        Y[(b * T + t) * d_model + c] = s;
      }
  }
  return Y;
}

// Multi-head self-attention with h_kv key/value heads (h_kv = h: the
// original; h_kv < h: grouped-query; h_kv = 1: multi-query).
void layer(const tensor<float, B, T, d_model>& X, const matrix<float, d_model, d_model>& Wq,
           const matrix<float, d_model, d_model>& Wo, std::size_t h_kv, unsigned seed) {
  matrix<float, dyn, dyn> Wk(d_model, h_kv * dh), Wv(d_model, h_kv * dh);
  for (std::size_t x = 0; x < d_model; ++x)
    for (std::size_t c = 0; c < h_kv * dh; ++c) {
      Wk(x, c) = float(((x * 31 + c * 17 + seed) % 101) / 101.0 - 0.5) / 8;
      Wv(x, c) = float(((x * 13 + c * 7 + seed) % 89) / 89.0 - 0.5) / 8;
    }

  // Self-attention: the three projections of one X (a [B] batch of T × d_model
  // times a matrix, broadcast over the batch).
  const tensor<float, B, T, d_model> Q = X * Wq;
  const tensor<float, dyn, dyn, dyn> K = X * Wk, V = X * Wv;

  // Multi-head: every head at once, heads read in place and written in place.
  tensor<float, B, T, d_model> concat;
  eval_into(heads(concat.data(), h),
            softmax(causal(heads(Q.data(), h) * transpose(heads(K.data(), h_kv)) / sqrt(dim<dh>))) *
                heads(V.data(), h_kv));
  const tensor<float, B, T, d_model> Y = concat * Wo;

  const std::vector<double> want = reference(X, Wq, Wk, Wv, Wo, h_kv);
  double err = 0, big = 0;
  for (std::size_t x = 0; x < want.size(); ++x) {
    err = std::max(err, std::abs(double(Y.data()[x]) - want[x]));
    big = std::max(big, std::abs(want[x]));
  }
  // The float result is three chained products of d_model terms and a softmax
  // away from the exact one: each product's error is within γ_d ≈ d·u of its
  // operands' magnitude (all O(1) here), so 4·d_model·u of the largest output
  // bounds the sum of them, with room for the softmax's few u.
  const double u = 0x1p-24, bound = 4 * double(d_model) * u * big;
  std::printf("h = %zu, h_kv = %zu: Y is %zu x %zu x %zu, max |Y - Y_float64| = %.3g (bound %.3g): %s\n", h, h_kv,
              Y.extent(0), Y.extent(1), Y.extent(2), err, bound,
              err <= bound ? "matches the float64 reference" : "DOES NOT MATCH");
}

}  // namespace

int main() {
  tensor<float, B, T, d_model> X;
  matrix<float, d_model, d_model> Wq, Wo;
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t c = 0; c < d_model; ++c) X(b, t, c) = float(std::sin(0.01 * double(t * d_model + c) + double(b)));
  for (std::size_t x = 0; x < d_model; ++x)
    for (std::size_t c = 0; c < d_model; ++c) {
      Wq(x, c) = float(((x * 7 + c * 3) % 97) / 97.0 - 0.5) / 8;
      Wo(x, c) = float(((x * 5 + c * 11) % 83) / 83.0 - 0.5) / 8;
    }
  std::printf("multi-head self-attention, B = %zu, T = %zu, d_model = %zu, kernels: %s\n", B, T, d_model,
              active_arch());
  layer(X, Wq, Wo, h, 1);      // multi-head
  layer(X, Wq, Wo, h / 4, 2);  // grouped-query: 4 query heads per key/value head
  layer(X, Wq, Wo, 1, 3);      // multi-query
}
