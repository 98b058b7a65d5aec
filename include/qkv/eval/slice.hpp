// A batched expression (one over tensors) is a matrix expression per batch
// index. slice(e, index) builds that matrix expression: the same nodes
// (each rebuilt over its sliced operands, expr/node.hpp), over matrix_views
// of each operand's matrix at the index its batch extents map it to
// (broadcast: index 0; grouped: index / group). The strategies then
// evaluate it exactly as they evaluate a matrix expression.
#pragma once

#include "../expr/node.hpp"
#include "../storage/matrix_view.hpp"

#include <tuple>
#include <utility>

namespace qkv::detail {

template <class E>
auto slice(const E& e, batch_extents index) {
  if constexpr (leaf<E>) {
    return matrix_view<const value_type_t<E>, E::static_rows, E::static_cols>(e);
  } else if constexpr (requires { e.batch_matrix_in_pages(index); }) {
    return e.batch_matrix_in_pages(index);  // a sequence of a paged cache, read in place (eval/pages.hpp)
  } else if constexpr (tensor_leaf<E>) {
    return matrix_view<const value_type_t<E>, E::static_rows, E::static_cols>(e.batch_matrix(index));
  } else {
    // Each operand at the index its own batch extents give it; a node that
    // keeps its slice's position (expr/node.hpp) learns it.
    auto r = std::apply(
        [&](const auto&... x) { return e.rebuild(slice(x, operand_batch_index(index, batch_of(e), batch_of(x)))...); },
        e.operands());
    if constexpr (requires { r.at_slice(index); }) r.at_slice(index);
    return r;
  }
}

template <class E>
using slice_t = decltype(slice(std::declval<const E&>(), batch_extents{}));

}  // namespace qkv::detail
