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

// f(index) for every index of the batch extents b, in order.
template <class F>
void for_each_batch_index(batch_extents b, F&& f) {
  for (std::size_t i = 0; i < b[0]; ++i)
    for (std::size_t j = 0; j < b[1]; ++j) f(batch_extents{i, j});
}

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

// Evaluates the batched expression e into out, whose extents are e's.
template <class Policy, class E, class T, std::size_t... X>
void batched_into(const E& e, const tensor_view<T, X...>& out) {
  const batch_extents b = batch_of(e);
  if constexpr (std::is_same_v<Policy, best_policy> && has_fused_form<E>) {
    if (out.stride(sizeof...(X) - 1) == 1) {
      const std::size_t count = b[0] * b[1];
      std::vector<fused_operands<T>> keep(count);
      std::vector<kernels::attention_problem<T>> problems;
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
      return;
    }
  }
  for_each_batch_index(b, [&](batch_extents i) { slice_into<Policy>(slice(e, i), out.batch_matrix(i)); });
}

}  // namespace qkv::detail
