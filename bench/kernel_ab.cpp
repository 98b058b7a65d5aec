// tools/kernel_ab.sh's program: the fused attention kernel of a commit
// (base) against the working tree's (work), one thread, in one process. On
// a shared machine separate benchmark runs drift by 5-10% from minute to
// minute; here the two kernels alternate call by call on the same inputs, so
// drift falls on both, and the ratio of each adjacent pair of timings is one
// sample. It prints, per shape, each side's best and median time, the ratio
// of the bests, the median ratio with its quartiles, and the largest
// difference between the two outputs (0: the change kept every bit).
//   kernel_ab [rounds] [T d causal]...     (default: T = 256, 1024; d = 64, 128, 256)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernel_ab.hpp"

extern "C" kernel_ab::side kernel_ab_base();
extern "C" kernel_ab::side kernel_ab_work();

namespace {

struct shape {
  std::size_t t, d;
  bool causal;
};

double quantile(std::vector<double> v, double f) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(f * double(v.size() - 1))];
}

void compare(const shape& s, int rounds) {
  std::mt19937 gen(1);
  std::normal_distribution<float> normal;
  std::vector<float> q(s.t * s.d), k(q.size()), v(q.size()), out_base(q.size()), out_work(q.size());
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = normal(gen);
  const kernel_ab::side base = kernel_ab_base(), work = kernel_ab_work();
  base.set_up({q.data(), k.data(), v.data(), out_base.data(), s.t, s.d, s.causal});
  work.set_up({q.data(), k.data(), v.data(), out_work.data(), s.t, s.d, s.causal});
  base.run();
  work.run();
  double diff = 0;
  for (std::size_t i = 0; i < q.size(); ++i) diff = std::max(diff, double(std::abs(out_base[i] - out_work[i])));

  // Each timing covers about 2·10⁸ FLOPs (a few ms), so that the clock's
  // resolution does not matter and a timer interrupt lands in few of them.
  const double flops = 4.0 * double(s.t) * double(s.t) * double(s.d);
  const int calls = std::max(1, static_cast<int>(2e8 / flops));
  auto time = [calls](void (*run)()) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) run();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls;
  };
  std::vector<double> tb, tw, ratio;
  for (int r = 0; r < rounds; ++r) {
    // Which side goes first alternates, so that neither always follows the other.
    double b = 0, w = 0;
    if (r % 2 == 0) {
      b = time(base.run);
      w = time(work.run);
    } else {
      w = time(work.run);
      b = time(base.run);
    }
    tb.push_back(b), tw.push_back(w), ratio.push_back(b / w);
  }
  std::printf("T=%zu d=%zu%s: base %.1f us (median %.1f), work %.1f us (median %.1f); base/work: %.3f of the bests, "
              "%.3f median [%.3f, %.3f]; outputs differ by %.1e at most\n",
              s.t, s.d, s.causal ? " causal" : "", quantile(tb, 0), quantile(tb, 0.5), quantile(tw, 0),
              quantile(tw, 0.5), quantile(tb, 0) / quantile(tw, 0), quantile(ratio, 0.5), quantile(ratio, 0.25),
              quantile(ratio, 0.75), diff);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 40;
  std::vector<shape> shapes;
  for (int a = 2; a + 2 < argc; a += 3)
    shapes.push_back({std::size_t(std::atol(argv[a])), std::size_t(std::atol(argv[a + 1])), std::atoi(argv[a + 2]) != 0});
  if (shapes.empty())
    for (std::size_t t : {256, 1024})
      for (std::size_t d : {64, 128, 256}) shapes.push_back({t, d, false});
  for (const shape& s : shapes)
    if (rounds < 1 || s.t == 0 || s.d == 0) {
      std::fprintf(stderr, "kernel_ab: rounds, T and d must be at least 1\n");
      return 1;
    }
  for (const shape& s : shapes) compare(s, rounds);
}
