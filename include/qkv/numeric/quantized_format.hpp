// The 8-bit and 4-bit formats K and V caches are kept in, one row at a
// time: each row of d values (d a multiple of 32) in groups of 32 that share
// a float scale.
//   q8: int8 codes c, value = scale · c, scale = max|x| / 127
//   q4: 4-bit codes c, value = fma(scale, c, min) (rounded once),
//       scale = (max − min) / 15
// A code is x's nearest on the group's grid (ties to even). A group holding
// a NaN or an infinity has no grid: its scale (and min) are NaN and its
// values read back as NaN; the other groups of the row are unaffected.
//
// A row's bytes: the group scales first (G = d / 32 floats; q4 then its G
// minimums), then the codes; q8 one byte a value, q4 one byte for two: byte
// k of group g's 16 holds value 32g + k in its low four bits and 32g + k + 16
// in its high four. So a kernel reading a row finds every scale in the first
// cache line, and the codes of a vector of any width in consecutive bytes.
#pragma once

#include "float16.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace qkv {

namespace detail {

template <class S>
float quantize_input(S x) noexcept {
  return static_cast<float>(x);
}

inline float float_at(const std::byte* p) noexcept {
  float f;
  std::memcpy(&f, p, sizeof f);
  return f;
}

inline void put_float(std::byte* p, float f) noexcept { std::memcpy(p, &f, sizeof f); }

}  // namespace detail

struct q8 {
  static constexpr std::size_t group = 32;
  static constexpr const char* name = "q8";
  static constexpr std::size_t row_bytes(std::size_t d) noexcept { return d / group * sizeof(float) + d; }

  // x[0, d) into row (row_bytes(d) bytes); d a multiple of 32.
  template <class S>
  static void quantize_row(const S* x, std::size_t d, std::byte* row) noexcept {
    const std::size_t groups = d / group;
    auto* codes = reinterpret_cast<std::int8_t*>(row + groups * sizeof(float));
    for (std::size_t g = 0; g < groups; ++g) {
      float big = 0;
      bool finite = true;
      for (std::size_t k = 0; k < group; ++k) {
        const float v = detail::quantize_input(x[g * group + k]);
        finite = finite && std::isfinite(v);
        big = std::fabs(v) > big ? std::fabs(v) : big;
      }
      const float scale = finite ? big / 127 : std::numeric_limits<float>::quiet_NaN();
      detail::put_float(row + g * sizeof(float), scale);
      for (std::size_t k = 0; k < group; ++k) {
        double c = 0;
        if (finite && scale > 0) c = std::nearbyint(double(detail::quantize_input(x[g * group + k])) / double(scale));
        codes[g * group + k] = static_cast<std::int8_t>(c > 127 ? 127 : c < -127 ? -127 : c);
      }
    }
  }

  // Value c of a row of d values.
  static float value(const std::byte* row, std::size_t d, std::size_t c) noexcept {
    const auto* codes = reinterpret_cast<const std::int8_t*>(row + d / group * sizeof(float));
    return detail::float_at(row + c / group * sizeof(float)) * static_cast<float>(codes[c]);
  }
};

struct q4 {
  static constexpr std::size_t group = 32;
  static constexpr const char* name = "q4";
  static constexpr std::size_t row_bytes(std::size_t d) noexcept { return d / group * 2 * sizeof(float) + d / 2; }

  template <class S>
  static void quantize_row(const S* x, std::size_t d, std::byte* row) noexcept {
    const std::size_t groups = d / group;
    std::byte* codes = row + groups * 2 * sizeof(float);
    for (std::size_t g = 0; g < groups; ++g) {
      float lo = std::numeric_limits<float>::infinity(), hi = -lo;
      bool finite = true;
      for (std::size_t k = 0; k < group; ++k) {
        const float v = detail::quantize_input(x[g * group + k]);
        finite = finite && std::isfinite(v);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
      }
      const float nan = std::numeric_limits<float>::quiet_NaN();
      // In double: hi − lo of two finite floats does not overflow there.
      const float scale = finite ? static_cast<float>((double(hi) - double(lo)) / 15) : nan;
      detail::put_float(row + g * sizeof(float), scale);
      detail::put_float(row + (groups + g) * sizeof(float), finite ? lo : nan);
      std::uint8_t c[group] = {};
      if (finite && scale > 0)
        for (std::size_t k = 0; k < group; ++k) {
          const double q = std::nearbyint((double(detail::quantize_input(x[g * group + k])) - lo) / double(scale));
          c[k] = static_cast<std::uint8_t>(q > 15 ? 15 : q < 0 ? 0 : q);
        }
      for (std::size_t k = 0; k < group / 2; ++k)
        codes[g * group / 2 + k] = static_cast<std::byte>(c[k] | (c[k + group / 2] << 4));
    }
  }

  static float value(const std::byte* row, std::size_t d, std::size_t c) noexcept {
    const std::size_t groups = d / group, g = c / group, k = c % group;
    const auto byte = static_cast<unsigned>(row[groups * 2 * sizeof(float) + g * group / 2 + k % (group / 2)]);
    const unsigned code = k < group / 2 ? byte & 15u : byte >> 4;
    return std::fma(detail::float_at(row + g * sizeof(float)), static_cast<float>(code),
                    detail::float_at(row + (groups + g) * sizeof(float)));
  }
};

template <class F>
inline constexpr bool quantized_format = std::is_same_v<F, q8> || std::is_same_v<F, q4>;

}  // namespace qkv
