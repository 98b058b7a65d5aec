// bf16 and f16: the 2-byte floating-point types models are stored in.
// bfloat16 is the top half of a float (8 exponent bits, 7 stored mantissa
// bits); f16 is IEEE binary16 (5 and 10). Both convert from a float by
// rounding to nearest even, and to a float exactly. Arithmetic on them goes
// through float: `a * b` is a float; qkv's expressions on them accumulate in
// float and round once, at the end.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>
#include <ostream>
#include <type_traits>

namespace qkv {

namespace detail {

// x rounded toward zero to float with the lowest bit set when inexact ("round
// to odd"): rounding that to 16 bits to nearest even gives x rounded once.
constexpr float round_to_odd_float(double x) noexcept {
  const float f = static_cast<float>(x);
  if (x != x || static_cast<double>(f) == x) return f;
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const double a = x < 0 ? -x : x, b = f < 0 ? -static_cast<double>(f) : static_cast<double>(f);
  if (b > a) --u;  // f was rounded away from zero (or to infinity): step back
  return std::bit_cast<float>(u | 1u);
}

constexpr std::uint16_t bf16_bits(float x) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  // Adding 0x7fff plus the kept part's lowest bit rounds to nearest even; a
  // carry runs into the exponent, up to infinity.
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

constexpr float bf16_to_float(std::uint16_t h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

constexpr std::uint16_t f16_bits(float x) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // quiet NaN
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // ≥ 65520: past the largest, 65504
  if (a >= 0x38800000u) {                                                   // ≥ 2^-14: normal
    const std::uint32_t r = a - (112u << 23);                               // exponent bias 127 → 15
    return static_cast<std::uint16_t>(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
  // Subnormal: |x| + 0.5 rounds |x| to a multiple of 2^-24 (0.5's ulp), to
  // nearest even; what is left above 0.5's bits is |x| / 2^-24. 2^-14 comes
  // out as 0x400, the smallest normal's bits.
  const float t = std::bit_cast<float>(a) + 0.5f;
  return static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(t) - 0x3f000000u));
}

constexpr float f16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  if (e != 0) return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
  const float s = static_cast<float>(m) * 0x1p-24f;  // exact: m < 2^10
  return sign ? -s : s;
}

// The two types differ only in their conversions.
template <class Self, std::uint16_t (*From)(float), float (*To)(std::uint16_t)>
class float16 {
 public:
  float16() = default;  // as float: uninitialised, and zero in T{}
  // From a number: rounded to nearest even (from a double or an integer,
  // once, not through float; an integer beyond 2^53 is first a double).
  template <class N>
    requires std::is_arithmetic_v<N>
  constexpr explicit float16(N x) noexcept
      : bits_(From(std::is_same_v<N, float> ? static_cast<float>(x) : round_to_odd_float(static_cast<double>(x)))) {}

  constexpr operator float() const noexcept { return To(bits_); }  // exact

  static constexpr Self from_bits(std::uint16_t b) noexcept {
    Self s{};
    s.bits_ = b;
    return s;
  }
  constexpr std::uint16_t bits() const noexcept { return bits_; }

  friend std::ostream& operator<<(std::ostream& os, const Self& v) { return os << static_cast<float>(v); }

 private:
  std::uint16_t bits_;
};

}  // namespace detail

// bfloat16: float's range, 8 significant bits.
struct bf16 : detail::float16<bf16, detail::bf16_bits, detail::bf16_to_float> {
  using float16::float16;
};

// IEEE binary16: up to 65504, 11 significant bits, subnormals down to 2^-24.
struct f16 : detail::float16<f16, detail::f16_bits, detail::f16_to_float> {
  using float16::float16;
};

static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2 && std::is_trivial_v<bf16> && std::is_trivial_v<f16>);

namespace detail {

template <class Self, int Digits, int MinExp, int MaxExp, std::uint16_t Max, std::uint16_t Min, std::uint16_t Eps,
          std::uint16_t Inf, std::uint16_t NaN, std::uint16_t Denorm>
struct float16_limits {
  static constexpr bool is_specialized = true, is_signed = true, is_integer = false, is_exact = false;
  static constexpr bool has_infinity = true, has_quiet_NaN = true, has_signaling_NaN = false, is_iec559 = false;
  static constexpr bool is_bounded = true, is_modulo = false, traps = false, tinyness_before = false;
  static constexpr std::float_denorm_style has_denorm = std::denorm_present;
  static constexpr std::float_round_style round_style = std::round_to_nearest;
  static constexpr int digits = Digits, radix = 2, min_exponent = MinExp, max_exponent = MaxExp;
  static constexpr int digits10 = Digits == 8 ? 2 : 3, max_digits10 = Digits == 8 ? 4 : 5;
  static constexpr int min_exponent10 = MinExp == -125 ? -37 : -4, max_exponent10 = MaxExp == 128 ? 38 : 4;
  static constexpr Self min() noexcept { return Self::from_bits(Min); }
  static constexpr Self max() noexcept { return Self::from_bits(Max); }
  static constexpr Self lowest() noexcept { return Self::from_bits(static_cast<std::uint16_t>(Max | 0x8000u)); }
  static constexpr Self epsilon() noexcept { return Self::from_bits(Eps); }
  static constexpr Self round_error() noexcept { return Self(0.5f); }
  static constexpr Self infinity() noexcept { return Self::from_bits(Inf); }
  static constexpr Self quiet_NaN() noexcept { return Self::from_bits(NaN); }
  static constexpr Self signaling_NaN() noexcept { return Self::from_bits(NaN); }
  static constexpr Self denorm_min() noexcept { return Self::from_bits(Denorm); }
};

}  // namespace detail
}  // namespace qkv

template <>
struct std::numeric_limits<qkv::bf16>
    : qkv::detail::float16_limits<qkv::bf16, 8, -125, 128, 0x7f7f, 0x0080, 0x3c00, 0x7f80, 0x7fc0, 0x0001> {};
template <>
struct std::numeric_limits<qkv::f16>
    : qkv::detail::float16_limits<qkv::f16, 11, -13, 16, 0x7bff, 0x0400, 0x1400, 0x7c00, 0x7e00, 0x0001> {};
