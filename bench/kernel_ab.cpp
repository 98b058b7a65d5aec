// tools/kernel_ab.sh's program: the fused attention kernel of a commit
// (base) against the working tree's (work), one thread, in one process. On
// a shared machine separate benchmark runs drift by 5-10% from minute to
// minute; here the two kernels alternate call by call on the same inputs, so
// drift falls on both, and the ratio of each adjacent pair of timings is one
// sample. It prints, per shape, each side's best and median time, the ratio
// of the bests, the median ratio with its quartiles, and the largest
// difference between the two outputs (0: the change kept every bit).
// On x86-64 it also prints each side's FLOPs per clock cycle, against the
// same measure of an FMA probe: such a machine's clock moves between levels
// 10% and more apart, which FLOPs per second take for the kernel's doing.
//   kernel_ab [rounds] [T d causal]...     (default: T = 256, 1024; d = 64, 128, 256)
#include <xsimd/xsimd.hpp>

#include <algorithm>
#include <array>
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
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(f * double(v.size() - 1))];
}

// The core's clock in GHz, from a chain of dependent 64-bit multiplies (3
// cycles each on x86-64 cores); 0 elsewhere.
double clock_ghz() {
#if defined(__x86_64__)
  constexpr long multiplies = 600000;
  long x = 1;
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < multiplies; i += 4)
    asm volatile("imul $3, %0, %0\n\timul $3, %0, %0\n\timul $3, %0, %0\n\timul $3, %0, %0" : "+r"(x));
  return 3.0 * multiplies / std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
#else
  return 0;
#endif
}

// FLOPs per cycle of the timing `run`, with the clock taken just before and
// after it; 0 where the clock moved between the two (or is not known).
template <class Run>
double per_cycle(double flops, Run run, double& microseconds) {
  const double before = clock_ghz();
  microseconds = run();
  const double after = clock_ghz();
  if (before == 0 || std::abs(after - before) > 0.02 * before) return 0;
  return flops / (microseconds * 1e3 * (before + after) / 2);
}

// Medians, over steady samples, of FLOPs per cycle (0: none).
double median_nonzero(std::vector<double> v) {
  v.erase(std::remove(v.begin(), v.end(), 0.0), v.end());
  return quantile(v, 0.5);
}

// 12 independent chains of FMAs on the widest vectors -march allows, as
// bench/fma_probe.cpp: what FLOPs per cycle measures for the core's peak.
double probe_per_cycle() {
  using batch = xsimd::batch<float>;
  constexpr std::size_t chains = 12, steps = 200000;  // about a millisecond: AVX-512 wakes up first
  std::array<batch, chains> acc;
  for (std::size_t c = 0; c < chains; ++c) acc[c] = batch(float(c) * 1e-3f);
  batch a(0.999999f), b(1e-7f);
  std::vector<double> samples;
  for (int r = 0; r < 50; ++r) {
    double us = 0;
    samples.push_back(per_cycle(2.0 * batch::size * chains * steps, [&] {
      asm volatile("" : "+m"(a), "+m"(b));
      const auto t0 = std::chrono::steady_clock::now();
      for (std::size_t step = 0; step < steps; ++step)
        for (std::size_t c = 0; c < chains; ++c) acc[c] = xsimd::fma(acc[c], a, b);
      for (auto& x : acc) asm volatile("" : "+m"(x));
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    }, us));
  }
  return median_nonzero(samples);
}

void compare(const shape& s, int rounds, double probe) {
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
  // FLOPs count 4·d per visible query-key pair, as the benchmarks do.
  const double pairs = s.causal ? double(s.t) * double(s.t + 1) / 2 : double(s.t) * double(s.t);
  const double flops = 4.0 * double(s.d) * pairs;
  const int calls = std::max(1, static_cast<int>(2e8 / flops));
  auto timing = [calls](void (*run)()) {
    return [calls, run] {
      const auto t0 = std::chrono::steady_clock::now();
      for (int c = 0; c < calls; ++c) run();
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls;
    };
  };
  std::vector<double> tb, tw, ratio, cb, cw;
  for (int r = 0; r < rounds; ++r) {
    // Which side goes first alternates, so that neither always follows the other.
    double b = 0, w = 0;
    if (r % 2 == 0) {
      cb.push_back(per_cycle(flops, timing(base.run), b));
      cw.push_back(per_cycle(flops, timing(work.run), w));
    } else {
      cw.push_back(per_cycle(flops, timing(work.run), w));
      cb.push_back(per_cycle(flops, timing(base.run), b));
    }
    tb.push_back(b), tw.push_back(w), ratio.push_back(b / w);
  }
  std::printf("T=%zu d=%zu%s: base %.1f us (median %.1f), work %.1f us (median %.1f); base/work: %.3f of the bests, "
              "%.3f median [%.3f, %.3f]; outputs differ by %.1e at most\n",
              s.t, s.d, s.causal ? " causal" : "", quantile(tb, 0), quantile(tb, 0.5), quantile(tw, 0),
              quantile(tw, 0.5), quantile(tb, 0) / quantile(tw, 0), quantile(ratio, 0.5), quantile(ratio, 0.25),
              quantile(ratio, 0.75), diff);
  const double pb = median_nonzero(cb), pw = median_nonzero(cw);
  if (probe > 0 && pb > 0 && pw > 0)
    std::printf("  FLOPs per cycle: base %.1f, work %.1f (%.0f%% and %.0f%% of the probe's %.1f)\n", pb, pw,
                100 * pb / probe, 100 * pw / probe, probe);
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
  const double probe = probe_per_cycle();
  for (const shape& s : shapes) compare(s, rounds, probe);
}
