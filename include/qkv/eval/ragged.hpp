// Expressions on ragged operands (storage/ragged_view.hpp): a batch of {B,
// H} matrices like a tensor's, but of a length per sequence, so their
// result is a ragged too. Which type, and with which offsets, is here; the
// strategies evaluate it batch index by batch index as they do a tensor's
// (eval/batched.hpp), each sequence on its own, so that a sequence's bits
// do not depend on the others.
#pragma once

#include "../expr/node.hpp"
#include "../storage/ragged.hpp"
#include "slice.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace qkv::detail {

template <class E>
concept ragged_leaf = tensor_leaf<E> && requires { requires std::remove_cvref_t<E>::qkv_ragged; };

template <class L>
struct is_ragged_leaf : std::bool_constant<ragged_leaf<L>> {};

// Whether e reads a ragged operand.
template <class E>
constexpr bool reads_ragged() {
  return reads_leaf<is_ragged_leaf, E>();
}

template <class E>
inline constexpr bool is_ragged_v = reads_ragged<bare_t<E>>();

// The offsets of e's result: sequence b has the rows of e's matrix at {b, 0}
// (its queries'). Slicing checks each sequence's shapes (K's and V's
// lengths agree), before any work.
template <class E>
std::vector<std::int32_t> result_offsets(const E& e) {
  const batch_extents b = batch_of(e);
  std::vector<std::int32_t> offsets{0};
  offsets.reserve(b[0] + 1);
  std::size_t total = 0;
  for (std::size_t s = 0; s < b[0]; ++s) {
    try {
      total += slice(e, {s, 0}).rows();
    } catch (const shape_error& x) {
      throw shape_error(std::string(x.what()) + ", in sequence " + std::to_string(s));
    }
    if (total > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
      throw std::length_error("qkv: a ragged result of more than 2^31 - 1 tokens");
    offsets.push_back(static_cast<std::int32_t>(total));
  }
  return offsets;
}

// A new ragged R holding e's result.
template <class R, class E>
R ragged_result(const E& e) {
  return R(result_offsets(e), {batch_of(e)[1], e.cols()});
}

// Storage of x's layout in element type T.
template <class T, class X>
auto ragged_like(const X& x) {
  return ragged<T, bare_t<X>::static_heads, bare_t<X>::static_cols>(x.offsets(), {x.heads(), x.cols()});
}

// Whether dst has the rows of e's result.
template <class Dst, class E>
void require_ragged_shape(const Dst& dst, const E& e, const char* what) {
  const std::vector<std::int32_t> want = result_offsets(e);
  const auto got = dst.offsets();
  if (!std::equal(want.begin(), want.end(), got.begin(), got.end()) || dst.heads() != batch_of(e)[1] ||
      dst.cols() != e.cols())
    throw shape_error(std::string("qkv: ") + what + ": the offsets, heads or dim of dst differ from e's result");
}

}  // namespace qkv::detail
