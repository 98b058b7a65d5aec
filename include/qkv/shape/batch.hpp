// Batch extents: the extents of a tensor before its last two (which are the
// matrix). They are kept right-aligned in two slots, {outer, inner}, with 1
// where a lower rank has none: a matrix is {1, 1}, a [H, T, D] tensor
// {1, H}, a [B, H, T, D] tensor {B, H}. Two operands' batch extents combine
// per slot as in NumPy (equal, or one of them 1: broadcast); a product also
// accepts the left one a multiple of the right one, which is grouped-query
// attention: query head h of 8 reads key head h / 4 of 2 (never the other
// way: 4 query heads over 8 key heads is a mistake).
#pragma once

#include "extent.hpp"
#include "shape_error.hpp"

#include <array>
#include <cstddef>
#include <string>

namespace qkv {

using batch_extents = std::array<std::size_t, 2>;

namespace detail {

template <class E>
constexpr std::size_t static_rank_of() {
  if constexpr (requires { E::static_rank; }) return E::static_rank;
  else return 2;
}

template <class E>
constexpr batch_extents static_batch_of() {
  if constexpr (requires { E::static_batch; }) return E::static_batch;
  else return {1, 1};
}

// An expression's batch extents at run time; a ragged or paged operand's
// are its sequences and heads (its batch() is the number of sequences).
template <class E>
batch_extents batch_of(const E& e) {
  if constexpr (requires { E::qkv_ragged; } || requires { E::qkv_paged; }) return {e.batch(), e.heads()};
  else if constexpr (requires { e.batch(); }) return e.batch();
  else return {1, 1};
}

// f(index) for every index of the batch extents b, in order.
template <class F>
void for_each_batch_index(batch_extents b, F&& f) {
  for (std::size_t i = 0; i < b[0]; ++i)
    for (std::size_t j = 0; j < b[1]; ++j) f(batch_extents{i, j});
}

constexpr bool batch_extent_agrees(std::size_t a, std::size_t b, bool grouped) noexcept {
  if (a == b || a == 1 || b == 1 || a == dyn || b == dyn) return true;
  return grouped && a != 0 && b != 0 && a % b == 0;
}

// The extent of a slot after combining: the larger, static where it can be
// known while compiling.
constexpr std::size_t combine_batch_extent(std::size_t a, std::size_t b, bool grouped) noexcept {
  if (a == dyn || b == dyn) {
    const std::size_t other = a == dyn ? b : a;
    return !grouped && other != dyn && other != 1 ? other : dyn;
  }
  if (a == 1 || b == 1) return a == 1 ? b : a;
  return a > b ? a : b;
}

constexpr batch_extents combine_batch(batch_extents a, batch_extents b, bool grouped) noexcept {
  return {combine_batch_extent(a[0], b[0], grouped), combine_batch_extent(a[1], b[1], grouped)};
}

// The index into an operand's batch extents of an index into the combined
// ones: 0 where the operand broadcasts, i / (c / e) where it is grouped.
constexpr batch_extents operand_batch_index(batch_extents index, batch_extents combined,
                                            batch_extents operand) noexcept {
  return {index[0] * operand[0] / combined[0], index[1] * operand[1] / combined[1]};
}

// (Appended piece by piece: g++ 12 warns, wrongly, on "[" + std::to_string(…).)
inline std::string batch_string(batch_extents b) {
  std::string s(1, '[');
  s.append(std::to_string(b[0])).append(", ").append(std::to_string(b[1])).append("]");
  return s;
}

// Throws unless two operands' batch extents combine.
inline void require_batch(batch_extents a, batch_extents b, bool grouped, const char* what) {
  if (!batch_extent_agrees(a[0], b[0], grouped) || !batch_extent_agrees(a[1], b[1], grouped)) {
    throw shape_error(std::string("qkv: ") + what + " (batch extents " + batch_string(a) + " vs " + batch_string(b) +
                      (grouped ? "; grouped-query attention needs Q's heads a multiple of K's and V's)" : ")"));
  }
}

}  // namespace detail

// The same as a variable template on the four extents, so that a failed
// static_assert prints them: static_batches_agree<1, 8, 1, 3, true>.
template <std::size_t A0, std::size_t A1, std::size_t B0, std::size_t B1, bool Grouped>
inline constexpr bool static_batches_agree =
    detail::batch_extent_agrees(A0, B0, Grouped) && detail::batch_extent_agrees(A1, B1, Grouped);

}  // namespace qkv
