// The key bounds each node sets (kernels/key_bounds.hpp holds the rule they
// feed): the registration of a kind of visibility. The naive masks, the
// gradient rules, the fused lowering and the cost model all read a node's
// bounds here, so a new kind is its node, an overload here, and what it
// changes in the rule.
#pragma once

#include "../expr/mask.hpp"
#include "../expr/positions.hpp"
#include "../expr/window.hpp"
#include "../kernels/key_bounds.hpp"

namespace qkv::detail {

// b, aligned by the positions the chain under a node has (expr/positions.hpp).
template <class S>
constexpr kernels::key_bounds positioned_by(kernels::key_bounds b, const S* under) {
  if (under == nullptr) return b;
  if (const auto p = find_positions(*under)) b.positioned = true, b.shift = p->q0 - p->k0;
  return b;
}

template <class S>
constexpr kernels::key_bounds node_bounds(const causal_expr<S>* c) {
  kernels::key_bounds b;
  b.causal = true;
  return positioned_by(b, arg_of(c));
}
// A window's extents are values of the expression: a walk over types alone
// (w null) finds no bound.
template <class S>
constexpr kernels::key_bounds node_bounds(const window_expr<S>* w) {
  kernels::key_bounds b;
  if (w != nullptr) b.narrow(w->left(), w->right());
  return positioned_by(b, arg_of(w));
}

template <class S>
concept sets_key_bounds = requires(const S* s) { node_bounds(s); };

// Bounds a and b both: causal if either is, the narrower window on each side.
constexpr kernels::key_bounds both_bounds(kernels::key_bounds a, const kernels::key_bounds& b) {
  a.causal = a.causal || b.causal;
  a.narrow(b.left, b.right);
  if (b.positioned) a.positioned = true, a.shift = b.shift;  // (a chain has one positions node)
  return a;
}

}  // namespace qkv::detail
