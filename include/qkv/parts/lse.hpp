// eval_with_lse(e) and merge(O1, L1, O2, L2): an attention's output with
// each row's log-sum-exp, and the attention over two disjoint key sets
// from the two partial results. L_i = log Σ_j exp(s_ij) over the keys row
// i sees, −∞ for a row that sees none; the fused kernel keeps it as each
// row's maximum m and sum l = Σ_j exp(s_ij − m) (attention_problem's
// row_stats), so L = m + log l costs nothing extra.
//
// merge weighs each part by exp(L_part − L): with M = max(L1, L2),
//   L = M + log(exp(L1 − M) + exp(L2 − M)),
//   O = (exp(L1 − M) O1 + exp(L2 − M) O2) / (exp(L1 − M) + exp(L2 − M)),
// no exponent above 0; a part with L = −∞ weighs 0 (O is the other part's,
// bit for bit); rows where both are −∞ give zeros and −∞.
#pragma once

#include "../shape/shape_error.hpp"
#include "../storage/matrix.hpp"
#include "../storage/tensor.hpp"
#include "../eval/eval.hpp"
#include "part.hpp"

#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace qkv {
namespace detail {

// The n × 1 log-sum-exps of e: a matrix, or a tensor [..., n, 1], in the
// type e is computed in.
template <class E, class T = compute_t<value_type_t<E>>, std::size_t Rank = static_rank_of<E>(), bool Ragged = is_ragged_v<E>>
struct lse_result {
  using type = matrix<T, E::static_rows, 1>;
};
template <class E, class T>
struct lse_result<E, T, 3, false> {
  using type = tensor<T, E::static_batch[1], E::static_rows, 1>;
};
template <class E, class T>
struct lse_result<E, T, 4, false> {
  using type = tensor<T, E::static_batch[0], E::static_batch[1], E::static_rows, 1>;
};
template <class E, class T, std::size_t Rank>
struct lse_result<E, T, Rank, true> {
  using type = ragged<T, E::static_batch[1], 1>;
};
template <class E>
using lse_t = typename lse_result<bare_t<E>>::type;

// (A ragged's: its offsets, then heads and dim.)
template <class X>
auto shape_of(const X& x) {
  if constexpr (ragged_leaf<X>) {
    std::vector<std::size_t> s(x.offsets().begin(), x.offsets().end());
    s.push_back(x.heads()), s.push_back(x.cols());
    return s;
  } else if constexpr (tensor_leaf<X>) {
    const auto e = x.extents();
    return std::vector<std::size_t>(e.begin(), e.end());
  } else {
    return std::vector<std::size_t>{x.rows(), x.cols()};
  }
}

// The matrix at batch index k of x, in row-major batch order (x itself for a matrix).
template <class X>
auto batch_at(const X& x, std::size_t k) {
  if constexpr (tensor_leaf<X>) {
    const batch_extents b = batch_of(x);
    if constexpr (requires { x.view(); }) return x.view().batch_matrix(batch_extents{k / b[1], k % b[1]});
    else return x.batch_matrix(batch_extents{k / b[1], k % b[1]});
  } else {
    return matrix_view<const value_type_t<X>, dyn, dyn>(x.data(), x.rows(), x.cols(), x.row_stride());
  }
}

// The same, mutable, of x's own storage.
template <class X>
auto batch_at_mutable(X& x, std::size_t k) {
  if constexpr (tensor_leaf<X>) {
    const batch_extents b = batch_of(x);
    return x.view().batch_matrix(batch_extents{k / b[1], k % b[1]});
  } else {
    return matrix_view<value_type_t<X>, dyn, dyn>(x.data(), x.rows(), x.cols(), x.row_stride());
  }
}

template <class X>
std::size_t batch_count(const X& x) {
  if constexpr (tensor_leaf<X>) {
    const batch_extents b = batch_of(x);
    return b[0] * b[1];
  } else {
    return 1;
  }
}

// e's output into out (e's shape in T) and each row's log-sum-exp into lse.
template <class E, class Out, class L>
void attention_with_lse(const E& e, Out& out, L& lse) {
  using T = compute_t<value_type_t<E>>;
  const std::size_t stride = [&] {
    if constexpr (is_batched_v<E>) return out.cols();
    else return out.row_stride();
  }();
  std::vector<T> stats(2 * e.rows() * batch_count(out));
  attention_part(e, out.data(), stride, stats.data(), sequence_part{});
  for (std::size_t k = 0; k < stats.size() / 2; ++k) lse.data()[k] = lse_of(stats[2 * k], stats[2 * k + 1]);
}

// The same for e on ragged operands: one problem per sequence and head,
// each row's statistics its own.
template <class E, class Out, class L>
void ragged_attention_with_lse(const E& e, Out& out, L& lse) {
  using T = compute_t<value_type_t<E>>;
  const batch_extents b = batch_of(e);
  std::vector<fused_operands_t<E>> keep(b[0] * b[1]);
  std::vector<fused_problem_t<E>> problems;
  problems.reserve(b[0] * b[1]);
  std::vector<std::vector<T>> stats;
  std::optional<fused_extension_t<E>> ext;  // the functors are those of e: the first index's serve all
  for_each_batch_index(b, [&](batch_extents i) {
    const auto o = out.view().batch_matrix(i);
    fused_extension_t<E> mine;
    problems.push_back(attention_problem_of<best_policy>(slice(e, i), dense(o.data(), o.rows(), o.cols(), o.row_stride()),
                                                         keep[problems.size()], mine));
    stats.emplace_back(2 * o.rows(), T(0));
    for (std::size_t r = 0; r < o.rows(); ++r) stats.back()[2 * r] = -std::numeric_limits<T>::infinity();
    problems.back().row_stats = stats.back().data();
    if (!ext) ext.emplace(std::move(mine));
  });
  if (ext) run_attention(problems.data(), problems.size(), *ext);
  std::size_t x = 0;
  for_each_batch_index(b, [&](batch_extents i) {
    const auto l = lse.view().batch_matrix(i);
    for (std::size_t r = 0; r < l.rows(); ++r) l(r, 0) = lse_of(stats[x][2 * r], stats[x][2 * r + 1]);
    ++x;
  });
}

}  // namespace detail

// {O, L} for e = softmax(S) * V with a fused form: O is e's value (as eval(e)
// computes it fused), L each row's natural log-sum-exp of S.
template <expression E>
auto eval_with_lse(const E& e) {
  static_assert(detail::has_fused_form<E>,
                "qkv: eval_with_lse(e): e must be an attention with a fused form (eval(e, qkv::fused) says what breaks it)");
  if constexpr (!detail::has_fused_form<E>) {
    return std::pair<int, int>{};
  } else if constexpr (detail::gathers_operands<detail::best_policy, E>) {
    return eval_with_lse(detail::gather_operands(e));
  } else if constexpr (detail::reads_half<E>() && !detail::reads_kv_as_stored<E>) {
    auto [o, l] = eval_with_lse(detail::widen(e));  // in float, O rounded once
    return std::pair<result_t<E>, detail::lse_t<E>>{detail::narrow<result_t<E>>(o), std::move(l)};
  } else {
    auto out = detail::new_result<detail::compute_result_t<E>>(e);
    detail::lse_t<E> lse = [&] {
      if constexpr (detail::is_ragged_v<E>) {
        return detail::lse_t<E>(out.offsets(), {out.heads(), 1});
      } else if constexpr (detail::is_batched_v<E>) {
        auto x = detail::result_extents(e);
        x.back() = 1;
        return detail::lse_t<E>(x);
      } else {
        return detail::lse_t<E>(e.rows(), 1);
      }
    }();
    if constexpr (detail::is_ragged_v<E>) detail::ragged_attention_with_lse(e, out, lse);
    else detail::attention_with_lse(e, out, lse);
    if constexpr (std::is_same_v<detail::compute_result_t<E>, result_t<E>>) {
      return std::pair<result_t<E>, detail::lse_t<E>>{std::move(out), std::move(lse)};
    } else {
      return std::pair<result_t<E>, detail::lse_t<E>>{detail::narrow<result_t<E>>(out), std::move(lse)};
    }
  }
}

// {O, L}: the attention over the union of two disjoint key sets, from each
// set's output and log-sum-exp (eval_with_lse's; matrices, tensors of the
// same extents, or raggeds of the same offsets). O and L have O1's and L1's types and extents.
template <class O1, class L1, class O2, class L2>
auto merge(const O1& o1, const L1& l1, const O2& o2, const L2& l2) {
  static_assert((leaf<O1> || tensor_leaf<O1>) && (leaf<L1> || tensor_leaf<L1>) && (leaf<O2> || tensor_leaf<O2>) &&
                    (leaf<L2> || tensor_leaf<L2>),
                "qkv: merge(O1, L1, O2, L2): each argument must be a matrix, tensor or view (eval_with_lse's results)");
  using V = std::remove_const_t<value_type_t<O1>>;
  using T = std::remove_const_t<value_type_t<L1>>;
  static_assert(std::is_same_v<V, std::remove_const_t<value_type_t<O2>>> && std::is_same_v<T, std::remove_const_t<value_type_t<L2>>>,
                "qkv: merge(O1, L1, O2, L2): the two parts have different element types");
  static_assert(element<T>, "qkv: merge(O1, L1, O2, L2): L must be float or double");
  const auto what = [](const auto& x) {
    std::string s = "[";
    for (const std::size_t v : detail::shape_of(x)) s += (s.size() > 1 ? ", " : "") + std::to_string(v);
    return s + "]";
  };
  std::vector<std::size_t> want = detail::shape_of(o1);
  want.back() = 1;
  if (detail::shape_of(o2) != detail::shape_of(o1) || detail::shape_of(l1) != want || detail::shape_of(l2) != want)
    throw shape_error("qkv: merge(O1, L1, O2, L2): O1 and O2 must have one shape and L1, L2 one row each of it (got O1 " +
                      what(o1) + ", L1 " + what(l1) + ", O2 " + what(o2) + ", L2 " + what(l2) + ")");
  using OR = detail::storage_like_t<O1>;
  using LR = detail::storage_like_t<L1>;
  auto result = [&] {
    if constexpr (detail::ragged_leaf<O1>) return std::pair<OR, LR>{OR(o1.offsets(), {o1.heads(), o1.cols()}), LR(l1.offsets(), {l1.heads(), 1})};
    else if constexpr (tensor_leaf<O1>) return std::pair<OR, LR>{OR(o1.extents()), LR(l1.extents())};
    else return std::pair<OR, LR>{OR(o1.rows(), o1.cols()), LR(l1.rows(), 1)};
  }();
  for (std::size_t k = 0; k < detail::batch_count(o1); ++k) {
    const auto a = detail::batch_at(o1, k);
    const auto b = detail::batch_at(o2, k);
    const auto la = detail::batch_at(l1, k);
    const auto lb = detail::batch_at(l2, k);
    const auto out = detail::batch_at_mutable(result.first, k);  // rows of unit column stride
    const auto lse = detail::batch_at_mutable(result.second, k);
    const std::size_t n = a.rows(), d = a.cols();
    for (std::size_t i = 0; i < n; ++i) {
      lse(i, 0) = detail::merge_rows(
          la(i, 0), [&](std::size_t c) { return static_cast<compute_t<V>>(a(i, c)); }, lb(i, 0),
          [&](std::size_t c) { return static_cast<compute_t<V>>(b(i, c)); }, d, out.data() + i * out.row_stride());
    }
  }
  return result;
}

}  // namespace qkv
