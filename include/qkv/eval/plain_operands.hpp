// Operands a strategy does not read as they are stored, made plain storage
// before it runs: a paged cache's sequences gathered end to end (pages.hpp;
// unless the best strategy reads them in place), a quantized K or V
// (storage/quantized.hpp) dequantized to float. The result is then, by
// construction, the same expression over the plain values.
#pragma once

#include "../expr/node.hpp"
#include "../storage/quantized.hpp"
#include "pages.hpp"

#include <tuple>
#include <type_traits>

namespace qkv::detail {

template <class L>
struct is_quantized_leaf : std::bool_constant<coded_leaf<L>> {};

template <class E>
constexpr bool reads_quantized() {
  return reads_leaf<is_quantized_leaf, E>();
}

template <class F>
struct in_format {
  template <class L>
  struct leaf : std::false_type {};
  template <class L>
    requires coded_leaf<L>
  struct leaf<L> : std::is_same<typename L::format, F> {};
};

// The formats e's quantized operands are in, for explain.
template <class E>
constexpr const char* quantized_formats() {
  constexpr bool q8s = reads_leaf<in_format<q8>::template leaf, E>(), q4s = reads_leaf<in_format<q4>::template leaf, E>();
  return q8s && q4s ? "q8 and q4" : q8s ? "q8" : "q4";
}

// Whether Policy's evaluation of e first makes some of its operands plain.
template <class Policy, class E>
inline constexpr bool gathers_operands = gathers_pages<Policy, E> || reads_quantized<bare_t<E>>();

// e with each paged operand gathered and each quantized one dequantized; e
// itself (a reference) where it reads neither.
template <class E>
decltype(auto) gather_operands(const E& e) {
  if constexpr (!reads_pages<E>() && !reads_quantized<E>()) {
    return (e);
  } else if constexpr (paged_leaf<E>) {
    return gathered_pages<value_type_t<E>, E::static_heads, E::static_cols>(e);
  } else if constexpr (coded_leaf<E>) {
    return dequantize(e);
  } else {
    return std::apply([&](const auto&... x) { return e.rebuild(gather_operands(x)...); }, e.operands());
  }
}

}  // namespace qkv::detail
