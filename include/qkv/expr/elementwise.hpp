// A + B and A - B, elementwise on expressions of one shape.
#pragma once

#include "../shape/check.hpp"
#include "node.hpp"

#include <array>
#include <tuple>
#include <type_traits>
#include <utility>

namespace qkv {

enum class elementwise_op { add, subtract };

template <class A, class B, elementwise_op Op>
class elementwise_expr
    : public detail::binary<A, B, common_extent(detail::bare_t<A>::static_rows, detail::bare_t<B>::static_rows),
                            common_extent(detail::bare_t<A>::static_cols, detail::bare_t<B>::static_cols)> {
  using a_t = detail::bare_t<A>;
  using b_t = detail::bare_t<B>;
  using base = detail::binary<A, B, common_extent(a_t::static_rows, b_t::static_rows),
                              common_extent(a_t::static_cols, b_t::static_cols)>;
  static_assert(value_element<value_type_t<A>>, "qkv: A + B, A - B: A must be a float or double matrix, or a bf16 or f16 one (bool is for masks)");
  static_assert(mixable_elements<value_type_t<A>, value_type_t<B>>, "qkv: A + B, A - B: A and B have different element types (float mixes with bf16 or f16, nothing else)");
  static_assert(static_extents_agree<a_t::static_rows, b_t::static_rows>, "qkv: A + B, A - B: the rows of A differ from the rows of B");
  static_assert(static_extents_agree<a_t::static_cols, b_t::static_cols>, "qkv: A + B, A - B: the columns of A differ from the columns of B");
  static constexpr batch_extents a_batch = detail::static_batch_of<a_t>(), b_batch = detail::static_batch_of<b_t>();
  static_assert(static_batches_agree<a_batch[0], a_batch[1], b_batch[0], b_batch[1], false>,
                "qkv: A + B, A - B: the batch extents of A and B differ (each pair must be equal or one 1)");

 public:
  static constexpr elementwise_op op = Op;

  template <class L, class R>
  elementwise_expr(L&& a, R&& b) : base(std::forward<L>(a), std::forward<R>(b)) {
    this->require_batch(Op == elementwise_op::add ? "A + B: the batch extents differ" : "A - B: the batch extents differ");
    detail::require_same_shape(this->lhs(), this->rhs(), Op == elementwise_op::add ? "A + B: the shapes differ" : "A - B: the shapes differ");
  }

  std::size_t rows() const { return this->lhs().rows(); }
  std::size_t cols() const { return this->lhs().cols(); }

  template <class L, class R>
  auto rebuild(L&& a, R&& b) const {
    return elementwise_expr<detail::closure_t<L&&>, detail::closure_t<R&&>, Op>(std::forward<L>(a), std::forward<R>(b));
  }
  // A in place, B in a buffer; one operation per element.
  static constexpr std::array<bool, 2> operand_buffers{false, true};
  static constexpr detail::node_work work(const elementwise_expr* e) { return {detail::rows_of(e) * detail::cols_of(e)}; }
};

template <class E>
inline constexpr bool is_elementwise_v = false;
template <class A, class B, elementwise_op Op>
inline constexpr bool is_elementwise_v<elementwise_expr<A, B, Op>> = true;

template <expression A, expression B>
auto operator+(A&& a, B&& b) {
  return elementwise_expr<detail::closure_t<A&&>, detail::closure_t<B&&>, elementwise_op::add>(std::forward<A>(a),
                                                                                               std::forward<B>(b));
}

template <expression A, expression B>
auto operator-(A&& a, B&& b) {
  return elementwise_expr<detail::closure_t<A&&>, detail::closure_t<B&&>, elementwise_op::subtract>(
      std::forward<A>(a), std::forward<B>(b));
}

}  // namespace qkv
