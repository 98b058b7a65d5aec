// qkv::cost(e): what evaluating e costs, before running it: arithmetic,
// exponentials, and the memory each strategy allocates beyond e's inputs and
// output. It reads node types and extents only, so for static shapes it is a
// constant expression: constexpr auto c = qkv::static_cost<decltype(e)>();
//
// Conventions: a product of n×k by k×m is 2·n·k·m FLOPs; scaling and sums 1
// per element; softmax 4 per element (maximum, subtraction, sum, division)
// and one exponential; masks none. A fused attention counts what its kernel
// computes: every per-pair term for each pair of a query and a key it may
// see, i.e. all n·m pairs, or under causal and windows the visible ones
// (about half for causal; a window's extents are values, so static_cost,
// which reads types alone, counts its pairs as all); a mask matrix or a
// predicate counts every pair, its contents being data (the kernel skips
// the key blocks they empty). Node by node, every pair counts.
// Bytes are the intermediates a strategy materialises and, for a fused
// attention, its packed K and V and its score and output blocks (padding
// included), with the block sizes of the instruction set that runs (in a
// constant expression, of the widest the target's CPU family has: AVX-512 on
// x86-64, NEON on AArch64); the small, bounded packing buffers of the matrix
// product are not counted.
#pragma once

#include "fused.hpp"
#include "pages.hpp"
#include "ragged.hpp"
#include "slice.hpp"
#include "widen.hpp"

#include "../kernels/api.hpp"
#include "../kernels/arch_list.hpp"
#include "../kernels/blocking.hpp"

#include <algorithm>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace qkv {

struct cost_estimate {
  std::size_t flops = 0;
  std::size_t exps = 0;
  std::size_t naive_bytes = 0;  // by eval(e, qkv::naive)
  std::size_t fused_bytes = 0;  // by eval(e), fused wherever e has a fused form

  constexpr cost_estimate& operator+=(const cost_estimate& o) {
    flops += o.flops, exps += o.exps, naive_bytes += o.naive_bytes, fused_bytes += o.fused_bytes;
    return *this;
  }
  friend constexpr bool operator==(const cost_estimate&, const cost_estimate&) = default;
};

namespace detail {

// What the evaluators read in place: storage, and transposes of it.
template <class E>
inline constexpr bool viewable = storage_leaf<E>;
template <class X>
inline constexpr bool viewable<transpose_expr<X>> = viewable<bare_t<X>>;

// The fused kernel's block sizes (above).
template <class T>
constexpr kernels::blocking attention_blocking() {
  if (std::is_constant_evaluated()) return kernels::blocking_of<kernels::widest_built_arch_t, T>();
  return kernels::active_blocking(sizeof(T));
}

// The fused kernel's own buffers, on one thread.
template <class T>
constexpr std::size_t fused_workspace(std::size_t n, std::size_t m, std::size_t dk, std::size_t dv) {
  return attention_blocking<compute_t<T>>().workspace_size(n, m, dk, dv) * sizeof(compute_t<T>);
}

// The key bounds a score chain's causal and windows set, all of them
// (key_bounds_of.hpp); a window's extents are values of the expression, so a
// walk over types alone (s null) counts it as no bound.
template <class S>
constexpr kernels::key_bounds chain_bounds(const S* s) {
  if constexpr (is_elementwise_v<S>) {
    if constexpr (score_chain<S>::left) return chain_bounds(lhs_of(s));
    else return chain_bounds(rhs_of(s));
  } else if constexpr (requires(const S& x) { x.arg(); } && !is_softmax_v<S>) {  // the chain's unary nodes
    kernels::key_bounds b = chain_bounds(arg_of(s));
    if constexpr (sets_key_bounds<S>) b = both_bounds(b, node_bounds(s));
    return b;
  } else {
    return {};
  }
}


template <class E>
constexpr cost_estimate cost_of(const E* e, bool materialised);

// The operands a node's evaluator reads (expr/node.hpp).
template <class E>
struct evaluated_operands_of {
  using type = decltype(std::declval<const E&>().operands());
};
template <class E>
  requires requires(const E& e) { e.evaluated_operands(); }
struct evaluated_operands_of<E> {
  using type = decltype(std::declval<const E&>().evaluated_operands());
};
template <class E>
using evaluated_operands_t = typename evaluated_operands_of<E>::type;

// The cost of each operand a node's evaluator reads, in or out of a buffer
// of its own as the node says.
template <class E>
constexpr cost_estimate operands_cost(const E* e) {
  using ops = evaluated_operands_t<E>;
  static_assert(E::operand_buffers.size() == std::tuple_size_v<ops>,
                "qkv: a node's operand_buffers has one entry per operand");
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    cost_estimate c;
    if (e == nullptr) {
      ((c += cost_of(static_cast<const bare_t<std::tuple_element_t<I, ops>>*>(nullptr), E::operand_buffers[I])), ...);
    } else {
      const ops tuple = [e] {
        if constexpr (requires { e->evaluated_operands(); }) return e->evaluated_operands();
        else return e->operands();
      }();
      ((c += cost_of(&std::get<I>(tuple), E::operand_buffers[I])), ...);
    }
    return c;
  }(std::make_index_sequence<std::tuple_size_v<ops>>{});
}

// What a fused evaluation spends on a score chain's operands (Q, K and a
// bias that are not storage get evaluated into buffers). `Modified`: a
// score_mod is around s (neg_sq_l2 then keeps the queries' norms too).
template <class S, bool Modified = false>
constexpr cost_estimate chain_operands_cost(const S* s) {
  if constexpr (is_product_v<S>) {
    cost_estimate c = cost_of(lhs_of(s), true);
    c += cost_of(arg_of(rhs_of(s)), true);
    return c;
  } else if constexpr (is_similarity_v<S>) {
    return operands_cost(s);
  } else if constexpr (is_neg_sq_l2_v<S>) {
    cost_estimate c = cost_of(lhs_of(s), true);
    c += cost_of(rhs_of(s), true);
    c.fused_bytes += (rows_of(rhs_of(s)) + (Modified ? rows_of(lhs_of(s)) : 0)) * sizeof(compute_t<value_type_t<S>>);  // the norms
    return c;
  } else if constexpr (is_elementwise_v<S>) {
    if constexpr (score_chain<S>::left) {
      cost_estimate c = chain_operands_cost<bare_t<decltype(*lhs_of(s))>, Modified>(lhs_of(s));
      c += cost_of(rhs_of(s), true);
      return c;
    } else {
      cost_estimate c = chain_operands_cost<bare_t<decltype(*rhs_of(s))>, Modified>(rhs_of(s));
      c += cost_of(lhs_of(s), true);
      return c;
    }
  } else {  // scaled, causal, masked, score_mod
    return chain_operands_cost<bare_t<decltype(*arg_of(s))>, Modified || is_score_mod_v<S>>(arg_of(s));
  }
}

// The head size of a score chain: the columns of its Q.
template <class S>
constexpr std::size_t chain_dk(const S* s) {
  if constexpr (is_product_v<S> || is_neg_sq_l2_v<S>) {
    return cols_of(lhs_of(s));
  } else if constexpr (is_similarity_v<S>) {
    return S::width_of(s);
  } else if constexpr (is_elementwise_v<S>) {
    if constexpr (score_chain<S>::left) return chain_dk(lhs_of(s));
    else return chain_dk(rhs_of(s));
  } else {
    return chain_dk(arg_of(s));
  }
}

// What a fused evaluation of softmax(S) * V costs, from what it costs node
// by node: no score matrix, only the kernel's buffers and whatever Q, K, V
// and a bias need; every per-pair term for the pairs the kernel computes.
template <class E>
constexpr cost_estimate fused_attention_cost(const E* e, cost_estimate node_by_node) {
  using T = value_type_t<E>;
  using S = bare_t<decltype(lhs_of(e)->arg())>;
  const S* s = arg_of(lhs_of(e));
  cost_estimate c = node_by_node;
  const std::size_t n = rows_of(e), m = cols_of(e), mk = cols_of(s), all = n * mk;
  const std::size_t pairs = kernels::visible_pairs(chain_bounds(s), n, mk);
  const cost_estimate ops = chain_operands_cost(s), v = cost_of(rhs_of(e), true);
  c.fused_bytes = ops.fused_bytes + v.fused_bytes + fused_workspace<T>(n, mk, chain_dk(s), m);
  if (all != 0 && pairs != all) {
    c.flops = ops.flops + v.flops + (c.flops - ops.flops - v.flops) / all * pairs;
    c.exps = ops.exps + v.exps + (c.exps - ops.exps - v.exps) / all * pairs;
  }
  return c;
}

// The cost of e. `materialised`: e's value gets a buffer of its own (it is
// an operand of a product, say), rather than being written in place into its
// parent's buffer or into the output. Storage costs nothing; a node, what
// it says it adds (expr/node.hpp) and what its operands cost.
template <class E>
constexpr cost_estimate cost_of(const E* e, bool materialised) {
  cost_estimate c;
  if constexpr (!viewable<E> || is_transpose_v<E>) {
    const std::size_t own = materialised && !viewable<E> ? rows_of(e) * cols_of(e) * sizeof(compute_t<value_type_t<E>>) : 0;
    const node_work w = E::work(e);
    c.flops = w.flops, c.exps = w.exps;
    c.naive_bytes = c.fused_bytes = w.scratch_bytes;
    c += operands_cost(e);
    if constexpr (fused_form<E>::value) c = fused_attention_cost(e, c);
    c.naive_bytes += own, c.fused_bytes += own;
  }
  return c;
}

// A batched expression is evaluated one batch index at a time (naive), or
// with every index's operands at hand and the kernel's buffers reused
// (fused): arithmetic counts times the number of indices, naive bytes of one
// index, fused bytes of one index's buffers plus every index's evaluated
// operands. The kernel's buffers are per thread: with t threads, add t − 1
// times fused_workspace.
template <class E>
constexpr cost_estimate batched_cost(const E* e, std::size_t count) {
  cost_estimate c = cost_of(e, false);
  c.flops *= count;
  c.exps *= count;
  if constexpr (fused_form<E>::value) {
    const auto* s = arg_of(lhs_of(e));
    const std::size_t workspace = fused_workspace<value_type_t<E>>(rows_of(e), cols_of(s), chain_dk(s), cols_of(e));
    c.fused_bytes = count * (c.fused_bytes - workspace) + workspace;
  }
  return c;
}

template <class E>
constexpr std::size_t batch_count(const E* e) {
  constexpr batch_extents b = static_batch_of<E>();
  if constexpr (is_static(b[0]) && is_static(b[1])) return b[0] * b[1];
  else return batch_of(*e)[0] * batch_of(*e)[1];
}

// The float copies of e's 2-byte leaves (eval/widen.hpp).
template <class E>
constexpr std::size_t widened_bytes(const E* e) {
  if constexpr (!reads_half<E>()) {
    return 0;
  } else if constexpr (storage_leaf<E>) {
    return rows_of(e) * cols_of(e) * batch_count(e) * sizeof(float);
  } else {
    using ops = operands_t<E>;
    return [&]<std::size_t... I>(std::index_sequence<I...>) -> std::size_t {
      if (e == nullptr) return (widened_bytes(static_cast<const bare_t<std::tuple_element_t<I, ops>>*>(nullptr)) + ... + 0);
      const ops tuple = e->operands();
      return (widened_bytes(&std::get<I>(tuple)) + ... + 0);
    }(std::make_index_sequence<std::tuple_size_v<ops>>{});
  }
}

// The float copies a fused evaluation does without: K and V that the
// kernel reads as stored (eval/fused.hpp).
template <class E>
constexpr std::size_t stored_kv_bytes(const E* e) {
  if constexpr (!reads_kv_as_stored<E>) {
    return 0;
  } else {
    using chain = score_chain<typename fused_form<E>::scores>;
    return widened_bytes(chain::keys_of(arg_of(lhs_of(e)))) + widened_bytes(rhs_of(e));
  }
}

// An expression with 2-byte leaves is evaluated in float on float copies of
// them (but K and V the fused kernel reads as stored); a 2-byte result is
// the float one, rounded.
template <class E>
constexpr cost_estimate total_cost(const E* e) {
  cost_estimate c = batched_cost(e, batch_count(e));
  std::size_t extra = widened_bytes(e);
  if constexpr (half_element<value_type_t<E>>) extra += rows_of(e) * cols_of(e) * batch_count(e) * sizeof(float);
  c.naive_bytes += extra, c.fused_bytes += extra - stored_kv_bytes(e);
  return c;
}

// A ragged e, or one over paged K and V: its sequences' costs, each its
// matrix expression's at head 0 times the heads; the naive bytes of the
// largest (one index at a time).
template <class E>
cost_estimate ragged_cost(const E& e) {
  const batch_extents b = batch_of(e);
  cost_estimate c;
  for (std::size_t s = 0; s < b[0]; ++s) {
    const auto part = slice(e, {s, 0});
    cost_estimate one = total_cost(&part);
    const std::size_t naive = one.naive_bytes;
    one.flops *= b[1], one.exps *= b[1], one.fused_bytes *= b[1], one.naive_bytes = 0;
    c += one;
    c.naive_bytes = std::max(c.naive_bytes, naive);
  }
  return c;
}

}  // namespace detail

// What evaluating e costs (the conventions are at the top of this file).
template <expression E>
constexpr cost_estimate cost(const E& e) {
  if constexpr (detail::is_ragged_v<E> || detail::reads_pages<E>()) return detail::ragged_cost(e);
  else return detail::total_cost(&e);
}

// The same from the type alone; a constant expression when every extent in
// E is static.
template <class E>
constexpr cost_estimate static_cost() {
  constexpr const detail::bare_t<E>* none = nullptr;
  return detail::total_cost(none);
}
}  // namespace qkv
