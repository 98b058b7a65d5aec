// eval(e), eval(e, strategy) and eval_into(dst, e): where an expression
// meets storage.
#pragma once

#include "../expr/expression.hpp"
#include "../shape/check.hpp"
#include "../storage/matrix.hpp"
#include "../storage/matrix_view.hpp"
#include "../storage/owning.hpp"
#include "../storage/tensor.hpp"
#include "../storage/tensor_view.hpp"
#include "batched.hpp"
#include "plain_operands.hpp"
#include "ragged.hpp"
#include "fused.hpp"
#include "naive.hpp"
#include "strategy.hpp"
#include "widen.hpp"

#include <cstddef>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>

namespace qkv {

namespace detail {

template <class E, class T = value_type_t<E>, std::size_t Rank = static_rank_of<E>(), bool Ragged = is_ragged_v<E>>
struct result {
  using type = matrix<T, E::static_rows, E::static_cols>;
};
template <class E, class T>
struct result<E, T, 3, false> {
  using type = tensor<T, E::static_batch[1], E::static_rows, E::static_cols>;
};
template <class E, class T>
struct result<E, T, 4, false> {
  using type = tensor<T, E::static_batch[0], E::static_batch[1], E::static_rows, E::static_cols>;
};
template <class E, class T, std::size_t Rank>
struct result<E, T, Rank, true> {
  using type = ragged<T, E::static_batch[1], E::static_cols>;
};

// Owning storage with X's extents (static ones kept) and element type
// without const (storage/owning.hpp).
template <class X>
struct storage_like {
  using type = owning_t<X, std::remove_const_t<value_type_t<X>>>;
};
template <class X>
using storage_like_t = typename storage_like<bare_t<X>>::type;

// The storage of e's value in the type it is computed in (float for 2-byte inputs).
template <class E>
using compute_result_t = typename result<bare_t<E>, compute_t<value_type_t<E>>>::type;

}  // namespace detail

// The owning storage an expression evaluates to: a matrix, or for a batched
// expression a tensor of its rank.
template <expression E>
using result_t = typename detail::result<detail::bare_t<E>>::type;

namespace detail {

template <class E, class F>
void for_each_leaf(const E& e, F& f);

// The storage a functor of the user's (or a built-in one) reads: what its
// member operands() names, a tuple of expressions or storage.
template <class Fn, class F>
void for_each_functor_leaf(const Fn& fn, F& f) {
  if constexpr (requires { fn.operands(); }) {
    std::apply([&f](const auto&... x) { (for_each_leaf(x, f), ...); }, fn.operands());
  }
}

// Calls f(leaf) for every storage leaf e reads: its operands', what its
// evaluator reads besides (a similarity's queries(Q) and keys(K)), what its
// functors name, and a softmax's sinks.
template <class E, class F>
void for_each_leaf(const E& e, F& f) {
  if constexpr (leaf<E> || tensor_leaf<E>) {
    f(e);
  } else {
    std::apply([&f](const auto&... child) { (for_each_leaf(child, f), ...); }, e.operands());
    if constexpr (requires { e.evaluated_operands(); }) {
      std::apply([&f](const auto&... x) { (for_each_leaf(x, f), ...); }, e.evaluated_operands());
    }
    if constexpr (requires { e.function(); }) for_each_functor_leaf(e.function(), f);
    if constexpr (requires { e.predicate(); }) for_each_functor_leaf(e.predicate(), f);
    if constexpr (requires { e.sink_leaf(); })  // a softmax's matrix of per-head sinks
      if (e.sink_leaf() != nullptr) f(*e.sink_leaf());
  }
}

// The bytes from a leaf's first element to past its last; empty when it has none.
struct byte_range {
  const unsigned char* begin = nullptr;
  const unsigned char* end = nullptr;
};

template <class L>
byte_range memory_of(const L& l) {
  std::size_t last = 0;
  if constexpr (tensor_leaf<L>) {
    for (std::size_t k = 0; k < L::static_rank; ++k) {
      if (l.extent(k) == 0) return {};
      last += (l.extent(k) - 1) * l.stride(k);
    }
  } else {
    if (l.rows() == 0 || l.cols() == 0) return {};
    last = (l.rows() - 1) * l.row_stride();
    if constexpr (requires { l.col_stride(); }) last += (l.cols() - 1) * l.col_stride();
    else last += l.cols() - 1;
  }
  const auto* b = reinterpret_cast<const unsigned char*>(l.data());
  return {b, reinterpret_cast<const unsigned char*>(l.data() + last + 1)};
}

// Whether the destination's memory overlaps memory that e reads.
template <class D, class E>
bool reads_from(const E& e, const D& dst) {
  const byte_range d = memory_of(dst);
  if (d.begin == nullptr) return false;
  bool overlaps = false;
  auto check = [&](const auto& l) {
    const byte_range r = memory_of(l);
    overlaps = overlaps || (r.begin != nullptr && std::less<>{}(r.begin, d.end) && std::less<>{}(d.begin, r.end));
  };
  for_each_leaf(e, check);
  return overlaps;
}

template <class E>
void check_destination(std::size_t rows, std::size_t cols, const E& e) {
  require_equal(rows, e.rows(), "eval_into(dst, e): the shapes of dst and e differ", rows, cols, e.rows(), e.cols());
  require_equal(cols, e.cols(), "eval_into(dst, e): the shapes of dst and e differ", rows, cols, e.rows(), e.cols());
}

}  // namespace detail

namespace detail {

template <class E>
auto result_extents(const E& e) {
  const batch_extents b = batch_of(e);
  if constexpr (static_rank_of<E>() == 4) return std::array<std::size_t, 4>{b[0], b[1], e.rows(), e.cols()};
  else return std::array<std::size_t, 3>{b[1], e.rows(), e.cols()};
}

// New storage R for e's result: a ragged with its queries' offsets, a
// tensor or a matrix of its extents.
template <class R, class E>
R new_result(const E& e) {
  if constexpr (is_ragged_v<E>) return ragged_result<R>(e);
  else if constexpr (is_batched_v<E>) return R(result_extents(e));
  else return R(e.rows(), e.cols());
}

// e's fused attention with K and V read as stored (fused.hpp), in float.
template <class E>
compute_result_t<E> evaluate_on_stored_kv(const E& e) {
  if constexpr (is_batched_v<E>) {
    auto out = new_result<compute_result_t<E>>(e);
    batched_fused_into<best_policy>(e, out.view());
    return out;
  } else {
    compute_result_t<E> out(e.rows(), e.cols());
    fused_into<best_policy>(e, dense(out.data(), out.rows(), out.cols(), out.row_stride()));
    return out;
  }
}

template <class Policy, class E>
result_t<E> evaluate(const E& e) {
  if constexpr (gathers_operands<Policy, E>) {
    return evaluate<Policy>(gather_operands(e));  // (the same result type: pages.hpp)
  } else if constexpr (std::is_same_v<Policy, best_policy> && reads_kv_as_stored<E>) {
    auto r = evaluate_on_stored_kv(e);
    if constexpr (std::is_same_v<decltype(r), result_t<E>>) return r;
    else return narrow<result_t<E>>(r);
  } else if constexpr (reads_half<E>()) {
    // In float, rounded once where the result is 2-byte (widen.hpp).
    auto r = evaluate<Policy>(widen(e));
    if constexpr (std::is_same_v<decltype(r), result_t<E>>) return r;
    else return narrow<result_t<E>>(r);
  } else if constexpr (is_batched_v<E>) {
    auto out = new_result<result_t<E>>(e);
    batched_into<Policy>(e, out.view());
    return out;
  } else {
    result_t<E> out(e.rows(), e.cols());
    node_into<Policy>(e, dense(out.data(), out.rows(), out.cols(), out.row_stride()));
    return out;
  }
}

inline std::string extents_string(const auto& x) {
  std::string s(1, '[');
  for (std::size_t k = 0; k < x.size(); ++k) s.append(k ? ", " : "").append(std::to_string(x[k]));
  return s.append("]");
}

// A batched expression into a tensor or tensor_view of its extents.
template <class Policy, class Dst, class E>
void evaluate_into_tensor(Dst&& dst, const E& e) {
  using D = bare_t<Dst>;
  static_assert(D::static_rank == static_rank_of<E>(), "qkv: eval_into(dst, e): the ranks of dst and e differ");
  static_assert(std::is_same_v<value_type_t<D>, value_type_t<E>>,
                "qkv: eval_into(dst, e): dst and e have different element types");
  static_assert(ragged_leaf<D> == is_ragged_v<E>,
                "qkv: eval_into(dst, e): an expression on ragged operands goes into a ragged or ragged_view, and only it");
  if constexpr (D::static_rank == static_rank_of<E>() && std::is_same_v<value_type_t<D>, value_type_t<E>> &&
                ragged_leaf<D> == is_ragged_v<E>) {
    const auto out = [&] {
      if constexpr (requires { dst.view(); }) return dst.view();
      else return dst;
    }();
    static_assert(!std::is_const_v<std::remove_pointer_t<decltype(out.data())>>, "qkv: eval_into(dst, e): dst is read-only");
    if constexpr (is_ragged_v<E>) {
      require_ragged_shape(out, e, "eval_into(dst, e)");
    } else {
      const auto want = result_extents(e);
      if (out.extents() != want) {
        throw shape_error("qkv: eval_into(dst, e): the shapes of dst and e differ (" + extents_string(out.extents()) +
                          " vs " + extents_string(want) + ")");
      }
    }
    if (reads_from(e, out)) {
      const result_t<E> tmp = evaluate<Policy>(e);
      for_each_batch_index(batch_of(e), [&](batch_extents i) {
        copy_strided(leaf_view(tmp.batch_matrix(i)), leaf_view_mutable(out.batch_matrix(i)));
      });
    } else {
      batched_into<Policy>(e, out);
    }
  }
}

// A matrix expression into a matrix or matrix_view of its shape.
template <class Policy, class Dst, class E>
void evaluate_into_matrix(Dst&& dst, const E& e) {
  using D = bare_t<Dst>;
  static_assert(static_extents_agree<D::static_rows, E::static_rows>, "qkv: eval_into(dst, e): the rows of dst differ from the rows of e");
  static_assert(static_extents_agree<D::static_cols, E::static_cols>, "qkv: eval_into(dst, e): the columns of dst differ from the columns of e");
  static_assert(std::is_same_v<value_type_t<D>, value_type_t<E>>, "qkv: eval_into(dst, e): dst and e have different element types");
  static_assert(!std::is_const_v<std::remove_pointer_t<decltype(dst.data())>>, "qkv: eval_into(dst, e): dst is read-only");
  check_destination(dst.rows(), dst.cols(), e);
  if (reads_from(e, dst)) {
    const auto tmp = evaluate<Policy>(e);
    copy_strided(leaf_view(tmp), leaf_view_mutable(dst));
  } else {
    slice_into<Policy>(e, matrix_view<value_type_t<E>, D::static_rows, D::static_cols>(dst));
  }
}

// e's attention with K and V read as stored, straight into a float matrix
// destination where the kernel can write it (rows of unit column stride, no
// memory that e reads); false where it cannot. A result of dst's size,
// zeroed then copied, took 5–10 ms of a 50 ms call at T = 4096, d = 128 on
// a virtual machine, where touching new pages is slow.
template <class Dst, class E>
bool stored_kv_straight_into(Dst& dst, const E& e) {
  using D = bare_t<Dst>;
  if constexpr (!is_batched_v<E> && !tensor_leaf<D> && requires { D::static_rows; D::static_cols; }) {
    if constexpr (static_extents_agree<D::static_rows, E::static_rows> &&
                  static_extents_agree<D::static_cols, E::static_cols> &&
                  !std::is_const_v<std::remove_pointer_t<decltype(dst.data())>>) {
      check_destination(dst.rows(), dst.cols(), e);
      std::size_t cs = 1;
      if constexpr (requires { dst.col_stride(); }) cs = dst.col_stride();
      if (cs != 1 || reads_from(e, dst)) return false;
      fused_into<best_policy>(e, dense(dst.data(), dst.rows(), dst.cols(), dst.row_stride()));
      return true;
    }
  }
  return false;  // (evaluate_into's other paths say what is wrong with dst)
}

template <class Policy, class Dst, class E>
void evaluate_into(Dst&& dst, const E& e) {
  // (Storage itself is copied as it is: its 2-byte values need no float.)
  if constexpr (gathers_operands<Policy, E>) {
    static_assert(!paged_leaf<E>, "qkv: eval_into(dst, e): e is a paged cache itself (an expression over it is evaluated)");
    if constexpr (!paged_leaf<E>) evaluate_into<Policy>(std::forward<Dst>(dst), gather_operands(e));
  } else if constexpr (reads_half<E>() && !leaf<E> && !tensor_leaf<E>) {
    // A float destination gets the float result; any other, the rounded one,
    // whose type then must be dst's.
    if constexpr (std::is_same_v<std::remove_const_t<value_type_t<bare_t<Dst>>>, float>) {
      if constexpr (std::is_same_v<Policy, best_policy> && reads_kv_as_stored<E>) {
        if (!stored_kv_straight_into(dst, e))
          evaluate_into<Policy>(std::forward<Dst>(dst), evaluate_on_stored_kv(e));  // then copied
      } else {
        evaluate_into<Policy>(std::forward<Dst>(dst), widen(e));
      }
    } else {
      evaluate_into<Policy>(std::forward<Dst>(dst), evaluate<Policy>(e));
    }
  } else if constexpr (tensor_leaf<bare_t<Dst>>) {
    evaluate_into_tensor<Policy>(std::forward<Dst>(dst), e);
  } else {
    static_assert(!is_batched_v<E>,
                  "qkv: eval_into(dst, e): e is batched (rank 3 or 4), so dst must be a tensor or tensor_view of its rank");
    if constexpr (!is_batched_v<E>) evaluate_into_matrix<Policy>(std::forward<Dst>(dst), e);
  }
}

// One error per rule of eval/fusion_rules.hpp: exactly the one e broke fires.
template <class E>
constexpr void require_fused_form() {
  constexpr fusion_rule r = fused_form<bare_t<E>>::broken;
  static_assert(r != fusion_rule::not_attention,
                "qkv: eval(e, qkv::fused): not softmax(S) * V (fused evaluates attention only, eval(e) takes any e)");
  static_assert(r != fusion_rule::not_a_similarity,
                "qkv: eval(e, qkv::fused): the scores are not a similarity (S must be Q * transpose(K) or similarity(Q, K, f), then scaled, masked, biased or modified)");
  static_assert(r != fusion_rule::two_biases,
                "qkv: eval(e, qkv::fused): two biases in the scores (add them first: S + (B1 + B2))");
  static_assert(r != fusion_rule::two_mask_matrices,
                "qkv: eval(e, qkv::fused): two mask matrices in the scores (combine them into one first)");
  static_assert(r != fusion_rule::two_predicates,
                "qkv: eval(e, qkv::fused): two predicate masks in the scores (combine them into one predicate)");
  static_assert(r != fusion_rule::two_score_mods,
                "qkv: eval(e, qkv::fused): two score_mods in the scores (compose them into one modifier)");
  static_assert(r != fusion_rule::score_mod_outside_mask,
                "qkv: eval(e, qkv::fused): score_mod outside a mask (f would see -inf, masks outside it fuse: causal(score_mod(S, f)))");
  static_assert(r != fusion_rule::scale_outside_score_mod,
                "qkv: eval(e, qkv::fused): scaling outside a score_mod (scale inside it, score_mod(S * c, f), or in f)");
  static_assert(r != fusion_rule::bias_outside_score_mod,
                "qkv: eval(e, qkv::fused): a bias outside a score_mod (add it inside, score_mod(S + B, f), or in f)");
}

}  // namespace detail

// Evaluates e with the best strategy: fused where a subexpression has a
// fused form, node by node elsewhere.
template <expression E>
result_t<E> eval(const E& e) {
  return detail::evaluate<detail::best_policy>(e);
}

// Evaluates e node by node into a new matrix of e's shape.
template <expression E>
result_t<E> eval(const E& e, naive_t) {
  return detail::evaluate<detail::naive_policy>(e);
}

// Evaluates e, which must have a fused form, with the fused kernel.
template <expression E>
result_t<E> eval(const E& e, fused_t) {
  detail::require_fused_form<E>();
  if constexpr (detail::has_fused_form<E>) return detail::evaluate<detail::best_policy>(e);
  else return result_t<E>();
}

// Evaluates e into existing storage (a matrix, or a view of mutable memory)
// of e's shape. When dst overlaps an input, e is evaluated aside first.
template <class Dst, class E>
  requires writable_leaf<Dst> && expression<E>
void eval_into(Dst&& dst, const E& e, naive_t) {
  detail::evaluate_into<detail::naive_policy>(std::forward<Dst>(dst), e);
}

template <class Dst, class E>
  requires writable_leaf<Dst> && expression<E>
void eval_into(Dst&& dst, const E& e, fused_t) {
  detail::require_fused_form<E>();
  if constexpr (detail::has_fused_form<E>) detail::evaluate_into<detail::best_policy>(std::forward<Dst>(dst), e);
}

template <class Dst, class E>
void eval_into(Dst&& dst, const E& e) {
  static_assert(writable_leaf<Dst> && expression<E>,
                "qkv: eval_into(dst, e): dst must be a matrix, tensor, or a mutable matrix_view or tensor_view");
  if constexpr (writable_leaf<Dst> && expression<E>) detail::evaluate_into<detail::best_policy>(std::forward<Dst>(dst), e);
}

}  // namespace qkv
