// The extents of a rank-3 or rank-4 tensor, static or dynamic, and what
// tensor and tensor_view derive from them: the matrix extents (the last two)
// and the batch extents (the leading ones, see shape/batch.hpp).
#pragma once

#include "../shape/batch.hpp"
#include "../shape/check.hpp"

#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>

namespace qkv::detail {

template <std::size_t... E>
struct tensor_shape {
  static constexpr std::size_t rank = sizeof...(E);
  static_assert(rank == 3 || rank == 4,
                "qkv: tensor<T, E...> and tensor_view<T, E...> have rank 3 or 4 (the last two extents are the "
                "matrix, and a matrix or matrix_view is rank 2)");
  using extents_t = std::array<std::size_t, rank>;
  static constexpr extents_t static_extents{E...};
  static constexpr std::size_t static_rows = static_extents[rank - 2];
  static constexpr std::size_t static_cols = static_extents[rank - 1];
  static constexpr batch_extents static_batch =
      rank == 4 ? batch_extents{static_extents[0], static_extents[1]} : batch_extents{1, static_extents[0]};
  static constexpr std::size_t dynamic_count = ((E == dyn ? 1 : 0) + ...);

  static std::string to_string(const extents_t& x) {
    std::string s(1, '[');
    for (std::size_t k = 0; k < rank; ++k) s.append(k ? ", " : "").append(std::to_string(x[k]));
    return s.append("]");
  }

  // The extents given, checked against the static ones.
  static extents_t checked(const extents_t& given, const char* what) {
    for (std::size_t k = 0; k < rank; ++k) {
      if (is_static(static_extents[k]) && static_extents[k] != given[k]) {
        throw shape_error(std::string("qkv: ") + what + ": extent " + std::to_string(k) + " is " +
                          std::to_string(static_extents[k]) + " in the type, got " + std::to_string(given[k]));
      }
    }
    return given;
  }

  // All extents from the dynamic ones alone, in order.
  static extents_t from_dynamic(const std::array<std::size_t, dynamic_count>& given) {
    extents_t x = static_extents;
    std::size_t next = 0;
    for (std::size_t& e : x)
      if (e == dyn) e = given[next++];
    return x;
  }

  static batch_extents batch(const extents_t& x) { return rank == 4 ? batch_extents{x[0], x[1]} : batch_extents{1, x[0]}; }

  // Row-major strides of contiguous extents.
  static extents_t contiguous_strides(const extents_t& x) {
    extents_t s{};
    std::size_t stride = 1;
    for (std::size_t k = rank; k-- > 0;) s[k] = stride, stride *= x[k];
    return s;
  }

  static std::size_t size(const extents_t& x) {
    std::size_t n = 1;
    for (std::size_t e : x) {
      if (e != 0 && n > std::size_t(-1) / 16 / e) throw std::length_error("qkv: tensor too large");
      n *= e;
    }
    return n;
  }

  // The offset of element (i...) and of the matrix at batch index b.
  static std::size_t offset(const extents_t& strides, const extents_t& index) {
    std::size_t o = 0;
    for (std::size_t k = 0; k < rank; ++k) o += index[k] * strides[k];
    return o;
  }
  static std::size_t batch_offset(const extents_t& strides, batch_extents b) {
    return rank == 4 ? b[0] * strides[0] + b[1] * strides[1] : b[1] * strides[0];
  }

  static void check_index(const extents_t& x, const extents_t& index) {
    for (std::size_t k = 0; k < rank; ++k) {
      if (index[k] >= x[k]) {
        throw std::out_of_range("qkv: index " + to_string(index) + " outside a " + to_string(x) + " tensor");
      }
    }
  }
  static void check_batch_index(const extents_t& x, batch_extents b) {
    const batch_extents e = batch(x);
    if (b[0] >= e[0] || b[1] >= e[1]) {
      throw std::out_of_range("qkv: batch index " + batch_string(b) + " outside a " + to_string(x) + " tensor");
    }
  }
};

}  // namespace qkv::detail
