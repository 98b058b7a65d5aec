// One attention evaluation, T×T with head size d, by the route named:
//   qkv_one_call fused|naive|kernel T d [causal]
//   qkv_one_call heads-fused|heads-naive H T d     (H heads, a [1, H, T, d] tensor)
//   qkv_one_call backward T d [causal]              (vjp, then its pullback for dQ, dK, dV)
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

// The backward's memory: what vjp and its pullback add beyond Q, K, V and
// dO, less what they must hold (O and the row statistics, dQ, dK and dV).
int backward(std::size_t T, std::size_t d, bool is_causal) {
  using namespace qkv;
  matrix<float, dyn, dyn> Q(T, d), K(T, d), V(T, d), dO(T, d);
  for (auto* x : {&Q, &K, &V, &dO})
    for (std::size_t k = 0; k < x->size(); ++k) x->data()[k] = float(k % 13) / 13;
  const float dk = float(d);
  const auto run = [&](const auto& e) {
    const double before = peak_mib();
    const auto [O, back] = vjp(e);
    const auto [dQ, dK, dV] = back(dO, wrt(Q, K, V));
    const double added = peak_mib() - before;
    const double held = double((4 * T * d + 2 * T) * sizeof(float)) / (1 << 20);
    std::printf("backward T=%zu d=%zu%s (%s): O, row statistics, dQ, dK and dV %.1f MiB; vjp and the pullback "
                "added %.1f MiB, %.1f MiB beyond them; dQ(T-1, 0) = %g\n",
                T, d, is_causal ? " causal" : "", active_arch(), held, added, added - held, dQ(T - 1, 0) + 0 * O(0, 0));
    (void)dK, (void)dV;
  };
  if (is_causal) run(softmax(causal(Q * transpose(K) / sqrt(dk))) * V);
  else run(softmax(Q * transpose(K) / sqrt(dk)) * V);
  return 0;
}

int main(int argc, char** argv) {
  if ((argc == 4 || argc == 5) && std::strcmp(argv[1], "backward") == 0)
    return backward(std::strtoul(argv[2], nullptr, 10), std::strtoul(argv[3], nullptr, 10),
                    argc == 5 && std::strcmp(argv[4], "causal") == 0);
  if (argc == 5 && (std::strcmp(argv[1], "heads-fused") == 0 || std::strcmp(argv[1], "heads-naive") == 0)) {
    return heads(std::strcmp(argv[1], "heads-fused") == 0, std::strtoul(argv[2], nullptr, 10),
                 std::strtoul(argv[3], nullptr, 10), std::strtoul(argv[4], nullptr, 10));
  }
  const bool ok = (argc == 4 || argc == 5) && (std::strcmp(argv[1], "fused") == 0 ||
                                              std::strcmp(argv[1], "naive") == 0 || std::strcmp(argv[1], "kernel") == 0);
  if (!ok) {
    std::fprintf(stderr, "usage: qkv_one_call fused|naive|kernel T d [causal]\n"
                         "       qkv_one_call heads-fused|heads-naive H T d\n"
                         "       qkv_one_call backward T d [causal]\n");
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
    p.bounds.causal = is_causal;
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
