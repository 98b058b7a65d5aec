// The owning storage of a holder's kind and extents with another element
// type: a matrix for a matrix, a matrix view or any matrix expression; a
// tensor for a tensor or tensor view; a ragged for a ragged or ragged view.
// Static extents are kept.
#pragma once

#include "matrix.hpp"
#include "ragged.hpp"
#include "ragged_view.hpp"
#include "tensor.hpp"
#include "tensor_view.hpp"

#include <cstddef>
#include <type_traits>

namespace qkv::detail {

template <class X, class U>
struct owning {
  using type = matrix<U, X::static_rows, X::static_cols>;
};
template <class T, std::size_t... E, class U>
struct owning<tensor<T, E...>, U> {
  using type = tensor<U, E...>;
};
template <class T, std::size_t... E, class U>
struct owning<tensor_view<T, E...>, U> {
  using type = tensor<U, E...>;
};
template <class T, std::size_t H, std::size_t D, class U>
struct owning<ragged<T, H, D>, U> {
  using type = ragged<U, H, D>;
};
template <class T, std::size_t H, std::size_t D, class U>
struct owning<ragged_view<T, H, D>, U> {
  using type = ragged<U, H, D>;
};

template <class X, class U>
using owning_t = typename owning<std::remove_cvref_t<X>, U>::type;

}  // namespace qkv::detail
