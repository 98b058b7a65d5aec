// A tour of qkv along the lecture on scaled dot-product attention: the
// worked example (§5), self-test (d), the √dk variance argument measured (§4,
// self-test (c)), the gradient reaching the keys (§4(a)), self-test (b),
// the bill of self-test (e), fused against naive timing, and
// 2-byte inputs (the example in bf16 and f16, decoding from a 2-byte cache).
//   tour                 print everything
//   tour --csv DIR       also write the pictures' data into DIR, as CSV files
//                        (bench/plot.py --tour DIR draws them)
//   tour --max-t N       time sequence lengths up to N only (default 4096)
#include <qkv/qkv.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace qkv;

namespace {

using dmat = matrix<double, dyn, dyn>;

// One CSV file of the pictures' data: the header line, then what the caller
// prints into get(); closing it says where it went.
class csv_file {
 public:
  csv_file(const char* dir, const char* name, const char* header)
      : path_(std::string(dir) + "/" + name), f_(std::fopen(path_.c_str(), "w")) {
    if (f_ == nullptr) {
      std::fprintf(stderr, "tour: cannot write %s\n", path_.c_str());
      std::exit(1);
    }
    std::fprintf(f_, "%s\n", header);
  }
  csv_file(const csv_file&) = delete;
  csv_file& operator=(const csv_file&) = delete;
  ~csv_file() {
    std::fclose(f_);
    std::printf("  wrote %s\n", path_.c_str());
  }
  std::FILE* get() const { return f_; }

 private:
  std::string path_;
  std::FILE* f_;
};

// A CSV field in quotes, its own quotes doubled.
std::string csv_field(const std::string& s) {
  std::string q = "\"";
  for (char c : s) q += c == '"' ? "\"\"" : std::string(1, c);
  return q + "\"";
}

// The CPU's name as Linux reports it ("model name" on x86, "Model" on some
// Arm boards), or "unknown".
std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0 && line.rfind("Model", 0) != 0) continue;
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::size_t start = line.find_first_not_of(" \t", colon + 1);
    if (start != std::string::npos) return line.substr(start);
  }
  return "unknown";
}

// What the pictures were measured on: the CPU, the kernels, the threads and
// the build.
void write_machine(const char* dir) {
#if defined(__clang__)
  const std::string compiler = "Clang " __clang_version__;
#elif defined(__GNUC__)
  const std::string compiler = "GCC " __VERSION__;
#else
  const std::string compiler = "unknown compiler";
#endif
#ifdef __OPTIMIZE__
  std::string build = "optimised";
#else
  std::string build = "not optimised";
#endif
#ifdef NDEBUG
  build += ", NDEBUG";
#else
  build += ", assertions on";
#endif
  const csv_file out(dir, "machine.csv", "key,value");
  std::fprintf(out.get(), "cpu,%s\narch,%s\nthreads,%zu\ncompiler,%s\nbuild,%s\n", csv_field(cpu_name()).c_str(),
               csv_field(active_arch()).c_str(), threads(), csv_field(compiler).c_str(), csv_field(build).c_str());
}

template <class M>
void print_row(const char* label, const M& m, std::size_t row = 0) {
  std::printf("  %-36s (", label);
  for (std::size_t j = 0; j < m.cols(); ++j) std::printf(j ? ", %.6f" : "%.6f", m(row, j));
  std::printf(")\n");
}

void worked_example() {
  std::printf("§5  The worked example: three keys and values in d_k = d_v = 2, the query (1, 0)\n");
  const matrix<double, 3, 2> K{{1, 0}, {0, 1}, {1, 1}};
  const matrix<double, 3, 2> V{{10, 0}, {0, 10}, {5, 5}};
  const matrix<double, 1, 2> q{{1, 0}};
  print_row("scores      q K^T", eval(q * transpose(K)));
  print_row("scaled      q K^T / sqrt(2)", eval(q * transpose(K) / sqrt(dim<2>)));
  print_row("weights     softmax(q K^T / sqrt(2))", eval(softmax(q * transpose(K) / sqrt(dim<2>))));
  print_row("output      Attn(q, K, V)", eval(softmax(q * transpose(K) / sqrt(dim<2>)) * V));
  std::printf("  (the lecture rounds the weights to 0.401, 0.198, 0.401 first and prints (6.015, 3.985))\n");
  print_row("§5.1 weights without the scale", eval(softmax(q * transpose(K))));

  std::printf("\nSelf-test (d): the query (0, 1)\n");
  const matrix<double, 1, 2> q2{{0, 1}};
  print_row("weights", eval(softmax(q2 * transpose(K) / sqrt(dim<2>))));
  print_row("output", eval(softmax(q2 * transpose(K) / sqrt(dim<2>)) * V));
  std::printf("  Keys 2 and 3 tie for the largest weight: both have (0, 1)·k = 1, the mirror of §5.\n");
}

// n×d matrix of independent normal coordinates with variance sigma².
dmat normal(std::size_t n, std::size_t d, double sigma, std::mt19937_64& gen) {
  dmat x(n, d);
  const double two_pi = 6.283185307179586;
  for (std::size_t k = 0; k < n * d; k += 2) {  // Box-Muller: portable, unlike std::normal_distribution
    const double u1 = (double(gen() >> 11) + 1) / 9007199254740993.0, u2 = double(gen() >> 11) / 9007199254740992.0;
    const double r = sigma * std::sqrt(-2 * std::log(u1));
    x.data()[k] = r * std::cos(two_pi * u2);
    if (k + 1 < n * d) x.data()[k + 1] = r * std::sin(two_pi * u2);
  }
  return x;
}

double std_dev(const dmat& s) {
  double sum = 0, sq = 0;
  for (std::size_t k = 0; k < s.size(); ++k) sum += s.data()[k], sq += s.data()[k] * s.data()[k];
  const double mean = sum / double(s.size());
  return std::sqrt(sq / double(s.size()) - mean * mean);
}

// Mean over rows of the largest weight, and of the entropy in nats.
std::pair<double, double> concentration(const dmat& p) {
  double top = 0, entropy = 0;
  for (std::size_t i = 0; i < p.rows(); ++i) {
    double mx = 0, h = 0;
    for (std::size_t j = 0; j < p.cols(); ++j) {
      mx = std::max(mx, p(i, j));
      if (p(i, j) > 0) h -= p(i, j) * std::log(p(i, j));
    }
    top += mx, entropy += h;
  }
  return {top / double(p.rows()), entropy / double(p.rows())};
}

void variance_argument(const char* csv_dir) {
  constexpr std::size_t n = 256;
  std::printf("\n§4  Why divide by sqrt(d_k): %zu queries against %zu keys, coordinates N(0, 1)\n", n, n);
  std::printf("  (a uniform row of %zu weights has largest weight %.4f and entropy ln %zu = %.2f nats)\n", n, 1.0 / n,
              n, std::log(double(n)));
  std::printf("  %5s | %9s %12s | %-25s | %-21s\n", "d_k", "std(qk)", "std(qk/sqrt)", "largest weight raw/scaled",
              "entropy raw/scaled");
  std::mt19937_64 gen(2017);
  std::vector<std::string> weights;  // d_k = 64's first 24 queries against the first 24 keys, raw and scaled
  for (std::size_t dk : {2, 8, 64, 512}) {
    const dmat Q = normal(n, dk, 1, gen), K = normal(n, dk, 1, gen);
    const double s = std::sqrt(double(dk));
    const dmat raw = eval(Q * transpose(K)), scaled = eval(Q * transpose(K) / s);
    const auto [top_raw, h_raw] = concentration(eval(softmax(Q * transpose(K))));
    const auto [top_scaled, h_scaled] = concentration(eval(softmax(Q * transpose(K) / s)));
    std::printf("  %5zu | %9.3f %12.3f | %11.3f / %-11.3f | %9.2f / %-9.2f   (sqrt(d_k) = %.2f)\n", dk, std_dev(raw),
                std_dev(scaled), top_raw, top_scaled, h_raw, h_scaled, s);
    if (csv_dir != nullptr && dk == 64) {
      for (bool with_scale : {false, true}) {
        const dmat p = with_scale ? eval(softmax(Q * transpose(K) / s)) : eval(softmax(Q * transpose(K)));
        char line[96];
        for (std::size_t i = 0; i < 24; ++i)
          for (std::size_t j = 0; j < 24; ++j) {
            std::snprintf(line, sizeof line, "%zu,%zu,%s,%zu,%zu,%.6e", dk, n, with_scale ? "scaled" : "raw", i, j,
                          p(i, j));
            weights.emplace_back(line);
          }
      }
    }
  }
  if (csv_dir != nullptr) {
    const csv_file out(csv_dir, "weights.csv", "d_k,keys,scale,query,key,weight");
    for (const std::string& line : weights) std::fprintf(out.get(), "%s\n", line.c_str());
  }
  std::printf("  Unscaled, the scores spread as sqrt(d_k) and each row locks onto one key; scaled, they\n"
              "  keep unit variance and the weights stay spread out for every d_k.\n");

  std::printf("\nSelf-test (c): coordinates of variance sigma² = 4: Var(q·k) = sigma⁴·d_k, so divide by sigma²·sqrt(d_k)\n");
  for (std::size_t dk : {8, 64}) {
    const dmat Q = normal(n, dk, 2, gen), K = normal(n, dk, 2, gen);
    const double s = std::sqrt(double(dk));
    std::printf("  d_k = %3zu: std(qk) = %7.3f (sigma²·sqrt(d_k) = %6.2f), std(qk/sqrt(d_k)) = %.3f, std(qk/(sigma²·sqrt(d_k))) = %.3f\n",
                dk, std_dev(eval(Q * transpose(K))), 4 * s, std_dev(eval(Q * transpose(K) / s)),
                std_dev(eval(Q * transpose(K) / (4 * s))));
  }
}

// For each row of the scores s: the gradient mass reaching its scores other
// than the row's largest (its winner), Σ_{j ≠ w} |ds_ij|: the median over
// rows, and the share of rows where it is below 1e-6.
std::pair<double, double> losers(const dmat& s, const dmat& ds) {
  std::vector<double> mass;
  std::size_t dead = 0;
  for (std::size_t i = 0; i < s.rows(); ++i) {
    std::size_t w = 0;
    for (std::size_t j = 1; j < s.cols(); ++j) w = s(i, j) > s(i, w) ? j : w;
    double m = 0;
    for (std::size_t j = 0; j < s.cols(); ++j) m += j == w ? 0.0 : std::fabs(ds(i, j));
    mass.push_back(m);
    dead += m < 1e-6;
  }
  std::nth_element(mass.begin(), mass.begin() + mass.size() / 2, mass.end());
  return {mass[mass.size() / 2], double(dead) / double(s.rows())};
}

// §4(a): what backprop sends to the keys that lost, and self-test (b).
void gradient_argument(const char* csv_dir) {
  constexpr std::size_t n = 256, dv = 8;
  std::printf("\n§4(a)  The gradient that reaches the losing keys: %zu queries, %zu keys, coordinates N(0, 1), dO N(0, 1)\n", n, n);
  std::printf("  dS = gradient(softmax(S) * V, dO, wrt(S)); per row, the mass sum_{j != winner} |dS_ij|\n");
  std::printf("  %5s | %-25s | %-28s\n", "d_k", "median mass raw / scaled", "rows below 1e-6 raw / scaled");
  std::mt19937_64 gen(1905);
  std::vector<std::string> rows;
  for (std::size_t dk : {2, 8, 64, 512}) {
    const dmat Q = normal(n, dk, 1, gen), K = normal(n, dk, 1, gen), V = normal(n, dv, 1, gen), dO = normal(n, dv, 1, gen);
    const dmat raw = eval(Q * transpose(K)), scaled = eval(Q * transpose(K) / std::sqrt(double(dk)));
    const auto [d_raw] = gradient(softmax(raw) * V, dO, wrt(raw));
    const auto [d_scaled] = gradient(softmax(scaled) * V, dO, wrt(scaled));
    const auto [mass_raw, dead_raw] = losers(raw, d_raw);
    const auto [mass_scaled, dead_scaled] = losers(scaled, d_scaled);
    std::printf("  %5zu | %10.3g / %-12.3g | %10.0f %% / %.0f %%\n", dk, mass_raw, mass_scaled, 100 * dead_raw,
                100 * dead_scaled);
    char line[128];
    std::snprintf(line, sizeof line, "%zu,%zu,%.6e,%.6e,%.4f,%.4f", dk, n, mass_raw, mass_scaled, dead_raw,
                  dead_scaled);
    rows.emplace_back(line);
  }
  if (csv_dir != nullptr) {
    const csv_file out(csv_dir, "gradient.csv",
                       "d_k,rows,median_mass_raw,median_mass_scaled,share_below_1e-6_raw,share_below_1e-6_scaled");
    for (const std::string& line : rows) std::fprintf(out.get(), "%s\n", line.c_str());
  }
  std::printf("  Unscaled, the softmax saturates as d_k grows: the keys that lost a row get almost no gradient\n"
              "  from it. Scaled, the mass stays of one size for every d_k, and every key keeps learning.\n");

  std::printf("\nSelf-test (b): Q -> Attn(Q, K, V) is not linear (d_k = 8, 16 queries)\n");
  const dmat Q1 = normal(16, 8, 1, gen), Q2 = normal(16, 8, 1, gen), K = normal(32, 8, 1, gen), V = normal(32, 4, 1, gen);
  auto attn = [&](const dmat& q) { return dmat(eval(softmax(q * transpose(K) / sqrt(dim<8>)) * V)); };
  const dmat sum_in = attn(dmat(eval(Q1 + Q2))), sum_out = dmat(eval(attn(Q1) + attn(Q2)));
  const dmat twice_in = attn(dmat(eval(Q1 * 2.0))), twice_out = dmat(eval(attn(Q1) * 2.0));
  double additive = 0, homogeneous = 0;
  for (std::size_t i = 0; i < sum_in.rows(); ++i)
    for (std::size_t j = 0; j < sum_in.cols(); ++j) {
      additive = std::max(additive, std::fabs(sum_in(i, j) - sum_out(i, j)));
      homogeneous = std::max(homogeneous, std::fabs(twice_in(i, j) - twice_out(i, j)));
    }
  std::printf("  max |Attn(Q1 + Q2) - Attn(Q1) - Attn(Q2)| = %.3f, max |Attn(2 Q1) - 2 Attn(Q1)| = %.3f:\n"
              "  the weights depend on Q through the softmax, and each output row is a convex mix of V's rows.\n",
              additive, homogeneous);
}

template <std::size_t T, std::size_t D>
using head_t = decltype(softmax(std::declval<const matrix<float, T, D>&>() *
                                transpose(std::declval<const matrix<float, T, D>&>()) / sqrt(dim<D>)) *
                        std::declval<const matrix<float, T, D>&>());

void bill() {
  std::printf("\nSelf-test (e): T = 4096, d = 4096, as h = 32 heads of d_k = 128 or one head of 4096 (qkv::cost)\n");
  constexpr cost_estimate head = static_cost<head_t<4096, 128>>();
  constexpr cost_estimate single = static_cost<head_t<4096, 4096>>();
  std::printf("  %-20s %8s %14s %28s %22s\n", "", "GFLOP", "exponentials", "naive: score matrices", "fused: buffers");
  std::printf("  %-20s %8.1f %14.3g %14.0f MiB (%2.0f a head) %13.1f MiB a head\n", "h = 32, d_k = 128",
              32 * head.flops / 1e9, 32.0 * double(head.exps), 32 * head.naive_bytes / 1048576.0,
              head.naive_bytes / 1048576.0, head.fused_bytes / 1048576.0);
  std::printf("  %-20s %8.1f %14.3g %14.0f MiB %11s %13.1f MiB\n", "h = 1, d_k = 4096", single.flops / 1e9,
              double(single.exps), single.naive_bytes / 1048576.0, "", single.fused_bytes / 1048576.0);
  std::printf("  The products cost the same (4·T²·d); 32 heads pay 32 softmaxes and, all heads evaluated\n"
              "  naively at once, 32 score matrices: 2 GiB against 64 MiB. Fused, none is stored; what is\n"
              "  left is the packed K and V of the head at hand.\n");
}

template <class F>
double best_ms(F f, int runs) {
  double best = 1e300;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

void timing(const char* csv_dir, std::size_t max_t) {
  const std::size_t all_threads = threads();
  std::printf("\nFused against naive: softmax(Q K^T / sqrt(64)) V, n = m = T, d = 64, float, one thread, %s kernels\n"
              "(and fused on all %zu threads)\n",
              active_arch(), all_threads);
  std::printf("  %6s %12s %12s %9s %16s %16s %14s\n", "T", "fused ms", "naive ms", "speed-up", "fused MiB", "naive MiB",
              "fused, all ms");
  std::vector<std::string> rows;
  std::mt19937_64 gen(7);
  for (std::size_t T : {256, 512, 1024, 2048, 4096}) {
    if (T > max_t) break;
    if (isatty(fileno(stdout))) {  // progress, on a terminal
      std::printf("  %6zu  measuring...\r", T);
      std::fflush(stdout);
    }
    matrix<float, dyn, 64> Q(T), K(T), V(T), O(T);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto* x : {&Q, &K, &V})
      for (std::size_t k = 0; k < x->size(); ++k) x->data()[k] = u(gen);
    const auto e = softmax(Q * transpose(K) / sqrt(dim<64>)) * V;
    const int runs = T <= 1024 ? 5 : 3;
    set_threads(1);
    const double f = best_ms([&] { eval_into(O, e, fused); }, runs);
    const double nv = best_ms([&] { eval_into(O, e, naive); }, runs);
    set_threads(all_threads);
    const double fa = best_ms([&] { eval_into(O, e, fused); }, runs);
    const cost_estimate c = cost(e);
    std::printf("  %6zu %12.3f %12.3f %8.2fx %16.2f %16.2f %14.3f\n", T, f, nv, nv / f, c.fused_bytes / 1048576.0,
                c.naive_bytes / 1048576.0, fa);
    char line[160];
    std::snprintf(line, sizeof line, "%zu,64,%d,%.6f,%.6f,%.6f,%.4f,%.4f", T, runs, f, nv, fa,
                  c.fused_bytes / 1048576.0, c.naive_bytes / 1048576.0);
    rows.emplace_back(line);
  }
  if (csv_dir != nullptr) {
    const csv_file out(csv_dir, "timing.csv", "T,d,runs,fused_ms,naive_ms,fused_all_threads_ms,fused_mib,naive_mib");
    for (const std::string& line : rows) std::fprintf(out.get(), "%s\n", line.c_str());
  }
}

// A similarity of one's own, timed both ways in one call: qkv::benchmark.
void own_similarity(std::size_t max_t) {
  const std::size_t T = max_t < 1024 ? max_t : 1024;
  matrix<float, dyn, 64> Q(T), K(T), V(T);
  std::mt19937_64 gen(9);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto* x : {&Q, &K, &V})
    for (std::size_t k = 0; k < x->size(); ++k) x->data()[k] = u(gen);
  // The negative Manhattan distance (the Laplacian kernel), as docs/extending.md writes it.
  const auto neg_l1 = [](auto q, auto k) { return -xsimd::abs(q - k); };
  std::printf("\nYour own similarity, fused against naive in one call: qkv::benchmark(softmax(causal(similarity(Q, K, "
              "neg_l1))) * V), T = %zu\n",
              T);
  std::cout << benchmark(softmax(causal(similarity(Q, K, neg_l1))) * V, 0.3);
}

// The same attention on 2-byte inputs: computed in float, rounded once; and
// decoding from a 2-byte key/value cache, which reads half the bytes.
void two_byte(std::size_t max_t) {
  std::printf("\n2-byte inputs: §5 with K, V and q stored as bf16 and as f16 (all exact in both)\n");
  const matrix<bf16, 3, 2> K{{bf16(1), bf16(0)}, {bf16(0), bf16(1)}, {bf16(1), bf16(1)}};
  const matrix<bf16, 3, 2> V{{bf16(10), bf16(0)}, {bf16(0), bf16(10)}, {bf16(5), bf16(5)}};
  const matrix<bf16, 1, 2> q{{bf16(1), bf16(0)}};
  const auto e = softmax(q * transpose(K) / sqrt(dim<2>)) * V;
  matrix<float, 1, 2> wide;
  eval_into(wide, e);  // a float destination: the float result, unrounded
  const matrix<bf16, 1, 2> narrow = eval(e);  // rounded once to bf16
  const matrix<float, 1, 2> narrow_f{{float(narrow(0, 0)), float(narrow(0, 1))}};
  print_row("output in float", wide);
  print_row("output rounded to bf16 (8 bits)", narrow_f);
  const matrix<f16, 3, 2> Kh{{f16(1), f16(0)}, {f16(0), f16(1)}, {f16(1), f16(1)}};
  const matrix<f16, 3, 2> Vh{{f16(10), f16(0)}, {f16(0), f16(10)}, {f16(5), f16(5)}};
  const matrix<f16, 1, 2> qh{{f16(1), f16(0)}};
  const matrix<f16, 1, 2> half = eval(softmax(qh * transpose(Kh) / sqrt(dim<2>)) * Vh);
  print_row("output rounded to f16 (11 bits)", matrix<float, 1, 2>{{float(half(0, 0)), float(half(0, 1))}});
  std::printf("  explain(e):\n");
  const std::string how = explain(e);
  for (std::size_t at = 0, end; at < how.size(); at = end + 1) {
    end = std::min(how.find('\n', at), how.size());
    std::printf("    %s\n", how.substr(at, end - at).c_str());
  }
  if (max_t < 1024) return;

  // One float query over a long cache: K and V are read once, so their bytes set the time.
  const std::size_t m = 65536, d = 128;
  std::mt19937_64 gen(11);
  std::uniform_real_distribution<float> u(-1, 1);
  matrix<float, 1, dyn> q1(1, d), O(1, d);
  matrix<float, dyn, dyn> Kf(m, d), Vf(m, d);
  for (std::size_t k = 0; k < d; ++k) q1.data()[k] = u(gen);
  for (std::size_t k = 0; k < m * d; ++k) Kf.data()[k] = u(gen), Vf.data()[k] = u(gen);
  matrix<bf16, dyn, dyn> Kbf(m, d), Vbf(m, d);
  matrix<f16, dyn, dyn> Khf(m, d), Vhf(m, d);
  for (std::size_t k = 0; k < m * d; ++k) {
    Kbf.data()[k] = bf16(Kf.data()[k]), Vbf.data()[k] = bf16(Vf.data()[k]);
    Khf.data()[k] = f16(Kf.data()[k]), Vhf.data()[k] = f16(Vf.data()[k]);
  }
  const std::size_t all_threads = threads();
  set_threads(1);
  const float c = 1.0f / std::sqrt(float(d));
  const double t32 = best_ms([&] { eval_into(O, softmax(q1 * transpose(Kf) * c) * Vf); }, 5);
  const double tb = best_ms([&] { eval_into(O, softmax(q1 * transpose(Kbf) * c) * Vbf); }, 5);
  const double th = best_ms([&] { eval_into(O, softmax(q1 * transpose(Khf) * c) * Vhf); }, 5);
  set_threads(all_threads);
  std::printf("  Decoding one float query over %zu keys, d = %zu, one thread (best of 5):\n"
              "    float cache %.2f ms, bf16 cache %.2f ms (%.2fx), f16 cache %.2f ms (%.2fx)\n",
              m, d, t32, tb, tb / t32, th, th / t32);
}

}  // namespace

int main(int argc, char** argv) {
  const char* csv_dir = nullptr;
  std::size_t max_t = 4096;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
      csv_dir = argv[++i];
    } else if (std::strcmp(argv[i], "--max-t") == 0 && i + 1 < argc) {
      max_t = std::strtoul(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: tour [--csv DIR] [--max-t N]\n");
      return 2;
    }
  }
  if (csv_dir != nullptr) {
    std::error_code error;
    std::filesystem::create_directories(csv_dir, error);  // a failure shows when the first file is opened
  }
  worked_example();
  variance_argument(csv_dir);
  gradient_argument(csv_dir);
  bill();
  timing(csv_dir, max_t);
  own_similarity(max_t);
  two_byte(max_t);
  if (csv_dir != nullptr) {
    std::printf("\n");
    write_machine(csv_dir);
  }
  std::printf("\nkernels: %s\n", active_arch());
}
