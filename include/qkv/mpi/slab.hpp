// One operand of an attention (Q, K or V) as this process holds it: its
// rows in one dense buffer, [b0, b1, rows, cols] for a tensor and
// [rows, cols] for a matrix, in the element type it is stored or evaluated
// in; views of any run of its rows, of the operand's rank. What the ring
// sends and what each step's attention reads (<qkv/mpi.hpp>).
#pragma once

#include "../qkv.hpp"

#include <cstddef>
#include <type_traits>
#include <vector>

namespace qkv::mpi::detail {

using qkv::detail::bare_t;

template <class S, std::size_t Rank>
struct slab {
  static constexpr std::size_t rank = Rank;
  using element = S;
  std::size_t b0 = 1, b1 = 1, rows = 0, cols = 0;
  std::vector<S> data;

  std::size_t size() const { return b0 * b1 * rows * cols; }
  void resize(std::size_t r) {
    rows = r;
    data.resize(size());
  }
  // Rows [r0, r0 + count).
  auto view(std::size_t r0, std::size_t count) const {
    const S* p = data.data() + r0 * cols;
    if constexpr (Rank == 2) {
      return matrix_view<const S, dyn, dyn>(p, count, cols, cols);
    } else if constexpr (Rank == 3) {
      return tensor_view<const S, dyn, dyn, dyn>(p, {b1, count, cols}, {rows * cols, cols, 1});
    } else {
      return tensor_view<const S, dyn, dyn, dyn, dyn>(p, {b0, b1, count, cols}, {b1 * rows * cols, rows * cols, cols, 1});
    }
  }
  auto view() const { return view(0, rows); }
};

// x's element type in a slab: as stored for storage, as evaluated otherwise;
// C where the attention computes in C (2-byte operands widened, eval/widen.hpp).
template <class X, class C>
using slab_element_t = std::conditional_t<std::is_void_v<C>, std::remove_const_t<value_type_t<result_t<X>>>, C>;

// x's rows as a slab: storage copied, an expression evaluated first.
template <class C, class X>
auto slab_of(const X& x) {
  using S = slab_element_t<X, C>;
  constexpr std::size_t rank = qkv::detail::static_rank_of<bare_t<X>>();
  slab<S, rank> s;
  const auto fill = [&](const auto& v) {
    const batch_extents b = qkv::detail::batch_of(v);
    s.b0 = b[0], s.b1 = b[1], s.cols = v.cols();
    s.resize(v.rows());
    std::size_t at = 0;
    qkv::detail::for_each_batch_index(b, [&](batch_extents i) {
      const auto m = [&] {
        if constexpr (rank == 2) return matrix_view<const value_type_t<bare_t<decltype(v)>>, dyn, dyn>(v);
        else if constexpr (requires { v.view(); }) return v.view().batch_matrix(i);
        else return v.batch_matrix(i);
      }();
      for (std::size_t r = 0; r < m.rows(); ++r)
        for (std::size_t c = 0; c < m.cols(); ++c) s.data[at++] = static_cast<S>(m(r, c));
    });
  };
  if constexpr (leaf<bare_t<X>> || tensor_leaf<bare_t<X>>) fill(x);
  else fill(eval(x));
  return s;
}

}  // namespace qkv::mpi::detail
