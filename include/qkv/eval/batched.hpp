// Evaluation of batched expressions (over tensors): one matrix expression per
// batch index (eval/slice.hpp), evaluated by the same strategies. The fused
// strategy hands every batch index's attention to the kernel in one call, so
// the kernel can spread batch × heads × query blocks over the threads and
// pack a key/value head once for all the query heads that read it.
#pragma once

#include "../storage/tensor_view.hpp"
#include "fused.hpp"
#include "naive.hpp"
#include "slice.hpp"

#include <cstddef>
#include <optional>
#include <type_traits>
#include <vector>

namespace qkv::detail {

template <class E>
inline constexpr bool is_batched_v = static_rank_of<bare_t<E>>() > 2;

// Evaluates a matrix expression into a view; the kernels write rows of unit
// column stride, so another destination gets a copy.
template <class Policy, class S, class T, std::size_t R, std::size_t C>
void slice_into(const S& s, const matrix_view<T, R, C>& out) {
  if (out.col_stride() == 1) {
    Policy::into(s, dense(out.data(), out.rows(), out.cols(), out.row_stride()));
  } else {
    const operand<T> value = node_operand<Policy>(s);
    copy_strided(value.view, kernels::strided<T>{out.data(), out.rows(), out.cols(),
                                                 static_cast<std::ptrdiff_t>(out.row_stride()),
                                                 static_cast<std::ptrdiff_t>(out.col_stride())});
  }
}

// Every batch index of e's fused attention in one call of the kernel, into
// out (a tensor_view or ragged_view of e's extents, unit column stride;
// float for 2-byte inputs).
template <class Policy, class E, class Out>
void batched_fused_into(const E& e, const Out& out) {
  const batch_extents b = batch_of(e);
  const std::size_t count = b[0] * b[1];
  std::vector<fused_operands_t<E>> keep(count);
  std::vector<fused_problem_t<E>> problems;
  problems.reserve(count);
  std::optional<fused_extension_t<E>> ext;  // the functors are those of e: the first index's serve all
  for_each_batch_index(b, [&](batch_extents i) {
    const auto o = out.batch_matrix(i);
    fused_extension_t<E> mine;
    problems.push_back(attention_problem_of<Policy>(slice(e, i), dense(o.data(), o.rows(), o.cols(), o.row_stride()),
                                                    keep[problems.size()], mine));
    if (!ext) ext.emplace(std::move(mine));
  });
  if (ext) run_attention(problems.data(), problems.size(), *ext);
}

// Evaluates the batched expression e into out (a tensor_view or
// ragged_view), whose extents are e's.
template <class Policy, class E, class Out>
void batched_into(const E& e, const Out& out) {
  if constexpr (std::is_same_v<Policy, best_policy> && has_fused_form<E>) {
    if (out.stride(Out::static_rank - 1) == 1) {
      batched_fused_into<Policy>(e, out);
      return;
    }
  }
  for_each_batch_index(batch_of(e), [&](batch_extents i) { slice_into<Policy>(slice(e, i), out.batch_matrix(i)); });
}

}  // namespace qkv::detail
