// Training what attention compares, with qkv::gradient and plain gradient
// descent: a "previous-token head". Each position of a sequence carries a
// random content vector and a one-hot position; the head must learn query
// and key projections Wq, Wk such that position i attends to position i − 1
// (position 0 to itself), so that O = softmax(causal(Q Kᵀ) / √a) X copies the
// previous token. Nothing in the content says which token came before: only
// the bilinear form qᵢ·kⱼ = xᵢ Wq Wkᵀ xⱼᵀ on the position parts can learn it.
//
// The loss is ½‖O − target‖²; its gradient with respect to O is O − target,
// the dO that gradient() takes. The attention's backward is the fused one.
#include <qkv/qkv.hpp>

#include <cmath>
#include <cstdio>
#include <random>

int main() {
  using namespace qkv;
  constexpr std::size_t T = 12, content = 6, d = content + T, a = 12;
  std::mt19937 gen(3);
  std::normal_distribution<double> normal(0, 1);

  matrix<double, T, d> X;
  for (std::size_t i = 0; i < T; ++i) {
    for (std::size_t c = 0; c < content; ++c) X(i, c) = normal(gen);
    X(i, content + i) = 1;  // the position
  }
  matrix<double, T, d> target;
  for (std::size_t i = 0; i < T; ++i)
    for (std::size_t c = 0; c < d; ++c) target(i, c) = X(i == 0 ? 0 : i - 1, c);

  matrix<double, d, a> Wq, Wk;
  for (std::size_t i = 0; i < d; ++i)
    for (std::size_t j = 0; j < a; ++j) Wq(i, j) = 0.1 * normal(gen), Wk(i, j) = 0.1 * normal(gen);

  const auto loss_and_grad = [&](matrix<double, T, d>& dO) {
    const auto e = softmax(causal((X * Wq) * transpose(X * Wk)) / sqrt(dim<a>)) * X;
    const auto [O, back] = vjp(e);
    double loss = 0;
    for (std::size_t i = 0; i < T; ++i)
      for (std::size_t c = 0; c < d; ++c) {
        dO(i, c) = O(i, c) - target(i, c);
        loss += 0.5 * dO(i, c) * dO(i, c);
      }
    return std::pair{loss, back(dO, wrt(Wq, Wk))};
  };

  const double rate = 0.1;
  double first = 0, last = 0;
  matrix<double, T, d> dO;
  for (int step = 0; step <= 300; ++step) {
    auto [loss, grads] = loss_and_grad(dO);
    auto& [dWq, dWk] = grads;
    if (step == 0) first = loss;
    last = loss;
    if (step % 100 == 0) std::printf("step %3d: loss %.6f\n", step, loss);
    for (std::size_t i = 0; i < d; ++i)
      for (std::size_t j = 0; j < a; ++j) Wq(i, j) -= rate * dWq(i, j), Wk(i, j) -= rate * dWk(i, j);
  }

  // Where each position now looks: the key of its largest weight.
  const auto P = eval(softmax(causal((X * Wq) * transpose(X * Wk)) / sqrt(dim<a>)));
  std::size_t right = 0;
  for (std::size_t i = 0; i < T; ++i) {
    std::size_t best = 0;
    for (std::size_t j = 1; j <= i; ++j) best = P(i, j) > P(i, best) ? j : best;
    right += best == (i == 0 ? 0 : i - 1);
  }
  std::printf("the loss fell from %.4f to %.4f; %zu of %zu positions attend most to the previous token\n", first,
              last, right, T);
  return last < first / 10 && right == T ? 0 : 1;
}
