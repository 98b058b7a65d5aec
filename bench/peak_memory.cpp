// Peak resident memory of one attention evaluation, beyond its inputs and
// output: qkv_peak_memory fused|naive T d. Run once per strategy (a fresh
// process each, so the peaks do not mix).
#include <qkv/qkv.hpp>

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {
double peak_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;  // kilobytes on Linux
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 || (std::strcmp(argv[1], "fused") != 0 && std::strcmp(argv[1], "naive") != 0)) {
    std::fprintf(stderr, "usage: qkv_peak_memory fused|naive T d\n");
    return 2;
  }
  const std::size_t T = std::strtoul(argv[2], nullptr, 10), d = std::strtoul(argv[3], nullptr, 10);
  using namespace qkv;
  matrix<float, dyn, dyn> Q(T, d), K(T, d), V(T, d), O(T, d);
  for (auto* x : {&Q, &K, &V, &O})
    for (std::size_t k = 0; k < x->size(); ++k) x->data()[k] = float(k % 13) / 13;  // touch every page
  const double before = peak_mib();
  if (std::strcmp(argv[1], "fused") == 0) {
    eval_into(O, softmax(Q * transpose(K) / sqrt(float(d))) * V, fused);
  } else {
    eval_into(O, softmax(Q * transpose(K) / sqrt(float(d))) * V, naive);
  }
  const double after = peak_mib();
  std::printf("%s T=%zu d=%zu: inputs and output %.1f MiB, peak %.1f MiB, evaluation added %.1f MiB\n", argv[1], T,
              d, double(4 * T * d * sizeof(float)) / (1 << 20), after, after - before);
}
