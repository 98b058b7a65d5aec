// What makes a type a qkv expression, and the traits every node exposes.
#pragma once

#include "../numeric/float16.hpp"

#include <concepts>
#include <cstddef>
#include <type_traits>

namespace qkv {

// Every node and every storage leaf declares `static constexpr bool
// qkv_expression = true` and has value_type, static_rows, static_cols,
// rows() and cols(). Leaves also have data() and row_stride().
template <class E>
concept expression = requires {
  requires std::remove_cvref_t<E>::qkv_expression;
  typename std::remove_cvref_t<E>::value_type;
};

template <class E>
concept leaf = expression<E> && requires(const std::remove_cvref_t<E>& e) {
  e.data();
  { e.row_stride() } -> std::convertible_to<std::size_t>;
};

// tensor, tensor_view: rank 3 or 4, reached by the strategies one matrix at a time.
template <class E>
concept tensor_leaf = expression<E> && requires {
  requires std::remove_cvref_t<E>::qkv_tensor;
};

// Values stored in a code the strategies do not read as numbers (a quantized
// K or V, storage/quantized.hpp): made plain before an evaluation.
template <class E>
concept coded_leaf = expression<E> && requires {
  requires std::remove_cvref_t<E>::qkv_quantized;
};

// The bottom of an expression: storage of any kind.
template <class E>
concept storage_leaf = leaf<E> || tensor_leaf<E> || coded_leaf<E>;

// Storage an evaluation may write into.
template <class E>
concept writable_leaf = (leaf<E> || tensor_leaf<E>) && !coded_leaf<E>;

template <expression E>
using value_type_t = typename std::remove_cvref_t<E>::value_type;

// Element types the kernels compute in; bool is for masks only.
template <class T>
concept element = std::same_as<T, float> || std::same_as<T, double>;

// 2-byte storage types: expressions on them compute in float.
template <class T>
concept half_element = std::same_as<T, bf16> || std::same_as<T, f16>;

// What matrices, tensors and expressions may hold.
template <class T>
concept value_element = element<T> || half_element<T>;

// The type an element is computed in.
template <class T>
using compute_t = std::conditional_t<half_element<T>, float, T>;

// Whether two element types may meet in a binary node: the same type, or
// float with a 2-byte type (float queries, a bf16 cache), which is float.
template <class A, class B>
concept mixable_elements =
    std::same_as<A, B> || (std::same_as<A, float> && half_element<B>) || (half_element<A> && std::same_as<B, float>);

template <class A, class B>
using common_element_t = std::conditional_t<std::same_as<A, B>, A, float>;

namespace detail {

// How a node holds an operand (xtensor's closure rule): an lvalue by const
// reference, a temporary by value, so `auto e = softmax(A * B)` never
// dangles. Views are cheap and hold no data, so they are always copied.
template <class E>
struct closure {
  using type = std::conditional_t<std::is_lvalue_reference_v<E> && !std::remove_cvref_t<E>::qkv_is_view,
                                  const std::remove_reference_t<E>&, std::remove_cvref_t<E>>;
};

template <class E>
using closure_t = typename closure<E>::type;

template <class E>
using bare_t = std::remove_cvref_t<E>;

}  // namespace detail

// Evaluates `e` into storage `dst` of the same shape; defined in eval/ (the
// storage classes call it from their converting constructors).
template <class Dst, class E>
void eval_into(Dst&& dst, const E& e);

}  // namespace qkv
