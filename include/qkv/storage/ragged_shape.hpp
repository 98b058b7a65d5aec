// What ragged and ragged_view share: B sequences of tokens packed end to
// end, token-major, each token H heads of D values. Sequence b holds tokens
// offsets[b] to offsets[b + 1] − 1; the matrix at batch index {b, h} is
// sequence b's rows of head h, H·D apart. Offsets are checked once, where a
// ragged operand is made, so the strategies read them unchecked.
#pragma once

#include "../shape/batch.hpp"
#include "../shape/check.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>

namespace qkv {

// {heads, dim} of a ragged operand.
using ragged_extents = std::array<std::size_t, 2>;

namespace detail {

// Throws std::invalid_argument unless offsets are B + 1 non-decreasing
// entries from 0.
inline void check_offsets(std::span<const std::int32_t> offsets, const char* what) {
  const std::string who = std::string("qkv: ") + what + ": ";
  if (offsets.empty()) throw std::invalid_argument(who + "offsets need B + 1 entries (at least one, 0)");
  if (offsets[0] != 0) throw std::invalid_argument(who + "offsets must start at 0, got " + std::to_string(offsets[0]));
  for (std::size_t b = 1; b < offsets.size(); ++b)
    if (offsets[b] < offsets[b - 1])
      throw std::invalid_argument(who + "offsets decrease at entry " + std::to_string(b) + " (" +
                                  std::to_string(offsets[b - 1]) + " then " + std::to_string(offsets[b]) + ")");
}

template <std::size_t H, std::size_t D>
ragged_extents checked_ragged_extents(ragged_extents x, const char* what) {
  require_extent(H, x[0], (std::string(what) + " heads").c_str());
  require_extent(D, x[1], (std::string(what) + " dim").c_str());
  return x;
}

// The layout both classes compute with.
struct ragged_layout {
  std::span<const std::int32_t> offsets;
  std::size_t heads = 0, dim = 0;

  std::size_t batch_count() const noexcept { return offsets.size() - 1; }
  std::size_t tokens() const noexcept { return static_cast<std::size_t>(offsets.back()); }
  std::size_t length(std::size_t b) const noexcept { return static_cast<std::size_t>(offsets[b + 1] - offsets[b]); }
  std::size_t row_stride() const noexcept { return heads * dim; }
  std::size_t offset(std::size_t t, std::size_t h, std::size_t c) const noexcept { return (t * heads + h) * dim + c; }
  std::size_t matrix_offset(batch_extents b) const noexcept {
    return offset(static_cast<std::size_t>(offsets[b[0]]), b[1], 0);
  }
  // As a tensor's extents and strides, for what reads every leaf alike
  // (the memory a leaf spans): [B, H, tokens, D] with the batch stride 0.
  std::array<std::size_t, 4> extents() const noexcept { return {batch_count(), heads, tokens(), dim}; }
  std::array<std::size_t, 4> strides() const noexcept { return {0, dim, heads * dim, 1}; }

  void check_index(std::size_t t, std::size_t h, std::size_t c) const {
    if (t >= tokens() || h >= heads || c >= dim)
      throw std::out_of_range("qkv: index (" + std::to_string(t) + ", " + std::to_string(h) + ", " + std::to_string(c) +
                              ") outside a ragged of " + std::to_string(tokens()) + " tokens, " + std::to_string(heads) +
                              " heads of " + std::to_string(dim));
  }
  void check_batch_index(batch_extents b) const {
    if (b[0] >= batch_count() || b[1] >= heads)
      throw std::out_of_range("qkv: batch index " + batch_string(b) + " outside a ragged of " +
                              std::to_string(batch_count()) + " sequences of " + std::to_string(heads) + " heads");
  }
};

}  // namespace detail
}  // namespace qkv
