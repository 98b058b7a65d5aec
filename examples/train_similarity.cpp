// Training a similarity, with qkv::gradient and plain gradient descent: a
// bilinear form qᵀ W k, soft-capped by a score_mod, learns which key each
// query belongs to. The keys are random vectors; each query is its key
// turned by a fixed rotation R, plus noise, so the plain dot product does not
// match them (qᵢ · kᵢ is no larger than qᵢ · kⱼ on average), but W = R does:
// qᵢᵀ R kᵢ ≈ ‖kᵢ‖². The values are one-hot, so row i of O is query i's
// weights, and the target is the identity.
//
// The loss is ½‖O − I‖²; its gradient with respect to O is O − I, the dO that
// gradient() takes. W's gradient comes through the products that
// bilinear(W) lowers to; the soft cap's derivative comes from calling the
// lambda on dual numbers: neither is written here.
#include <qkv/qkv.hpp>

#include <cmath>
#include <cstdio>
#include <random>

int main() {
  using namespace qkv;
  constexpr std::size_t T = 16, d = 8;
  std::mt19937 gen(5);
  std::normal_distribution<double> normal(0, 1);

  // R: an orthogonal matrix, Gram–Schmidt on a random one.
  matrix<double, d, d> R;
  for (std::size_t i = 0; i < d; ++i)
    for (std::size_t j = 0; j < d; ++j) R(i, j) = normal(gen);
  for (std::size_t i = 0; i < d; ++i) {
    for (std::size_t p = 0; p < i; ++p) {
      double dotp = 0;
      for (std::size_t j = 0; j < d; ++j) dotp += R(i, j) * R(p, j);
      for (std::size_t j = 0; j < d; ++j) R(i, j) -= dotp * R(p, j);
    }
    double norm = 0;
    for (std::size_t j = 0; j < d; ++j) norm += R(i, j) * R(i, j);
    for (std::size_t j = 0; j < d; ++j) R(i, j) /= std::sqrt(norm);
  }
  matrix<double, T, d> K, Q;
  for (std::size_t i = 0; i < T; ++i)
    for (std::size_t c = 0; c < d; ++c) K(i, c) = normal(gen);
  for (std::size_t i = 0; i < T; ++i)  // q_i = R k_i + noise: Q = K Rᵀ + noise
    for (std::size_t c = 0; c < d; ++c) {
      double s = 0;
      for (std::size_t j = 0; j < d; ++j) s += R(c, j) * K(i, j);
      Q(i, c) = s + 0.1 * normal(gen);
    }
  matrix<double, T, T> V, target;
  for (std::size_t i = 0; i < T; ++i) V(i, i) = target(i, i) = 1;

  const auto cap = [](auto s, auto, auto) { using std::tanh; return 8.0 * tanh(s / 8.0); };
  matrix<double, d, d> W;  // zeros: every query attends to every key alike
  const auto attention = [&] { return softmax(score_mod(similarity(Q, K, bilinear(W)) / sqrt(dim<d>), cap)) * V; };

  // How many queries attend most to their own key (row i of O: query i's weights).
  const auto retrieved = [&](const auto& O) {
    std::size_t right = 0;
    for (std::size_t i = 0; i < T; ++i) {
      std::size_t best = 0;
      for (std::size_t j = 1; j < T; ++j)
        if (O(i, j) > O(i, best)) best = j;
      right += best == i;
    }
    return right;
  };
  std::printf("the dot product alone: %zu of %zu queries attend most to their key\n",
              retrieved(eval(softmax(Q * transpose(K) / sqrt(dim<d>)) * V)), T);

  const double rate = 2.0;
  double first = 0, last = 0;
  matrix<double, T, T> dO;
  for (int step = 0; step <= 200; ++step) {
    const auto O = eval(attention());
    double loss = 0;
    for (std::size_t i = 0; i < T; ++i)
      for (std::size_t j = 0; j < T; ++j) {
        dO(i, j) = O(i, j) - target(i, j);
        loss += 0.5 * dO(i, j) * dO(i, j);
      }
    if (step == 0) first = loss;
    last = loss;
    if (step % 50 == 0) std::printf("step %3d: loss %.6f\n", step, loss);
    const auto [dW] = gradient(attention(), dO, wrt(W));
    for (std::size_t i = 0; i < d; ++i)
      for (std::size_t j = 0; j < d; ++j) W(i, j) -= rate * dW(i, j);
  }
  // How close W has come to R's direction: the cosine of the two as vectors.
  double wr = 0, ww = 0, rr = 0;
  for (std::size_t i = 0; i < d; ++i)
    for (std::size_t j = 0; j < d; ++j) wr += W(i, j) * R(i, j), ww += W(i, j) * W(i, j), rr += R(i, j) * R(i, j);
  const std::size_t right = retrieved(eval(attention()));
  std::printf("loss %.4f -> %.4f; W against R: cosine %.3f\n", first, last, wr / std::sqrt(ww * rr));
  std::printf("%zu of %zu queries attend most to their key\n", right, T);
  // Success: every query finds its key, and the loss fell at least fivefold.
  return right == T && last < 0.2 * first ? 0 : 1;
}
