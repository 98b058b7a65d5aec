// Expressions over bf16 and f16 compute in float. widen(e) is e rebuilt
// (expr/node.hpp) over float copies of its 2-byte leaves, every other leaf
// and every subtree without a 2-byte leaf as it is; both strategies then run
// their float code on it, and eval rounds the float result once into
// 2-byte storage (eval.hpp). Each 2-byte input is thus read once and held in
// float for the evaluation.
#pragma once

#include "../expr/node.hpp"
#include "../kernels/api.hpp"
#include "../shape/batch.hpp"
#include "../storage/matrix.hpp"
#include "../storage/owning.hpp"
#include "../storage/tensor.hpp"
#include "../storage/tensor_view.hpp"
#include "ragged.hpp"

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace qkv::detail {

template <class E>
using operands_t = decltype(std::declval<const E&>().operands());

template <class L>
struct is_half_leaf : std::bool_constant<half_element<std::remove_const_t<value_type_t<L>>>> {};

// Whether e reads a 2-byte leaf (its functors' data is the functors' own).
template <class E>
constexpr bool reads_half() {
  return reads_leaf<is_half_leaf, E>();
}

// How many times e reads a 2-byte leaf.
template <class E>
constexpr std::size_t half_leaf_count() {
  if constexpr (storage_leaf<E>) {
    return half_element<std::remove_const_t<value_type_t<E>>> ? 1 : 0;
  } else {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (half_leaf_count<bare_t<std::tuple_element_t<I, operands_t<E>>>>() + ... + 0);
    }(std::make_index_sequence<std::tuple_size_v<operands_t<E>>>{});
  }
}

// A matrix or matrix view as the kernels see it.
template <class M>
auto strided_of(M& m) {
  using T = std::remove_reference_t<decltype(*m.data())>;
  std::ptrdiff_t cols = 1;
  if constexpr (requires { m.col_stride(); }) cols = static_cast<std::ptrdiff_t>(m.col_stride());
  return kernels::strided<T>{m.data(), m.rows(), m.cols(), static_cast<std::ptrdiff_t>(m.row_stride()), cols};
}

// The matrix src converted into dst (same extents): 2-byte storage into
// float by the kernels' vector conversions, anything else element by element.
template <class Src, class Dst>
void convert_matrix(const Src& src, Dst&& dst) {
  using S = std::remove_const_t<value_type_t<Src>>;
  if constexpr (half_element<S> && std::is_same_v<value_type_t<std::remove_cvref_t<Dst>>, float>) {
    kernels::widen(strided_of(src).as_const(), strided_of(dst));
  } else {
    for (std::size_t i = 0; i < src.rows(); ++i)
      for (std::size_t j = 0; j < src.cols(); ++j) dst(i, j) = static_cast<value_type_t<std::remove_cvref_t<Dst>>>(src(i, j));
  }
}

template <class E>
decltype(auto) widen(const E& e) {
  if constexpr (!reads_half<E>()) {
    return (e);
  } else if constexpr (leaf<E>) {
    matrix<float, E::static_rows, E::static_cols> w(e.rows(), e.cols());
    convert_matrix(e, w);
    return w;
  } else if constexpr (ragged_leaf<E>) {
    auto w = ragged_like<float>(e);
    for_each_batch_index(batch_of(e), [&](batch_extents b) {
      auto to = w.view().batch_matrix(b);
      convert_matrix(e.batch_matrix(b), to);
    });
    return w;
  } else if constexpr (tensor_leaf<E>) {
    owning_t<E, float> w(e.extents());
    for_each_batch_index(batch_of(e), [&](batch_extents b) {
      const auto from = e.batch_matrix(b);
      auto to = w.view().batch_matrix(b);
      convert_matrix(from, to);
    });
    return w;
  } else {
    return std::apply([&](const auto&... x) { return e.rebuild(widen(x)...); }, e.operands());
  }
}

// A float result rounded once into storage of type To, of the same extents.
template <class To, class From>
To narrow(const From& r) {
  To out = [&] {
    if constexpr (ragged_leaf<From>) return To(r.offsets(), {r.heads(), r.cols()});
    else if constexpr (tensor_leaf<From>) return To(r.extents());
    else return To(r.rows(), r.cols());
  }();
  using T = value_type_t<To>;
  const float* src = r.data();
  T* dst = out.data();
  for (std::size_t k = 0, n = r.size(); k < n; ++k) dst[k] = T(src[k]);
  return out;
}

}  // namespace qkv::detail
