// Instruction set names: one per set, the same for QKV_ARCH, set_arch and
// active_arch, and bad names are exceptions the caller can catch.
#include <catch2/catch.hpp>

#include <qkv/kernels/attention_with.hpp>
#include <qkv/qkv.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>

using namespace qkv;

namespace {

// Puts back the instruction set this run started with (QKV_ARCH's, or the
// best), so that a run forced through QKV_ARCH stays on it for the tests after.
struct restore_arch {
  ~restore_arch() {
    const char* env = std::getenv("QKV_ARCH");
    try {
      set_arch(env == nullptr ? "" : env);
    } catch (const std::exception&) {
      // A bad QKV_ARCH: the run is the [arch_env] one, which checks that error itself.
    }
  }
};

// One small attention, evaluated with `strategy`: something that needs the
// kernels. Its (0, 0) is (e·1 + 1·3) / (e + 1).
template <class Strategy>
float attend(Strategy strategy) {
  const matrix<float, 2, 2> Q{{1, 0}, {0, 1}}, K{{1, 0}, {0, 1}}, V{{1, 2}, {3, 4}};
  return eval(softmax(Q * transpose(K)) * V, strategy)(0, 0);
}

// Whether x is that value: the scores 1 and 0 are exact, exp is within 1.5
// ulp (xsimd's; the fused kernel's 2^x within 1.5 with log2(e)'s rounding),
// the two-term sums and the division add at most an ulp each, so 8 ulps
// bound the error with room.
bool attends_right(float x) {
  const long double e = std::exp(1.0L), expected = (e + 3) / (e + 1);
  return std::abs(x - expected) <= 8 * std::numeric_limits<float>::epsilon() * expected;
}

}  // namespace

TEST_CASE("active_arch returns a name set_arch accepts", "[arch]") {
  const restore_arch restore;
  const std::string active = active_arch();
  REQUIRE(kernels::arch_index(active) < kernels::arch_count);
  REQUIRE_NOTHROW(set_arch(active));
  CHECK(active_arch() == active);
}

TEST_CASE("every instruction set this CPU runs round-trips through set_arch and active_arch", "[arch]") {
  const restore_arch restore;
  std::size_t runs = 0;
  for (std::size_t i = 0; i < kernels::arch_count; ++i) {
    const std::string name(kernels::arch_names[i]);
    INFO("instruction set " << name);
    CHECK(kernels::arch_index(name) == i);
    if (kernels::arch_runs_here(i)) {
      ++runs;
      REQUIRE_NOTHROW(set_arch(name));
      CHECK(active_arch() == name);
      CHECK(kernels::active_arch_index() == i);
      CHECK(attends_right(attend(naive)));  // its kernels run
      CHECK(attends_right(attend(fused)));
    } else {
      // Ours, but not for this CPU or build: a runtime_error, not an invalid name.
      CHECK_THROWS_AS(set_arch(name), std::runtime_error);
      CHECK_THROWS_WITH(set_arch(name), Catch::Contains("has no " + name));
    }
  }
  CHECK(runs >= 1);
  // "" picks the best this CPU runs: the first of the list it runs.
  set_arch("");
  CHECK(kernels::arch_runs_here(kernels::active_arch_index()));
  for (std::size_t i = 0; i < kernels::active_arch_index(); ++i) CHECK_FALSE(kernels::arch_runs_here(i));
}

TEST_CASE("a name that is not an instruction set is invalid_argument naming the valid ones", "[arch]") {
  const restore_arch restore;
  set_arch("");
  const std::string before = active_arch();
  for (const char* bad : {"avx512", "fma3<avx2>", "AVX2", "none", " sse2"}) {
    INFO("set_arch(\"" << bad << "\")");
    CHECK_THROWS_AS(set_arch(bad), std::invalid_argument);
    for (const std::string_view name : kernels::arch_names)
      CHECK_THROWS_WITH(set_arch(bad), Catch::Contains(std::string(name)));
    CHECK(active_arch() == before);  // a failed call changes nothing
  }
}

TEST_CASE("runs_like_library compares the unit's architecture with the active one", "[arch]") {
  const restore_arch restore;
  using unit = xsimd::default_arch;
  constexpr std::size_t index = kernels::arch_index_of<unit>;
  STATIC_REQUIRE(kernels::arch_index_of<xsimd::fma3<xsimd::avx2>> == kernels::arch_index("avx2"));
  STATIC_REQUIRE(kernels::arch_index_of<xsimd::avx> == kernels::arch_count);  // no kernels of ours
  // Two sets run AVX-512's xsimd architecture: a unit built for it runs like either.
  STATIC_REQUIRE(kernels::arch_is<xsimd::avx512bw>(kernels::arch_index("avx512bf16")));
  STATIC_REQUIRE(kernels::arch_is<xsimd::avx512bw>(kernels::arch_index("avx512bw")));
  STATIC_REQUIRE(!kernels::arch_is<xsimd::avx512bw>(kernels::arch_index("avx2")));
  for (std::size_t i = 0; i < kernels::arch_count; ++i) {
    if (!kernels::arch_runs_here(i)) continue;
    set_arch(kernels::arch_names[i]);
    INFO("active " << active_arch() << ", unit index " << index);
    CHECK(kernels::runs_like_library<unit>() == kernels::arch_is<unit>(i));
  }
}

// Registered with ctest as arch_env_bad_name, with QKV_ARCH=avx512 (not a name
// of ours): the error reaches the caller of eval, which can catch it, and
// set_arch recovers. Hidden: a normal run has no bad QKV_ARCH.
TEST_CASE("a bad QKV_ARCH is invalid_argument from each evaluation until set_arch", "[.][arch_env]") {
  const char* env = std::getenv("QKV_ARCH");
  INFO("run with QKV_ARCH set to a name that is not an instruction set (ctest does)");
  REQUIRE(env != nullptr);
  REQUIRE(kernels::arch_index(env) == kernels::arch_count);

  CHECK(std::string(active_arch()) == "none");
  CHECK(kernels::active_arch_index() == kernels::arch_count);
  CHECK_THROWS_AS(attend(naive), std::invalid_argument);
  CHECK_THROWS_AS(attend(fused), std::invalid_argument);
  CHECK_THROWS_WITH(attend(fused), Catch::Contains("QKV_ARCH") && Catch::Contains(env) && Catch::Contains("avx2"));
  // A user predicate runs in this unit and calls the kernels from the pool's threads.
  const matrix<float, 3, 2> X{{1, 0}, {0, 1}, {1, 1}};
  const auto pred = [](std::size_t i, std::size_t j) { return i >= j; };
  CHECK_THROWS_AS(eval(softmax(masked(X * transpose(X), pred)) * X, fused), std::invalid_argument);

  set_arch("");
  CHECK(std::string(active_arch()) != "none");
  CHECK(attends_right(attend(fused)));
}

// The bf16 pair kernel runs only where AVX512-BF16 does, and QKV_BF16_PAIRS
// (forced_bf16_pairs sets it to 1) decides over the measured choice.
TEST_CASE("bf16 pairs run only on avx512bf16, as QKV_BF16_PAIRS says", "[arch][half]") {
  if (kernels::bf16_pairs_active()) CHECK(std::string(active_arch()) == "avx512bf16");
  const char* env = std::getenv("QKV_BF16_PAIRS");
  if (env != nullptr && std::string(active_arch()) == "avx512bf16")
    CHECK(kernels::bf16_pairs_active() == (std::string(env) == "1"));
}

// Registered with ctest as pairs_env_bad_value, with QKV_BF16_PAIRS=yes:
// each evaluation that needs the kernels throws, as for a bad QKV_ARCH.
TEST_CASE("a QKV_BF16_PAIRS other than 0 or 1 is invalid_argument", "[.][pairs_env]") {
  const char* env = std::getenv("QKV_BF16_PAIRS");
  INFO("run with QKV_BF16_PAIRS set to a value that is not 0 or 1 (ctest does)");
  REQUIRE(env != nullptr);
  CHECK(std::string(active_arch()) == "none");
  CHECK_FALSE(kernels::bf16_pairs_active());
  CHECK_THROWS_AS(attend(fused), std::invalid_argument);
  CHECK_THROWS_WITH(attend(fused), Catch::Contains("QKV_BF16_PAIRS") && Catch::Contains(env));
}
