// qkv::benchmark(e): what fusing buys for your own expression, on this
// machine. It evaluates e fused (where it has a fused form; else by the
// default strategy, which fuses the parts it can) and node by node,
// alternating, on the operands e holds, for about `seconds` of wall time,
// and reports the median times, the speed-up, GFLOP/s from cost(e), the
// bytes each evaluation held beyond its operands and output (measured:
// storage/allocation_meter.hpp), the largest difference between the two
// results, what ran (explain(e)), the kernels and the threads:
//   std::cout << qkv::benchmark(softmax(similarity(Q, K, my_sim)) * V);
#pragma once

#include "../kernels/api.hpp"
#include "../storage/allocation_meter.hpp"
#include "cost.hpp"
#include "eval.hpp"
#include "explain.hpp"
#include "fused.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace qkv {

struct benchmark_result {
  double fused_ms = 0, naive_ms = 0;  // medians of the timed runs
  double speedup = 0;                 // naive_ms / fused_ms
  double gflops = 0;                  // cost(e).flops over fused_ms
  std::size_t fused_bytes = 0, naive_bytes = 0;  // the most either held beyond operands and output
  double max_abs_diff = 0;            // between the two results (NaN where one has NaN and the other not)
  std::string path;                   // explain(e)
  std::string arch;                   // active_arch()
  std::size_t threads = 0;            // qkv::threads()
  std::size_t runs = 0;               // timed runs of each
};

namespace detail {

inline std::string byte_text(std::size_t b) {
  char s[32];
  if (b >= (std::size_t(1) << 20)) std::snprintf(s, sizeof s, "%.1f MiB", double(b) / double(1 << 20));
  else if (b >= 1024) std::snprintf(s, sizeof s, "%.1f KiB", double(b) / 1024);
  else std::snprintf(s, sizeof s, "%zu B", b);
  return s;
}

// The elements of a result (a matrix or a tensor, dense) as doubles.
template <class R>
double result_at(const R& r, std::size_t x) {
  return static_cast<double>(static_cast<compute_t<value_type_t<R>>>(r.data()[x]));
}
template <class R>
std::size_t result_size(const R& r) {
  if constexpr (requires { r.size(); }) return r.size();
  else return r.rows() * r.cols();
}

template <class R>
double largest_difference(const R& a, const R& b) {
  double d = 0;
  for (std::size_t x = 0; x < result_size(a); ++x) {
    const double u = result_at(a, x), v = result_at(b, x);
    if (std::isnan(u) && std::isnan(v)) continue;
    if (u == v) continue;  // (equal infinities too)
    const double e = std::fabs(u - v);
    if (!(e <= d)) d = e;  // NaN stays
    if (std::isnan(d)) break;
  }
  return d;
}

}  // namespace detail

// e evaluated both ways for about `seconds` (at least 3 timed runs of each
// after one untimed run of each).
template <expression E>
benchmark_result benchmark(const E& e, double seconds = 1.0) {
  if (!(seconds >= 0)) throw std::invalid_argument("qkv: benchmark(e, seconds): seconds must be a non-negative number");
  using clock = std::chrono::steady_clock;
  auto fused_out = eval(e), naive_out = fused_out;
  const auto fused_once = [&] {
    if constexpr (detail::has_fused_form<E>) eval_into(fused_out, e, fused);
    else eval_into(fused_out, e);
  };
  const auto naive_once = [&] { eval_into(naive_out, e, naive); };
  // One run: its time in ms and the bytes it held.
  const auto run = [](auto&& f, double& ms, std::size_t& bytes) {
    const long long base = detail::allocation_meter::begin();
    const auto t0 = clock::now();
    f();
    ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    const long long held = detail::allocation_meter::peak() - base;
    bytes = std::max(bytes, static_cast<std::size_t>(held > 0 ? held : 0));
  };
  benchmark_result r;
  double ms = 0;
  run(fused_once, ms, r.fused_bytes);
  run(naive_once, ms, r.naive_bytes);
  r.max_abs_diff = detail::largest_difference(fused_out, naive_out);
  std::vector<double> f, n;
  const auto start = clock::now();
  while (f.size() < 3 || std::chrono::duration<double>(clock::now() - start).count() < seconds) {
    run(fused_once, ms, r.fused_bytes), f.push_back(ms);
    run(naive_once, ms, r.naive_bytes), n.push_back(ms);
  }
  const auto median = [](std::vector<double>& x) {
    std::nth_element(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(x.size() / 2), x.end());
    return x[x.size() / 2];
  };
  r.runs = f.size();
  r.fused_ms = median(f), r.naive_ms = median(n);
  r.speedup = r.fused_ms > 0 ? r.naive_ms / r.fused_ms : std::numeric_limits<double>::infinity();
  r.gflops = r.fused_ms > 0 ? static_cast<double>(cost(e).flops) / (r.fused_ms * 1e6) : 0;
  r.path = explain(e);
  r.arch = kernels::active_arch();
  r.threads = kernels::threads();
  return r;
}

inline std::ostream& operator<<(std::ostream& os, const benchmark_result& r) {
  char line[160];
  const std::string first = r.path.substr(0, r.path.find('\n'));
  os << "qkv::benchmark: " << first << '\n';
  if (const auto at = r.path.find("your functors: "); at != std::string::npos)  // (explain's advice on the flags)
    os << "  " << r.path.substr(at, r.path.find('\n', at) - at) << '\n';
  std::snprintf(line, sizeof line, "  %-6s %12s %10s %14s\n", "", "median ms", "GFLOP/s", "bytes held");
  os << line;
  std::snprintf(line, sizeof line, "  %-6s %12.4g %10.3g %14s\n", "fused", r.fused_ms, r.gflops,
                detail::byte_text(r.fused_bytes).c_str());
  os << line;
  const double naive_gflops = r.naive_ms > 0 ? r.gflops * r.fused_ms / r.naive_ms : 0;
  std::snprintf(line, sizeof line, "  %-6s %12.4g %10.3g %14s\n", "naive", r.naive_ms, naive_gflops,
                detail::byte_text(r.naive_bytes).c_str());
  os << line;
  std::snprintf(line, sizeof line, "  speed-up %.3gx, largest difference %.3g, kernels %s, %zu thread%s, %zu runs each\n",
                r.speedup, r.max_abs_diff, r.arch.c_str(), r.threads, r.threads == 1 ? "" : "s", r.runs);
  return os << line;
}

}  // namespace qkv
