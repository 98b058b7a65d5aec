// The key bounds each node sets (kernels/key_bounds.hpp holds the rule they
// feed): the registration of a kind of visibility. The naive masks, the
// gradient rules, the fused lowering and the cost model all read a node's
// bounds here, so a new kind is its node, an overload here, and what it
// changes in the rule.
#pragma once

#include "../expr/mask.hpp"
#include "../expr/window.hpp"
#include "../kernels/key_bounds.hpp"

namespace qkv::detail {

template <class S>
constexpr kernels::key_bounds node_bounds(const causal_expr<S>*) {
  kernels::key_bounds b;
  b.causal = true;
  return b;
}
// A window's extents are values of the expression: a walk over types alone
// (w null) finds no bound.
template <class S>
constexpr kernels::key_bounds node_bounds(const window_expr<S>* w) {
  kernels::key_bounds b;
  if (w != nullptr) b.narrow(w->left(), w->right());
  return b;
}

template <class S>
concept sets_key_bounds = requires(const S* s) { node_bounds(s); };

// Bounds a and b both: causal if either is, the narrower window on each side.
constexpr kernels::key_bounds both_bounds(kernels::key_bounds a, const kernels::key_bounds& b) {
  a.causal = a.causal || b.causal;
  a.narrow(b.left, b.right);
  return a;
}

}  // namespace qkv::detail
