// Reverse mode: gradient(e, dO, wrt(X...)) is the gradient of Σ dO ∘ e with
// respect to each leaf X, and vjp(e) the forward value with a pullback that
// gives the same. The walk from the result down and each node's rule are
// gradient_rules.hpp's, the fused attention's gradient_fused.hpp's; here:
// the gradients' types and rounding, batched expressions, the strategies
// and vjp. A batched e is
// differentiated one batch index at a time (eval/slice.hpp), each index's
// gradients added into the targets at the index they read; a batched
// attention with a fused backward gives all its indices to the kernels at
// once.
//
// Float and double matrices and tensors, with the nodes of gradient_rules.hpp
// and gradient_extensions.hpp; expressions on bf16 or f16 (alone, or float
// queries over a 2-byte K and V) are differentiated in float, on float
// copies of their leaves, and each gradient rounded once to its leaf's type.
#pragma once

#include "../kernels/api.hpp"
#include "../shape/check.hpp"
#include "../storage/aligned_buffer.hpp"
#include "../storage/matrix.hpp"
#include "../storage/tensor.hpp"
#include "../eval/eval.hpp"
#include "extensions.hpp"
#include "fused.hpp"
#include "rules.hpp"
#include "../eval/slice.hpp"
#include "../eval/strategy.hpp"

#include <cstddef>
#include <limits>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace qkv {
namespace detail {

// A gradient in X's storage type and extents: a matrix for a matrix, a
// tensor for a tensor.
template <class X>
using gradient_of_t = storage_like_t<X>;

// A gradient sum in X's storage: rounded once where X is bf16 or f16.
template <class X, class T>
gradient_of_t<X> stored_as(const grad_matrix<T>& g) {
  using S = std::remove_const_t<value_type_t<X>>;
  gradient_of_t<X> r(g.rows(), g.cols());
  for (std::size_t i = 0; i < g.rows(); ++i)
    for (std::size_t j = 0; j < g.cols(); ++j) r(i, j) = static_cast<S>(g(i, j));
  return r;
}
// Moved where the sum is already of that type.
template <class X, class T>
gradient_of_t<X> stored_as(grad_matrix<T>&& g) {
  if constexpr (std::is_same_v<gradient_of_t<X>, grad_matrix<T>>) return std::move(g);
  else return stored_as<X>(std::as_const(g));
}

template <class X>
inline constexpr bool differentiable_leaf = (leaf<X> || tensor_leaf<X>) && value_element<std::remove_const_t<value_type_t<X>>>;

// The unrounded sums of the gradients reaching each X, for a matrix e and
// matrix X.
template <class T, class E, class D, class... X>
auto gradient_sums(const E& e, const D& d_out, const wrt_t<X...>& w, bool fuse, const forward_kept<T>* kept) {
  require_same_shape(e, d_out, "gradient(e, dO, wrt(X...)): the shapes of e and dO differ");
  gradients<T, X...> acc{w, {}, fuse, kept, {}};
  if constexpr (std::is_same_v<D, grad_matrix<T>>) {
    if (reads_any(e, w)) backprop(e, d_out, acc);  // dO as it is, not a copy
  } else {
    backprop_into(e, [&] { return value_of<T>(d_out); }, acc);
  }
  return std::move(acc.all_sums());
}

// The sum for target X of a batched e: a matrix (X broadcast over the batch)
// or X's tensor, in T.
template <class T, class X>
struct batched_sum {
  grad_matrix<T> whole;  // a matrix X
  std::vector<grad_matrix<T>> at;  // a tensor X: one per batch index of X

  explicit batched_sum(const X& x) {
    if constexpr (tensor_leaf<X>) {  // (a ragged's matrices differ in rows)
      for_each_batch_index(batch_of(x), [&](batch_extents b) {
        const auto m = x.batch_matrix(b);
        at.emplace_back(m.rows(), m.cols());
      });
    } else {
      whole = grad_matrix<T>(x.rows(), x.cols());
    }
  }
  grad_matrix<T>& of(const X& x, batch_extents index) {
    if constexpr (tensor_leaf<X>) return at[index[0] * batch_of(x)[1] + index[1]];
    else return whole;
  }
  gradient_of_t<X> stored(const X& x) const {
    if constexpr (tensor_leaf<X>) {
      using S = std::remove_const_t<value_type_t<X>>;
      gradient_of_t<X> r = [&] {
        if constexpr (ragged_leaf<X>) return ragged_like<S>(x);
        else return gradient_of_t<X>(x.extents());
      }();
      for_each_batch_index(batch_of(x), [&](batch_extents b) {
        const grad_matrix<T>& g = at[b[0] * batch_of(x)[1] + b[1]];
        const auto to = r.view().batch_matrix(b);
        for (std::size_t i = 0; i < g.rows(); ++i)
          for (std::size_t j = 0; j < g.cols(); ++j) to(i, j) = static_cast<S>(g(i, j));
      });
      return r;
    } else {
      return stored_as<X>(whole);
    }
  }
};

// X as the matrix a slice of e at index reads: a tensor's matrix at the
// index its batch extents map it to (broadcast, grouped), a matrix itself.
template <class X>
auto target_slice(const X& x, batch_extents index, batch_extents combined) {
  if constexpr (tensor_leaf<X>) return slice(x, operand_batch_index(index, combined, batch_of(x)));
  else return slice(x, index);
}

// One batch index's gradient sums (got, for the targets sliced at index)
// added into the batched sums of the targets.
template <class E, class... X, class Sums, class Got>
void add_slice_sums(const E& e, const wrt_t<X...>& w, batch_extents index, Sums& sums, const Got& got) {
  const batch_extents combined = batch_of(e);
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((add_into(std::get<I>(sums).of(std::get<I>(w.leaves), tensor_leaf<bare_t<decltype(std::get<I>(w.leaves))>>
                                                             ? operand_batch_index(index, combined, batch_of(std::get<I>(w.leaves)))
                                                             : index),
               std::get<I>(got))),
     ...);
  }(std::index_sequence_for<X...>{});
}

// A batched attention with a fused backward, every batch index in one call
// of the forward and one of the backward (heads over threads, a key/value
// head packed once for its query heads); then each index's dQ, dK and dV
// on into its operands, as batched_gradient adds them (a differentiated
// bias's gradient too). Returns false, doing nothing, where a functor reads
// a target through its operands() (node by node then, which says so).
template <class T, class E, class D, class... X, class Sums>
bool batched_fused_gradient(const E& e, const D& d_out, const wrt_t<X...>& w, Sums& sums) {
  using P = slice_t<E>;
  const batch_extents combined = batch_of(e);
  std::vector<batch_extents> at;
  for_each_batch_index(combined, [&](batch_extents index) { at.push_back(index); });
  const auto targets_at = [&](batch_extents index) {
    return std::apply([&](const auto&... x) { return std::tuple{target_slice(x, index, combined)...}; }, w.leaves);
  };
  for (const batch_extents index : at) {
    const auto targets = targets_at(index);
    const auto sliced = std::apply([](const auto&... x) { return wrt_t<bare_t<decltype(x)>...>{std::tie(x...)}; }, targets);
    if (functor_reads_target(slice(e, index).lhs().arg(), sliced)) return false;
  }
  const std::size_t count = at.size();
  std::vector<P> parts;
  parts.reserve(count);
  std::vector<fused_operands<T, T>> keep(count);
  std::vector<forward_kept<T>> forward(count);
  std::vector<kernels::attention_problem<T>> problems;
  problems.reserve(count);
  fused_extension_t<P> ext;
  for (std::size_t x = 0; x < count; ++x) {
    parts.push_back(slice(e, at[x]));
    forward[x].out = grad_matrix<T>(parts[x].rows(), parts[x].cols());
    forward[x].row_stats = aligned_buffer<T>(2 * parts[x].rows(), aligned_buffer<T>::uninitialized);
    T* stats = forward[x].row_stats.data();
    for (std::size_t i = 0; i < parts[x].rows(); ++i)
      stats[2 * i] = -std::numeric_limits<T>::infinity(), stats[2 * i + 1] = T(0);
    problems.push_back(attention_problem_of<best_policy, P, T>(parts[x], view_of<T>(forward[x].out), keep[x], ext));
    problems.back().row_stats = stats;
  }
  run_attention(problems.data(), count, ext);
  std::vector<grad_matrix<T>> d_o(count), dq(count), dk(count), dv(count), db(count);
  std::vector<std::vector<T>> dw(count), dt(count);
  std::vector<kernels::attention_gradient<T>> grads;
  grads.reserve(count);
  for (std::size_t x = 0; x < count; ++x) {
    const kernels::attention_problem<T>& p = problems[x];
    d_o[x] = value_of<T>(slice(d_out, at[x]));
    dq[x] = grad_matrix<T>(p.q.rows, p.q.cols), dk[x] = grad_matrix<T>(p.k.rows, p.q.cols);
    dv[x] = grad_matrix<T>(p.k.rows, p.v.cols);
    const auto targets = targets_at(at[x]);
    dw[x] = std::apply([&](const auto&... t) {
      return term_weight_sums<T>(parts[x], p.q.cols, wrt_t<bare_t<decltype(t)>...>{std::tie(t...)});
    }, targets);
    grads.push_back({view_of<const T>(d_o[x]), view_of<const T>(forward[x].out), forward[x].row_stats.data(),
                     view_of<T>(dq[x]), view_of<T>(dk[x]), view_of<T>(dv[x]), dw[x].empty() ? nullptr : dw[x].data()});
    const auto sliced = std::apply([](const auto&... t) { return wrt_t<bare_t<decltype(t)>...>{std::tie(t...)}; }, targets);
    if (chain_bias_reads_any(parts[x].lhs().arg(), sliced))
      db[x] = grad_matrix<T>(p.q.rows, p.k.rows), grads.back().d_bias = view_of<T>(db[x]);
    dt[x] = table_sums_for(parts[x].lhs().arg(), sliced, grads.back());
  }
  std::vector<norm_sums<T>> norms(has_norm_sums<P> ? count : 0);
  if constexpr (has_norm_sums<P>)
    for (std::size_t x = 0; x < count; ++x) {
      norms[x].widen(problems[x]);
      dq[x] = grad_matrix<T>(problems[x].q.rows, problems[x].q.cols);
      dk[x] = grad_matrix<T>(problems[x].k.rows, problems[x].q.cols);
      grads[x].dq = view_of<T>(dq[x]), grads[x].dk = view_of<T>(dk[x]);
    }
  run_backward(problems.data(), grads.data(), count, ext);
  if constexpr (has_norm_sums<P>)
    for (std::size_t x = 0; x < count; ++x) norms[x].fold(problems[x], dq[x], dk[x]);
  for (std::size_t x = 0; x < count; ++x) {
    const auto targets = targets_at(at[x]);
    const auto sliced = std::apply([](const auto&... t) { return wrt_t<bare_t<decltype(t)>...>{std::tie(t...)}; }, targets);
    auto acc = std::apply([&](const auto&... t) {
      return gradients<T, bare_t<decltype(t)>...>{sliced, {}, true, nullptr, {}};
    }, targets);
    propagate_attention(parts[x], std::move(dq[x]), std::move(dk[x]), std::move(dv[x]), dw[x], acc);
    if (db[x].rows() != 0)
      with_chain_bias(parts[x].lhs().arg(), [&](const auto& b) { backprop_into(b, [&] { return db[x]; }, acc); });
    propagate_tables(parts[x].lhs().arg(), dt[x], acc);
    fused_sink_backprop(parts[x], d_o[x], forward[x].out, forward[x].row_stats.data(), acc);
    add_slice_sums(e, w, at[x], sums, acc.all_sums());
  }
  return true;
}

// A batched e: each batch index's matrix expression (eval/slice.hpp), its
// gradients added, in batch order, into the targets at the index each reads
// (a grouped key/value head sums its query heads; a broadcast operand sums
// the batch).
template <class T, class E, class D, class... X>
auto batched_gradient(const E& e, const D& d_out, const wrt_t<X...>& w, bool fuse) {
  static_assert(ragged_leaf<D> == is_ragged_v<E>,
                "qkv: gradient(e, dO, wrt(X...)): for e on ragged operands dO is a ragged or ragged_view, and only then");
  if constexpr (ragged_leaf<D> != is_ragged_v<E>) {
    return std::tuple<gradient_of_t<X>...>{};  // (the assertion has said what is wrong)
  } else if constexpr (is_ragged_v<E>) {
    require_ragged_shape(d_out, e, "gradient(e, dO, wrt(X...))");
  } else if (result_extents(e) != d_out.extents()) {
    throw shape_error("qkv: gradient(e, dO, wrt(X...)): the shapes of e and dO differ: e is " +
                      extents_string(result_extents(e)) + ", dO is " + extents_string(d_out.extents()));
  }
  const batch_extents combined = batch_of(e);
  auto sums = std::apply([](const auto&... x) { return std::tuple<batched_sum<T, bare_t<decltype(x)>>...>{batched_sum<T, bare_t<decltype(x)>>(x)...}; }, w.leaves);
  const auto stored = [&] {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple<gradient_of_t<X>...>{std::get<I>(sums).stored(std::get<I>(w.leaves))...};
    }(std::index_sequence_for<X...>{});
  };
  if constexpr (has_fused_backward<slice_t<E>>)
    if (fuse && batched_fused_gradient<T>(e, d_out, w, sums)) return stored();
  for_each_batch_index(combined, [&](batch_extents index) {
    const auto part = slice(e, index);
    const auto d_part = slice(d_out, index);
    const auto targets = std::apply([&](const auto&... x) { return std::tuple{target_slice(x, index, combined)...}; }, w.leaves);
    const auto sliced = std::apply([](const auto&... x) { return wrt_t<bare_t<decltype(x)>...>{std::tie(x...)}; }, targets);
    add_slice_sums(e, w, index, sums, gradient_sums<T>(part, d_part, sliced, fuse, nullptr));
  });
  return stored();
}

template <class E, class D, class... X>
auto gradient_by(const E& e, const D& d_out, const wrt_t<X...>& w, bool fuse,
                 const forward_kept<compute_t<std::remove_const_t<value_type_t<E>>>>* kept = nullptr) {
  using T = compute_t<std::remove_const_t<value_type_t<E>>>;  // bf16 and f16 expressions: in float
  constexpr std::size_t rank = static_rank_of<bare_t<E>>();
  constexpr bool same_extents = static_rank_of<bare_t<D>>() == rank &&
                                static_extents_agree<bare_t<E>::static_rows, bare_t<D>::static_rows> &&
                                static_extents_agree<bare_t<E>::static_cols, bare_t<D>::static_cols>;
  constexpr bool matrices = rank > 2 || (!tensor_leaf<bare_t<X>> && ...);
  static_assert(same_extents, "qkv: gradient(e, dO, wrt(X...)): the extents of dO differ from the extents of e");
  static_assert(!(same_extents && element<T>) || matrices,
                "qkv: gradient(e, dO, wrt(X...)): e is a matrix expression, and an X is a tensor");
  // (wrt has said what is wrong with an X; nothing more is said here.)
  if constexpr (!(element<T> && same_extents && matrices && (differentiable_leaf<X> && ...))) {
    return std::tuple<>{};
  } else if constexpr (reads_pages<E>() || reads_quantized<E>()) {
    return gradient_by(gather_operands(e), d_out, w, fuse);  // (the gradients of the other leaves)
  } else if constexpr (rank > 2) {
    return batched_gradient<T>(e, d_out, w, fuse);
  } else {
    auto sums = gradient_sums<T>(e, d_out, w, fuse, kept);
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple<gradient_of_t<X>...>{stored_as<X>(std::move(std::get<I>(sums)))...};
    }(std::index_sequence_for<X...>{});
  }
}

}  // namespace detail

// The gradients of Σ dO ∘ e with respect to X..., node by node.
template <expression E, class D, class... X>
auto gradient(const E& e, const D& d_out, const wrt_t<X...>& w, naive_t) {
  return detail::gradient_by(e, d_out, w, false);
}

// The best strategy: the fused backward for each attention that has one
// (detail::has_fused_backward), node by node elsewhere.
template <expression E, class D, class... X>
auto gradient(const E& e, const D& d_out, const wrt_t<X...>& w) {
  return detail::gradient_by(e, d_out, w, true);
}

namespace detail {
// A matrix attention with a fused backward, or a batched one whose slices have it.
template <class E>
inline constexpr bool fused_backward_of = [] {
  if constexpr (static_rank_of<bare_t<E>>() > 2) return has_fused_backward<slice_t<E>>;
  else return has_fused_backward<E>;
}();
}  // namespace detail

// Fused: e must be an attention with a fused backward.
template <expression E, class D, class... X>
auto gradient(const E& e, const D& d_out, const wrt_t<X...>& w, fused_t) {
  static_assert(detail::fused_backward_of<E>,
                "qkv: gradient(e, dO, wrt(X...), qkv::fused): e has no fused backward (built: softmax(S) * V for "
                "every S that fuses forward, with differentiable functors)");
  if constexpr (detail::fused_backward_of<E>) return detail::gradient_by(e, d_out, w, true);
  else return std::tuple<>{};  // (the assertion has said what is wrong)
}

// vjp(e): {eval(e), pullback}; pullback(dO, wrt(X...)) is gradient(e, dO, wrt(X...)).
// For an attention with a fused backward it keeps O and each row's
// log-sum-exp, so that the pullback does not run the forward again.
// The pullback holds e, which holds its lvalue operands by reference: they
// must outlive it.
template <class E>
struct pullback {
  E e;
  std::optional<detail::forward_kept<compute_t<std::remove_const_t<value_type_t<E>>>>> kept;
  template <class D, class... X>
  auto operator()(const D& d_out, const wrt_t<X...>& w) const {
    if constexpr (detail::has_fused_backward<E>)
      if (kept) return detail::gradient_by(e, d_out, w, true, &*kept);
    return gradient(e, d_out, w);
  }
};

template <expression E>
auto vjp(const E& e) {
  if constexpr (detail::has_fused_backward<E>) {
    using T = compute_t<std::remove_const_t<value_type_t<E>>>;
    pullback<E> back{e, detail::forward_kept<T>{}};
    detail::forward_kept<T>& k = *back.kept;
    k.out = detail::grad_matrix<T>(e.rows(), e.cols());
    k.row_stats = detail::aligned_buffer<T>(2 * e.rows(), detail::aligned_buffer<T>::uninitialized);
    detail::fused_operands<T, T> keep;
    detail::fused_extension_t<E> ext;
    detail::fused_forward(e, detail::view_of<T>(k.out), k.row_stats.data(), keep, ext);
    if constexpr (half_element<std::remove_const_t<value_type_t<E>>>) {
      // The backward's forward runs in float on float copies; eval(e) may
      // run the 2-byte kernel (bf16 weights on AVX512-BF16), whose bits the
      // value must be.
      return std::pair<result_t<E>, pullback<E>>{eval(e), std::move(back)};
    } else {
      result_t<E> out(e.rows(), e.cols());
      for (std::size_t i = 0; i < e.rows(); ++i)
        for (std::size_t j = 0; j < e.cols(); ++j) out(i, j) = k.out(i, j);
      return std::pair<result_t<E>, pullback<E>>{std::move(out), std::move(back)};
    }
  } else {
    return std::pair<result_t<E>, pullback<E>>{eval(e), pullback<E>{e, {}}};
  }
}

}  // namespace qkv
