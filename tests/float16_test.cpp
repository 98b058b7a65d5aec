// bf16 and f16 conversions: every f16 and every bf16 value, every halfway
// case between neighbours, overflow, subnormals, NaN, and the double path's
// single rounding. The reference values are computed independently, in
// double arithmetic, from the bit layouts.
#include <qkv/qkv.hpp>

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>

using qkv::bf16;
using qkv::f16;

namespace {

// The value an f16 bit pattern stands for, from its fields.
double f16_value(std::uint16_t b) {
  const int e = (b >> 10) & 0x1f, m = b & 0x3ff;
  const double s = (b & 0x8000) ? -1.0 : 1.0;
  if (e == 0x1f) return m ? std::numeric_limits<double>::quiet_NaN() : s * std::numeric_limits<double>::infinity();
  if (e == 0) return s * std::ldexp(m, -24);
  return s * std::ldexp(1024 + m, e - 25);
}

double bf16_value(std::uint16_t b) {
  const int e = (b >> 7) & 0xff, m = b & 0x7f;
  const double s = (b & 0x8000) ? -1.0 : 1.0;
  if (e == 0xff) return m ? std::numeric_limits<double>::quiet_NaN() : s * std::numeric_limits<double>::infinity();
  if (e == 0) return s * std::ldexp(m, -133);
  return s * std::ldexp(128 + m, e - 134);
}

float next_up(float x) { return std::nextafter(x, std::numeric_limits<float>::infinity()); }
float next_down(float x) { return std::nextafter(x, -std::numeric_limits<float>::infinity()); }

// For every pair of neighbouring finite positive values of T (bit patterns
// b and b + 1) and their negatives: the midpoint, exact in float, rounds to
// the one with the even pattern; a float either side of it rounds to the
// nearer one.
template <class T>
void check_halfway_cases(std::uint16_t last_finite) {
  std::size_t checked = 0;
  for (std::uint32_t b = 0; b < last_finite; ++b) {
    for (const std::uint16_t sign : {std::uint16_t(0), std::uint16_t(0x8000)}) {
      const auto lo = static_cast<std::uint16_t>(b | sign), hi = static_cast<std::uint16_t>((b + 1) | sign);
      const float a = T::from_bits(lo), c = T::from_bits(hi);
      const float mid = static_cast<float>((static_cast<double>(a) + static_cast<double>(c)) / 2);
      REQUIRE(static_cast<double>(mid) == (static_cast<double>(a) + static_cast<double>(c)) / 2);  // exact
      const std::uint16_t even = (lo & 1) == 0 ? lo : hi;
      if (T(mid).bits() != even) FAIL("midpoint of patterns " << lo << " and " << hi << " rounds to " << T(mid).bits());
      const float below = sign ? next_up(mid) : next_down(mid), above = sign ? next_down(mid) : next_up(mid);
      if (T(below).bits() != lo || T(above).bits() != hi) FAIL("near the midpoint of " << lo << " and " << hi);
      ++checked;
    }
  }
  CHECK(checked == 2u * last_finite);
}

}  // namespace

TEST_CASE("f16: all 65536 values convert to float exactly and back to the same bits", "[half]") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float x = f16::from_bits(bits);
    const double want = f16_value(bits);
    if (std::isnan(want)) {
      if (!std::isnan(x) || std::signbit(x) != bool(bits & 0x8000) || !std::isnan(float(f16(x))))
        FAIL("NaN pattern " << b);
      continue;
    }
    if (static_cast<double>(x) != want || std::signbit(x) != bool(bits & 0x8000)) FAIL("pattern " << b << ": " << x);
    if (f16(x).bits() != bits) FAIL("pattern " << b << " comes back as " << f16(x).bits());
  }
}

TEST_CASE("bf16: all 65536 values convert to float exactly and back to the same bits", "[half]") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float x = bf16::from_bits(bits);
    const double want = bf16_value(bits);
    if (std::isnan(want)) {
      if (!std::isnan(x) || std::signbit(x) != bool(bits & 0x8000) || !std::isnan(float(bf16(x))))
        FAIL("NaN pattern " << b);
      continue;
    }
    if (static_cast<double>(x) != want) FAIL("pattern " << b << ": " << x);
    if (bf16(x).bits() != bits) FAIL("pattern " << b << " comes back as " << bf16(x).bits());
  }
}

TEST_CASE("f16 and bf16: every halfway case between neighbours rounds to even", "[half]") {
  check_halfway_cases<f16>(0x7bff);  // up to 65504, the largest
  check_halfway_cases<bf16>(0x7f7f);
}

TEST_CASE("bf16: floats across every binade round to the nearest, ties to even", "[half]") {
  // Every 4099th float pattern (about a million, all exponents, both signs):
  // the result must be one of the two bf16 neighbours of x, the nearer one.
  for (std::uint64_t u = 0; u < (std::uint64_t(1) << 32); u += 4099) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(u));
    if (std::isnan(x)) {
      if (!std::isnan(float(bf16(x)))) FAIL("NaN " << u << " is not NaN in bf16");
      continue;
    }
    const auto lo = static_cast<std::uint16_t>(u >> 16);  // toward zero
    // Past the largest value, the next one up is 2^128 for rounding's sake (it becomes infinity).
    const double a = std::fabs(bf16_value(lo));
    const double c = (lo & 0x7fff) == 0x7f7f ? std::ldexp(1.0, 128) : std::fabs(bf16_value(static_cast<std::uint16_t>(lo + 1)));
    const double ax = std::fabs(static_cast<double>(x));
    const std::uint16_t want = (ax - a < c - ax || (ax - a == c - ax && (lo & 1) == 0)) ? lo : static_cast<std::uint16_t>(lo + 1);
    if (bf16(x).bits() != want) FAIL("float pattern " << u << ": " << bf16(x).bits() << ", want " << want);
  }
}

TEST_CASE("f16: overflow, underflow and the special values", "[half]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(float(f16(65504.0f)) == 65504.0f);
  CHECK(float(f16(65519.996f)) == 65504.0f);   // below 65504 + half an ulp (16)
  CHECK(float(f16(65520.0f)) == inf);          // the tie goes to even: past the largest
  CHECK(float(f16(-1e10f)) == -inf);
  CHECK(float(f16(inf)) == inf);
  CHECK(float(f16(std::numeric_limits<float>::max())) == inf);
  CHECK(float(f16(std::ldexp(1.0f, -24))) == std::ldexp(1.0f, -24));  // the smallest subnormal
  CHECK(f16(std::ldexp(1.0f, -25)).bits() == 0);                       // its half: a tie, to even (zero)
  CHECK(f16(next_up(std::ldexp(1.0f, -25))).bits() == 1);
  CHECK(f16(-std::ldexp(1.0f, -26)).bits() == 0x8000);  // −0 keeps its sign
  CHECK(f16(std::ldexp(1023.5f, -24)).bits() == 0x400);  // rounds up into the smallest normal
  CHECK(f16(1e-30f).bits() == 0);
  CHECK(std::isnan(float(f16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::signbit(float(f16(-std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(float(f16(std::numeric_limits<float>::signaling_NaN()))));
}

TEST_CASE("bf16: overflow and the special values", "[half]") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(float(bf16(std::numeric_limits<float>::max())) == inf);
  CHECK(float(bf16(-std::numeric_limits<float>::max())) == -inf);
  CHECK(bf16(std::numeric_limits<float>::denorm_min()).bits() == 0);
  CHECK(std::isnan(float(bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload lies in the low 16 bits only stays a NaN (not infinity).
  CHECK(std::isnan(float(bf16(std::bit_cast<float>(0x7f800001u)))));
  CHECK(std::isnan(float(bf16(std::bit_cast<float>(0xff800001u)))));
  CHECK(std::signbit(float(bf16(std::bit_cast<float>(0xff800001u)))));
}

TEST_CASE("from a double or an integer: rounded once, not through float", "[half]") {
  // 1 + 2⁻⁸ + 2⁻³⁰ lies just above bf16's midpoint between 1 and 1 + 2⁻⁷;
  // through float it would be the midpoint exactly, and round down to 1.
  const double just_above = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  CHECK(static_cast<float>(just_above) == 1.0f + std::ldexp(1.0f, -8));
  CHECK(float(bf16(just_above)) == 1.0f + std::ldexp(1.0f, -7));
  CHECK(float(bf16(-just_above)) == -(1.0f + std::ldexp(1.0f, -7)));
  CHECK(float(f16(1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40))) == 1.0f + std::ldexp(1.0f, -10));
  CHECK(float(f16(1.0 + std::ldexp(1.0, -11))) == 1.0f);  // an exact tie still goes to even
  CHECK(float(bf16(1e300)) == std::numeric_limits<float>::infinity());
  CHECK(float(f16(1e-300)) == 0.0f);
  CHECK(std::isnan(float(bf16(std::numeric_limits<double>::quiet_NaN()))));
  CHECK(float(f16(2049)) == 2048.0f);  // a tie between 2048 and 2050: even
  CHECK(float(f16(2051)) == 2052.0f);
  CHECK(float(bf16(257)) == 256.0f);
}

TEST_CASE("bf16 and f16: numeric_limits, arithmetic through float, printing", "[half]") {
  using bl = std::numeric_limits<bf16>;
  using hl = std::numeric_limits<f16>;
  CHECK(float(bl::max()) == 0x1.fep127f);
  CHECK(float(bl::min()) == 0x1p-126f);
  CHECK(float(bl::epsilon()) == 0x1p-7f);
  CHECK(float(bl::lowest()) == -0x1.fep127f);
  CHECK(float(bl::denorm_min()) == 0x1p-133f);
  CHECK(float(hl::max()) == 65504.0f);
  CHECK(float(hl::min()) == 0x1p-14f);
  CHECK(float(hl::epsilon()) == 0x1p-10f);
  CHECK(float(hl::denorm_min()) == 0x1p-24f);
  CHECK(std::isinf(float(hl::infinity())));
  CHECK(std::isnan(float(bl::quiet_NaN())));
  CHECK(bl::digits == 8);
  CHECK(hl::digits == 11);
  static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2);
  static_assert(float(bf16(0.5f)) == 0.5f && f16(1.0f).bits() == 0x3c00 && bf16(-2.0).bits() == 0xc000);

  const bf16 a(1.5f), b(2.25f);
  CHECK(a * b == 3.375f);  // float arithmetic
  CHECK(a < b);
  CHECK(bf16() == 0.0f);  // value-initialised: zero, as float
  std::ostringstream os;
  os << bf16(0.15625f) << ' ' << f16(-3.0f);
  CHECK(os.str() == "0.15625 -3");
}
