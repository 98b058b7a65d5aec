// The fused softmax's exponential (kernels/softmax_exp.hpp): 2^x within 1
// ulp wherever its result is a normal float, e^x within what a softmax's
// weights need, and exact at the values the softmax's invariants rest on (a
// masked key weighs 0, NaN poisons, the row maximum weighs 1).
#include "support.hpp"

#include <catch2/catch.hpp>

#include <qkv/kernels/arch_traits.hpp>
#include <qkv/kernels/softmax_exp.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

template <class T>
using batch = xsimd::batch<T, xsimd::default_arch>;

// f of every value, a vector at a time (tails padded with 0).
template <class T, class F>
std::vector<T> map(const std::vector<T>& x, F f) {
  constexpr std::size_t W = batch<T>::size;
  std::vector<T> in(x), out((x.size() + W - 1) / W * W);
  in.resize(out.size(), T(0));
  for (std::size_t i = 0; i < in.size(); i += W)
    f(batch<T>::load_unaligned(in.data() + i)).store_unaligned(out.data() + i);
  out.resize(x.size());
  return out;
}

std::vector<float> exp2_of(const std::vector<float>& x) {
  return map(x, [](batch<float> v) { return qkv::kernels::fast_exp2(v); });
}
template <class T>
std::vector<T> exp_of(const std::vector<T>& x) {
  return map(x, [](batch<T> v) { return qkv::kernels::softmax_exp(v); });
}

// |got − exact| in units of the last place of exact (a normal result).
template <class T>
double ulps(T got, long double exact) {
  const long double ulp = std::ldexp(1.0L, std::ilogb(static_cast<T>(exact)) - std::numeric_limits<T>::digits + 1);
  return static_cast<double>(std::abs(static_cast<long double>(got) - exact) / ulp);
}

// Floats spread evenly by bit pattern (so every binade is sampled alike)
// from `from` towards `to`, same sign.
std::vector<float> sweep(float from, float to, std::uint32_t step) {
  std::vector<float> x;
  const std::uint32_t a = std::bit_cast<std::uint32_t>(from), b = std::bit_cast<std::uint32_t>(to);
  for (std::uint32_t u = a; u <= b && u >= a; u += step) x.push_back(std::bit_cast<float>(u));
  x.push_back(to);
  return x;
}

template <class T, class F>
void check_special_values(F f) {
  constexpr T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  const std::vector<T> got = f(std::vector<T>{-inf, nan, -nan, T(0), -T(0), T(-1e4), inf});
  CHECK(got[0] == T(0));
  CHECK_FALSE(std::signbit(got[0]));
  CHECK(std::isnan(got[1]));
  CHECK(std::isnan(got[2]));
  CHECK(got[3] == T(1));
  CHECK(got[4] == T(1));
  CHECK(got[5] == T(0));
  CHECK(got[6] == inf);
}

}  // namespace

TEST_CASE("the softmax's exponential is exact where the softmax needs it", "[softmax][exp]") {
  check_special_values<float>(exp2_of);
  check_special_values<float>(exp_of<float>);
  check_special_values<double>(exp_of<double>);
  // Powers of 2 are exact; below the normal range a float flushes to 0.
  const std::vector<float> got = exp2_of({1.0f, -1.0f, -126.0f, 127.0f, -127.0f, -126.6f, -150.0f});
  CHECK(got[0] == 2.0f);
  CHECK(got[1] == 0.5f);
  CHECK(got[2] == std::ldexp(1.0f, -126));
  CHECK(got[3] == std::ldexp(1.0f, 127));
  for (std::size_t i = 4; i < got.size(); ++i) CHECK(got[i] == 0.0f);
}

TEST_CASE("fast_exp2 is within 1 ulp for floats", "[softmax][exp]") {
  // The polynomial is 0.03 ulp from 2^r; with fused multiply-adds Horner's
  // six roundings and the final product stay within 1 ulp (0.95 over every
  // float of [−126, 0]). AVX-512's form, a table of sixteenths and a
  // polynomial of degree 3, is 0.986 there and 0.992 over [0, 128). Without
  // FMA each step rounds twice: 1.19 at worst on this sample, so 1.5 there.
  const double bound = qkv::kernels::arch_traits<xsimd::default_arch>::has_fma ? 1.0 : 1.5;
  // Every 509th float of [−126, −0] and of [0, 127]: about 2.3 million, all
  // binades down to 2⁻¹⁴⁹ (where 2^x is 1 to within rounding). Under an
  // emulator, whose long double is software, every 4093rd: still every
  // binade, 290 thousand floats.
  const std::uint32_t step = test::emulated() ? 4093 : 509;
  for (const auto& x : {sweep(-0.0f, -126.0f, step), sweep(0.0f, 127.0f, step)}) {
    const std::vector<float> got = exp2_of(x);
    double worst = 0;
    float at = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double e = ulps(got[i], std::exp2(static_cast<long double>(x[i])));
      if (e > worst) worst = e, at = x[i];
    }
    INFO("worst at x = " << at);
    CHECK(worst <= bound);
  }
}

// e^x = 2^(x·log2 e): the product's rounding (|x|·2⁻²⁴ of e^x) and
// log2(e)'s as a float (0.23·|x|·2⁻²⁴) add to exp2's 1 ulp (1.5 without
// FMA); an ulp is at least 2⁻²⁴ of a value, so 1.25·|x| ulp bound them.
// AVX-512's form never rounds the product: 0.25·|x| there (19.8 ulp at
// x = −86.6 at worst on every 61st float of [−87, 0]).
TEST_CASE("softmax_exp for floats is e^x to what a weight needs", "[softmax][exp]") {
  const double bound = qkv::kernels::arch_traits<xsimd::default_arch>::has_fma ? 1.0 : 1.5;
  const double per_x = std::is_base_of_v<xsimd::avx512dq, xsimd::default_arch> ? 0.25 : 1.25;
  const std::vector<float> x = sweep(-0.0f, -87.0f, test::emulated() ? 4093 : 509);
  const std::vector<float> got = exp_of(x);
  double worst = 0;
  float at = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const long double exact = std::exp(static_cast<long double>(x[i]));
    const double allowed = bound + per_x * std::abs(x[i]);
    const double e = ulps(got[i], exact) / allowed;
    if (e > worst) worst = e, at = x[i];
  }
  INFO("worst at x = " << at);
  CHECK(worst <= 1.0);
}

// xsimd's exp, measured at 1.5 ulp at worst on these points.
TEST_CASE("softmax_exp for doubles is within 2 ulp", "[softmax][exp]") {
  std::vector<double> x;
  for (int k = 0; k <= 200000; ++k) x.push_back(-700.0 * k / 200000);
  for (int k = 0; k <= 2000; ++k) x.push_back(std::ldexp(-1.0, -k / 20));
  const std::vector<double> got = exp_of(x);
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, ulps(got[i], std::exp(static_cast<long double>(x[i]))));
  CHECK(worst <= 2.0);
}

// The degree-3 exponential of weights rounded to bf16 next: its polynomial
// is 1.02·10⁻⁴ from 2^r (2^−13.3), Horner's three roundings and the scaling
// add a few 2⁻²⁴, so 2⁻¹³ bounds it (tests/reference.hpp counts 2⁻¹³ per
// score for it); exact where the softmax needs it, as the degree-6 one.
TEST_CASE("the bf16 weights' exponential is within 2^-13 of 2^x", "[softmax][exp][half]") {
  const auto exp2_3 = [](const std::vector<float>& x) {
    return map(x, [](batch<float> v) { return qkv::kernels::fast_exp2<3>(v); });
  };
  check_special_values<float>(exp2_3);
  check_special_values<float>([](const std::vector<float>& x) {
    return map(x, [](batch<float> v) { return qkv::kernels::softmax_exp<3>(v); });
  });
  const std::vector<float> x = sweep(-0.0f, -126.0f, test::emulated() ? 4093 : 509);
  const std::vector<float> got = exp2_3(x);
  long double worst = 0;
  float at = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const long double exact = std::exp2(static_cast<long double>(x[i]));
    const long double e = std::abs(static_cast<long double>(got[i]) - exact) / exact;
    if (e > worst) worst = e, at = x[i];
  }
  INFO("worst relative error " << static_cast<double>(worst) << " at x = " << at);
  CHECK(worst <= std::ldexp(1.0L, -13));
  CHECK(worst > std::ldexp(1.0L, -14));  // the cheap polynomial is the one measured
}
