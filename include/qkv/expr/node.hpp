// The traits every expression node shares. Nodes only describe a
// computation; the strategies in eval/ carry it out.
//
// A node is its expr/ file plus its evaluator (eval/naive.hpp). What the
// generic walks of eval/ (slicing, cost, aliasing, explain) need of it, it
// says itself:
//   operands()          its operands, a tuple of const references;
//   rebuild(x...)       the same node over other operands (slicing a batch);
//   operand_buffers     for each operand that is not storage, whether its
//                       evaluator gives it a buffer of its own (true) or
//                       writes it in place into the node's result (false);
//   work(e)             the arithmetic it adds to its operands' (qkv::cost);
//                       e is null in a walk over types alone;
//   evaluated_operands() (optional) what its evaluator reads, when that is
//                       not operands(): a similarity reads f's queries(Q).
// same_shape_unary and binary below give the usual defaults.
#pragma once

#include "../shape/batch.hpp"
#include "expression.hpp"

#include <array>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace qkv::detail {

// What a node computes beyond its operands (qkv::cost's conventions).
struct node_work {
  std::size_t flops = 0;
  std::size_t exps = 0;
  std::size_t scratch_bytes = 0;  // what its naive evaluator keeps beside its result
};

// A node's extents: the static ones where it has them, else read from the
// node (which is then never null).
template <class E>
constexpr std::size_t rows_of(const E* e) {
  if constexpr (is_static(E::static_rows)) return E::static_rows;
  else return e->rows();
}
template <class E>
constexpr std::size_t cols_of(const E* e) {
  if constexpr (is_static(E::static_cols)) return E::static_cols;
  else return e->cols();
}

// Operands of a node, or null in a walk over types alone.
template <class E>
constexpr auto arg_of(const E* e) {
  return e == nullptr ? nullptr : &e->arg();
}
template <class E>
constexpr auto lhs_of(const E* e) {
  return e == nullptr ? nullptr : &e->lhs();
}
template <class E>
constexpr auto rhs_of(const E* e) {
  return e == nullptr ? nullptr : &e->rhs();
}

// Rank 2 for matrices; 3 or 4 when an operand is a tensor, whose leading
// extents (Batch, see shape/batch.hpp) the node then has too.
template <class V, std::size_t R, std::size_t C, std::size_t Rank = 2, batch_extents Batch = batch_extents{1, 1}>
struct node {
  using value_type = V;
  static constexpr bool qkv_expression = true;
  static constexpr bool qkv_is_view = false;
  static constexpr std::size_t static_rows = R;
  static constexpr std::size_t static_cols = C;
  static constexpr std::size_t static_rank = Rank;
  static constexpr batch_extents static_batch = Batch;
};

// The node of one operand with the operand's batch extents and the given matrix extents.
template <class X, std::size_t R, std::size_t C>
using unary_node = node<value_type_t<X>, R, C, static_rank_of<bare_t<X>>(), static_batch_of<bare_t<X>>()>;

// A node of one operand whose shape it keeps: softmax, causal, scaling.
template <class X>
class same_shape_unary : public unary_node<X, bare_t<X>::static_rows, bare_t<X>::static_cols> {
 public:
  template <class A>
  explicit same_shape_unary(A&& a) : arg_(std::forward<A>(a)) {}

  std::size_t rows() const { return arg_.rows(); }
  std::size_t cols() const { return arg_.cols(); }
  batch_extents batch() const { return batch_of(arg_); }
  const bare_t<X>& arg() const { return arg_; }
  auto operands() const { return std::tie(arg_); }

  // Evaluated in place, at no cost of its own unless the node says so.
  static constexpr std::array<bool, 1> operand_buffers{false};
  static constexpr node_work work(const void*) { return {}; }

 private:
  X arg_;
};

// The batch and head indices (b, h) of the slice of a batched expression a
// node was built for, which eval/slice.hpp sets; {0, 0} for a matrix. Nodes
// whose functors or values depend on them (score_mod, masked with a
// predicate, softmax with per-head sinks) have one.
class slice_position {
 public:
  std::size_t batch_index() const { return at_[0]; }
  std::size_t head_index() const { return at_[1]; }
  batch_extents position() const { return at_; }
  void at_slice(batch_extents index) { at_ = index; }

 private:
  batch_extents at_{0, 0};
};

template <class A, class B>
constexpr std::size_t max_rank() {
  constexpr std::size_t a = static_rank_of<bare_t<A>>(), b = static_rank_of<bare_t<B>>();
  return a > b ? a : b;
}

// A node of two operands; the derived node checks their shapes. Its batch
// extents are the operands' combined (Grouped: a product, where the left
// one may be a multiple of the right one).
// A binary node's element type: float where float meets a 2-byte type, else
// the left operand's (a mask's bool, or a mix its node reports).
template <class A, class B>
using binary_value_t = std::conditional_t<mixable_elements<value_type_t<A>, value_type_t<B>>,
                                          common_element_t<value_type_t<A>, value_type_t<B>>, value_type_t<A>>;

template <class A, class B, std::size_t R, std::size_t C, bool Grouped = false>
class binary : public node<binary_value_t<A, B>, R, C, max_rank<A, B>(),
                           combine_batch(static_batch_of<bare_t<A>>(), static_batch_of<bare_t<B>>(), Grouped)> {
 public:
  template <class L, class M>
  binary(L&& a, M&& b) : a_(std::forward<L>(a)), b_(std::forward<M>(b)) {}

  const bare_t<A>& lhs() const { return a_; }
  const bare_t<B>& rhs() const { return b_; }
  auto operands() const { return std::tie(a_, b_); }
  batch_extents batch() const { return combine_batch(batch_of(a_), batch_of(b_), Grouped); }

  // Each operand in a buffer of its own, at no cost of its own unless the node says so.
  static constexpr std::array<bool, 2> operand_buffers{true, true};
  static constexpr node_work work(const void*) { return {}; }

 protected:
  // The run-time half of the batch check, for the derived node's constructor.
  void require_batch(const char* what) const { detail::require_batch(batch_of(a_), batch_of(b_), Grouped, what); }

 private:
  A a_;
  B b_;
};

// Whether a storage leaf of e's operands, walked down to the leaves, is an
// Is (Is<L>::value): a ragged operand, a paged one.
template <template <class> class Is, class E>
constexpr bool reads_leaf() {
  if constexpr (storage_leaf<E>) {
    return Is<E>::value;
  } else {
    using ops = decltype(std::declval<const E&>().operands());
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (reads_leaf<Is, bare_t<std::tuple_element_t<I, ops>>>() || ... || false);
    }(std::make_index_sequence<std::tuple_size_v<ops>>{});
  }
}

}  // namespace qkv::detail
