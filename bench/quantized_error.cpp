// How far a q8 or q4 cache moves attention from the float cache's result:
// softmax(Q Kᵀ / √d) V with K, V or both quantized, on inputs drawn from a
// normal distribution, and on the same with a few outlier channels (4 of
// every 128, 20 times the rest, as activations of large models have them).
// Prints the largest and the mean absolute difference, and the root mean
// square of the float result for scale. The quantized result is the float
// attention over the values the codes stand for (tests/quantized_test.cpp),
// so these differences are the formats', not the kernels'.
//   build/bench/qkv_quantized_error [n m d]     (default 64 4096 128)
#include <qkv/qkv.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

namespace {

using namespace qkv;
using M = matrix<float, dyn, dyn>;

M normal(std::size_t rows, std::size_t cols, bool outliers, std::mt19937& gen) {
  std::normal_distribution<float> z(0, 1);
  M x(rows, cols);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t c = 0; c < cols; ++c) x(i, c) = z(gen) * (outliers && c % 32 == 7 ? 20.0f : 1.0f);
  return x;
}

struct difference {
  double largest = 0, mean = 0;
};

difference against(const M& got, const M& want) {
  difference d;
  for (std::size_t k = 0; k < got.size(); ++k) {
    const double e = std::fabs(double(got.data()[k]) - double(want.data()[k]));
    d.largest = std::fmax(d.largest, e);
    d.mean += e / double(got.size());
  }
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t n = argc > 3 ? std::strtoul(argv[1], nullptr, 10) : 64;
  const std::size_t m = argc > 3 ? std::strtoul(argv[2], nullptr, 10) : 4096;
  const std::size_t d = argc > 3 ? std::strtoul(argv[3], nullptr, 10) : 128;
  std::printf("n = %zu queries, m = %zu keys, d = %zu; |quantized - float| of softmax(Q K^T / sqrt(d)) V\n\n", n, m, d);
  std::printf("| inputs | quantized | q8 largest | q8 mean | q4 largest | q4 mean | rms of O |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (bool outliers : {false, true}) {
    std::mt19937 gen(outliers ? 2 : 1);
    const M Q = normal(n, d, false, gen), K = normal(m, d, outliers, gen), V = normal(m, d, outliers, gen);
    const float scale = 1 / std::sqrt(float(d));
    const M O = eval(softmax(Q * transpose(K) * scale) * V);
    double rms = 0;
    for (std::size_t k = 0; k < O.size(); ++k) rms += double(O.data()[k]) * O.data()[k] / double(O.size());
    const auto K8 = quantize<q8>(K), V8 = quantize<q8>(V);
    const auto K4 = quantize<q4>(K), V4 = quantize<q4>(V);
    const difference rows[3][2] = {
        {against(eval(softmax(Q * transpose(K8) * scale) * V), O), against(eval(softmax(Q * transpose(K4) * scale) * V), O)},
        {against(eval(softmax(Q * transpose(K) * scale) * V8), O), against(eval(softmax(Q * transpose(K) * scale) * V4), O)},
        {against(eval(softmax(Q * transpose(K8) * scale) * V8), O), against(eval(softmax(Q * transpose(K4) * scale) * V4), O)}};
    const char* which[3] = {"K", "V", "K and V"};
    for (std::size_t r = 0; r < 3; ++r)
      std::printf("| %s | %s | %.2g | %.2g | %.2g | %.2g | %.2g |\n", outliers ? "normal, 1 channel in 32 at 20x" : "normal",
                  which[r], rows[r][0].largest, rows[r][0].mean, rows[r][1].largest, rows[r][1].mean, std::sqrt(rms));
  }
}
