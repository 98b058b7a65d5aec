// Threads: results bit-identical whatever the number of threads, and calls
// from several user threads at once.
#include <catch2/catch.hpp>

#include "support.hpp"

#include <qkv/qkv.hpp>

#include <cstring>
#include <thread>
#include <vector>

using namespace qkv;

TEST_CASE("set_threads and threads", "[threads]") {
  test::threads_guard guard;
  set_threads(3);
  CHECK(threads() == 3);
  set_threads(1);
  CHECK(threads() == 1);
  set_threads(0);
  CHECK(threads() == std::max(1u, std::thread::hardware_concurrency()));
}

TEST_CASE("fused results are bit-identical with 1, 2 and 3 threads", "[threads]") {
  test::threads_guard guard;
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
  auto all = [&] {
    return std::vector<matrix<float, dyn, dyn>>{
        eval(softmax(Q * transpose(K) / sqrt(float(d))) * V),
        eval(softmax(causal(Q * transpose(K) / sqrt(float(d)) + B)) * V),
        eval(softmax(masked(Q * transpose(K), M)) * V),
    };
  };
  set_threads(1);
  const auto one = all();
  for (std::size_t t : {2, 3}) {
    set_threads(t);
    const auto many = all();
    for (std::size_t k = 0; k < one.size(); ++k) CHECK(test::same_bits(one[k], many[k]));
  }
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
