// The traits every expression node shares. Nodes only describe a
// computation; the strategies in eval/ carry it out.
#pragma once

#include "expression.hpp"

#include <cstddef>
#include <tuple>
#include <utility>

namespace qkv::detail {

template <class V, std::size_t R, std::size_t C>
struct node {
  using value_type = V;
  static constexpr bool qkv_expression = true;
  static constexpr bool qkv_is_view = false;
  static constexpr std::size_t static_rows = R;
  static constexpr std::size_t static_cols = C;
};

// A node of one operand whose shape it keeps: softmax, causal, scaling.
template <class X>
class same_shape_unary : public node<value_type_t<X>, bare_t<X>::static_rows, bare_t<X>::static_cols> {
 public:
  template <class A>
  explicit same_shape_unary(A&& a) : arg_(std::forward<A>(a)) {}

  std::size_t rows() const { return arg_.rows(); }
  std::size_t cols() const { return arg_.cols(); }
  const bare_t<X>& arg() const { return arg_; }
  auto operands() const { return std::tie(arg_); }

 private:
  X arg_;
};

// A node of two operands; the derived node checks their shapes.
template <class A, class B, std::size_t R, std::size_t C>
class binary : public node<value_type_t<A>, R, C> {
 public:
  template <class L, class M>
  binary(L&& a, M&& b) : a_(std::forward<L>(a)), b_(std::forward<M>(b)) {}

  const bare_t<A>& lhs() const { return a_; }
  const bare_t<B>& rhs() const { return b_; }
  auto operands() const { return std::tie(a_, b_); }

 private:
  A a_;
  B b_;
};

}  // namespace qkv::detail
