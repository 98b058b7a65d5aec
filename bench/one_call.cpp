// One attention evaluation, T×T with head size d, by the route named:
//   qkv_one_call fused|naive|kernel T d [causal]
//   qkv_one_call heads-fused|heads-naive H T d     (H heads, a [1, H, T, d] tensor)
// It prints the peak resident memory the evaluation added beyond its inputs
// and output. Under `valgrind --tool=callgrind` the instruction counts of
// `fused` and `kernel` differ by what the expression layer costs.
#include <qkv/qkv.hpp>

#include <sys/resource.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {
double peak_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;  // kilobytes on Linux
}
}  // namespace

// H heads at once, as one batched expression: the lecture's self-test (e)
// is `heads-fused 32 4096 128` against `heads-fused 1 4096 4096`.
int heads(bool is_fused, std::size_t H, std::size_t T, std::size_t d) {
  using namespace qkv;
  tensor<float, dyn, dyn, dyn, dyn> Q(1, H, T, d), K(1, H, T, d), V(1, H, T, d), O(1, H, T, d);
  for (auto* x : {&Q, &K, &V, &O})
    for (std::size_t k = 0; k < x->size(); ++k) x->data()[k] = float(k % 13) / 13;
  const float dk = float(d);
  const auto e = softmax(Q * transpose(K) / sqrt(dk)) * V;
  const double before = peak_mib();
  if (is_fused) eval_into(O, e, fused);
  else eval_into(O, e, naive);
  const double after = peak_mib();
  const cost_estimate c = cost(e);
  std::printf("%s H=%zu T=%zu d=%zu (%s): inputs and output %.1f MiB, the evaluation added %.1f MiB "
              "(qkv::cost says %.1f MiB); %.3g GFLOP\n",
              is_fused ? "heads-fused" : "heads-naive", H, T, d, active_arch(),
              double(4 * H * T * d * sizeof(float)) / (1 << 20), after - before,
              double(is_fused ? c.fused_bytes : c.naive_bytes) / (1 << 20), double(c.flops) / 1e9);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 5 && (std::strcmp(argv[1], "heads-fused") == 0 || std::strcmp(argv[1], "heads-naive") == 0)) {
    return heads(std::strcmp(argv[1], "heads-fused") == 0, std::strtoul(argv[2], nullptr, 10),
                 std::strtoul(argv[3], nullptr, 10), std::strtoul(argv[4], nullptr, 10));
  }
  const bool ok = (argc == 4 || argc == 5) && (std::strcmp(argv[1], "fused") == 0 ||
                                              std::strcmp(argv[1], "naive") == 0 || std::strcmp(argv[1], "kernel") == 0);
  if (!ok) {
    std::fprintf(stderr, "usage: qkv_one_call fused|naive|kernel T d [causal]\n"
                         "       qkv_one_call heads-fused|heads-naive H T d\n");
    return 2;
  }
  const std::string route = argv[1];
  const std::size_t T = std::strtoul(argv[2], nullptr, 10), d = std::strtoul(argv[3], nullptr, 10);
  const bool is_causal = argc == 5 && std::strcmp(argv[4], "causal") == 0;
  using namespace qkv;
  matrix<float, dyn, dyn> Q(T, d), K(T, d), V(T, d), O(T, d);
  for (auto* x : {&Q, &K, &V, &O})
    for (std::size_t k = 0; k < x->size(); ++k) x->data()[k] = float(k % 13) / 13;  // touch every page
  const float dk = float(d);
  const double before = peak_mib();
  if (route == "kernel") {
    kernels::attention_problem<float> p;
    p.q = {Q.data(), T, d, std::ptrdiff_t(d), 1};
    p.k = {K.data(), T, d, std::ptrdiff_t(d), 1};
    p.v = {V.data(), T, d, std::ptrdiff_t(d), 1};
    p.out = {O.data(), T, d, std::ptrdiff_t(d), 1};
    p.scale = 1.0f / std::sqrt(dk);
    p.causal = is_causal;
    kernels::attention(p);
  } else if (route == "fused") {
    if (is_causal) eval_into(O, softmax(causal(Q * transpose(K) / sqrt(dk))) * V, fused);
    else eval_into(O, softmax(Q * transpose(K) / sqrt(dk)) * V, fused);
  } else {
    if (is_causal) eval_into(O, softmax(causal(Q * transpose(K) / sqrt(dk))) * V, naive);
    else eval_into(O, softmax(Q * transpose(K) / sqrt(dk)) * V, naive);
  }
  const double after = peak_mib();
  std::printf("%s T=%zu d=%zu%s (%s): inputs and output %.1f MiB, peak %.1f MiB, the evaluation added %.1f MiB; "
              "O(T-1, 0) = %g\n",
              route.c_str(), T, d, is_causal ? " causal" : "", active_arch(),
              double(4 * T * d * sizeof(float)) / (1 << 20), after, after - before, O(T - 1, 0));
}
