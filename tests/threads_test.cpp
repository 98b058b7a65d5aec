// Threads: results bit-identical whatever the number of threads, and calls
// from several user threads at once.
#include <catch2/catch.hpp>

#include <sched.h>

#include "laws.hpp"
#include "support.hpp"

#include <qkv/qkv.hpp>

#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

using namespace qkv;

namespace {

// The CPUs this process may run on by its affinity mask (taskset, mpirun's binding).
std::size_t affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return std::max(1u, std::thread::hardware_concurrency());
  return static_cast<std::size_t>(CPU_COUNT(&set));
}
// Whether a cgroup (v2) sets a CPU quota here.
bool cgroup_quota() {
  std::ifstream f("/sys/fs/cgroup/cpu.max");
  std::string q;
  return f && (f >> q) && q != "max";
}

}  // namespace

TEST_CASE("set_threads and threads; by default the CPUs the process may run on", "[threads][affinity]") {
  test::threads_guard guard;
  set_threads(3);
  CHECK(threads() == 3);
  set_threads(1);
  CHECK(threads() == 1);
  set_threads(0);
  // (ctest threads_under_taskset runs this under taskset -c 0: 1 thread.)
  CHECK(threads() >= 1);
  CHECK(threads() <= affinity_cpus());
  if (!cgroup_quota()) CHECK(threads() == affinity_cpus());
}

TEST_CASE("fused results are bit-identical with 1, 2 and 3 threads", "[threads]") {
  // Each expression through the laws (tests/laws.hpp), which evaluate it
  // with 1, 2 and 3 threads and compare the bits, besides the reference.
  const auto [n, m, d] = GENERATE(table<std::size_t, std::size_t, std::size_t>({
      {200, 200, 64}, {129, 300, 17}, {64, 64, 8}, {333, 1000, 32}, {3, 500, 64},
  }));
  INFO("n = " << n << ", m = " << m << ", d = " << d);
  ref::rng rng(41);
  matrix<float, dyn, dyn> Q(n, d), K(m, d), V(m, d), B(n, m);
  rng.fill(Q);
  rng.fill(K);
  rng.fill(V);
  rng.fill(B);
  matrix<bool, dyn, dyn> M(n, m);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) M(i, j) = rng.coin(0.6);
  const float root = sqrt(float(d));
  using R = ref::real_for<float>;
  using rm = const ref::mat_for<float>&;
  const R rs = 1 / static_cast<R>(root);
  auto expect = [](rm q, rm k, rm v, R scale, rm s) {
    const ref::mat_for<float> p = ref::softmax(s);
    return test::expected{ref::matmul(p, v), ref::attention_bound<float>(q, k, v, scale, s, p)};
  };
  auto scores = [](rm q, rm k, R scale) {
    return ref::scale(ref::matmul(q, ref::transpose(k)), scale);
  };
  test::check_laws<float>(
      std::tuple{
          test::law{"softmax(Q Kᵀ / √d) V",
                    [&](auto& q, auto& k, auto& v, auto&, auto&) { return softmax(q * transpose(k) / root) * v; },
                    [&](rm q, rm k, rm v, rm, rm) { return expect(q, k, v, rs, scores(q, k, rs)); }},
          test::law{"softmax(causal(Q Kᵀ / √d + B)) V",
                    [&](auto& q, auto& k, auto& v, auto& b, auto&) {
                      return softmax(causal(q * transpose(k) / root + b)) * v;
                    },
                    [&](rm q, rm k, rm v, rm b, rm) {
                      ref::mat_for<float> s = scores(q, k, rs);
                      for (std::size_t x = 0; x < s.v.size(); ++x) s.v[x] += b.v[x];
                      return expect(q, k, v, rs, ref::causal(s));
                    }},
          test::law{"softmax(masked(Q Kᵀ, M)) V",
                    [&](auto& q, auto& k, auto& v, auto&, auto& mask) { return softmax(masked(q * transpose(k), mask)) * v; },
                    [&](rm q, rm k, rm v, rm, rm mask) { return expect(q, k, v, 1, ref::masked(scores(q, k, 1), mask)); }},
      },
      Q, K, V, B, M);
}

TEST_CASE("evaluations from several user threads at once", "[threads]") {
  test::threads_guard guard;
  set_threads(2);
  ref::rng rng(42);
  matrix<float, dyn, dyn> Q(300, 32), K(400, 32), V(400, 32);
  rng.fill(Q);
  rng.fill(K);
  rng.fill(V);
  const auto want = eval(softmax(causal(Q * transpose(K))) * V);
  std::vector<matrix<float, dyn, dyn>> got(4);
  std::vector<std::thread> users;
  for (std::size_t u = 0; u < got.size(); ++u)
    users.emplace_back([&, u] {
      for (int rep = 0; rep < 5; ++rep) got[u] = eval(softmax(causal(Q * transpose(K))) * V);
    });
  for (std::thread& t : users) t.join();
  for (const auto& g : got) CHECK(test::same_bits(g, want));
}
