// Laws every attention expression obeys, stated once. A test names a case:
// a factory that builds the expression from its operands (the same factory
// builds it from matrices and from tensors) and the reference of its result
// with the error bound, from the operands as ref::mat_for<T>. check_laws
// then holds the expression to:
//   1. naive evaluation within the reference bound;
//   2. fused evaluation (where e has a fused form) within the bound, and
//      about as accurate as naive (fused_vs_naive below says how);
//   3. eval(e) giving what its strategy gives, bit for bit;
//   4. every result bit-identical with 1, 2 and 3 threads (natively: the
//      split of work over threads is the same code on every instruction set);
//   5. batched (tensor operands): each output matrix bit-identical to the
//      factory applied to the operands' matrices at that batch index (key
//      head h / (H / Hk), broadcast operands at 0), and laws 1–2 per index;
//   6. static_cost<decltype(e)>() equal to cost(e) where every extent is static.
#pragma once

#include "support.hpp"

#include <qkv/qkv.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace test {

// The reference result of one expression and the bound on its error, in
// ref::real_for<T> for a result in T.
template <class R>
struct expected {
  ref::basic_mat<R> want, bound;
};
template <class R>
expected(ref::basic_mat<R>, ref::basic_mat<R>) -> expected<R>;

// How the fused result is compared with the naive one, beyond both being
// within the bound.
enum class fused_vs_naive {
  // The largest error of fused at most twice that of naive, with a floor of
  // 8 units of roundoff of the largest output: below it the two compare
  // rounding noises (the final division, the exps and the last additions
  // cost a few ulps in either order). FlashAttention's criterion.
  max_error,
  // The same, but from 64 outputs up only, and by the mean error for up to 4
  // queries: there the decoding path rounds the scores in another order than
  // the naive product, two independent errors of one size whose largest over
  // a few rows differs by more than 2× either way round for some inputs,
  // while their mean is steady. For scores whose own error dominates (user
  // similarities, modifiers).
  steady,
  // The bound alone.
  none,
};

// One case: a name, the factory, and the reference.
template <class Make, class Reference>
struct law {
  const char* name;
  Make make;            // make(operands...) -> expression
  Reference reference;  // reference(ref::mat_for<T> of each matrix operand...) -> expected
  fused_vs_naive compare = fused_vs_naive::max_error;
};
template <class Make, class Reference>
law(const char*, Make, Reference) -> law<Make, Reference>;
template <class Make, class Reference>
law(const char*, Make, Reference, fused_vs_naive) -> law<Make, Reference>;

// Whether static_cost<E>() is a constant expression (every extent static).
template <class E>
concept static_cost_known = requires { typename std::integral_constant<std::size_t, qkv::static_cost<E>().flops>; };

template <class A, class R>
R mean_abs_error(const A& got, const ref::basic_mat<R>& want) {
  R sum = 0;
  for (std::size_t i = 0; i < want.rows; ++i)
    for (std::size_t j = 0; j < want.cols; ++j) sum += std::fabs(static_cast<R>(got(i, j)) - want(i, j));
  return want.v.empty() ? 0 : sum / static_cast<R>(want.v.size());
}

// Laws 1 and 2 for one matrix result of each strategy.
template <class T, class N, class F, class R>
void check_against_reference(const N& got_naive, const F* got_fused, const expected<R>& x, fused_vs_naive compare) {
  REQUIRE(got_naive.rows() == x.want.rows);
  REQUIRE(got_naive.cols() == x.want.cols);
  CHECK(ref::worst_ratio(got_naive, x.want, x.bound) <= 1);
  if (got_fused == nullptr) return;
  REQUIRE(got_fused->rows() == x.want.rows);
  REQUIRE(got_fused->cols() == x.want.cols);
  CHECK(ref::worst_ratio(*got_fused, x.want, x.bound) <= 1);
  const R floor = 8 * static_cast<R>(ref::unit_roundoff<T>) * ref::max_abs(x.want);
  if (compare == fused_vs_naive::max_error ||
      (compare == fused_vs_naive::steady && x.want.v.size() >= 64 && x.want.rows > 4)) {
    CHECK(ref::max_error(*got_fused, x.want) <= 2 * std::fmax(ref::max_error(got_naive, x.want), floor));
  } else if (compare == fused_vs_naive::steady && x.want.v.size() >= 64) {
    CHECK(mean_abs_error(*got_fused, x.want) <= 2 * std::fmax(mean_abs_error(got_naive, x.want), floor));
  }
}

template <class X>
constexpr bool is_tensor = requires(const X& x) { x.batch(); };

// The matrix of operand x at batch index b of a result with batch extents
// `whole` (a matrix operand is the same at every index).
template <class X>
decltype(auto) slice(const X& x, qkv::batch_extents b, qkv::batch_extents whole) {
  if constexpr (is_tensor<X>) {
    const qkv::batch_extents own = x.batch();
    const qkv::batch_extents index{b[0] * own[0] / whole[0], b[1] * own[1] / whole[1]};
    if constexpr (requires { x.view(); }) return x.view().batch_matrix(index);
    else return x.batch_matrix(index);
  } else {
    return (x);
  }
}

// The operands at one batch index, held while the expression built from
// them lives (matrices by reference, the views of tensors by value).
template <class... Operands>
using sliced_operands =
    std::tuple<decltype(slice(std::declval<const Operands&>(), qkv::batch_extents{}, qkv::batch_extents{}))...>;

template <class T, class X>
ref::mat_for<T> reference_operand(const X& x) {
  return ref::from<ref::real_for<T>>(x);
}

template <class A, class B>
bool same_result(const A& a, const B& b) {
  if constexpr (is_tensor<A>) return same_bits_tensor(a, b);
  else return same_bits(a, b);
}

// Evaluates e with 1, 2 and 3 threads: the same bits each time (law 4);
// returns the result.
template <class E, class Strategy>
auto eval_over_threads(const E& e, Strategy strategy) {
  threads_guard guard;
  qkv::set_threads(1);
  auto one = qkv::eval(e, strategy);
  if (emulated()) return one;
  for (std::size_t t : {2, 3}) {
    qkv::set_threads(t);
    INFO("threads = " << t);
    CHECK(same_result(one, qkv::eval(e, strategy)));
  }
  return one;
}

template <class T, class Make, class Reference, class... Operands>
void check_laws(const law<Make, Reference>& c, const Operands&... operands) {
  INFO(c.name << ", kernels " << qkv::active_arch());
  const auto e = c.make(operands...);
  using E = std::remove_cvref_t<decltype(e)>;
  constexpr bool fusable = qkv::detail::has_fused_form<E>;

  const auto got_naive = eval_over_threads(e, qkv::naive);
  const auto got_best = qkv::eval(e);
  if constexpr (static_cost_known<E>) {
    // The counts are the same; the bytes too where the kernels that run
    // block as the widest set of the build does (a constant expression
    // cannot know which runs: AVX2 takes 66-row blocks to AVX-512's 64, and
    // narrower vectors pad less).
    constexpr qkv::cost_estimate known = qkv::static_cost<E>();
    const qkv::cost_estimate now = qkv::cost(e);
    CHECK(known.flops == now.flops);
    CHECK(known.exps == now.exps);
    CHECK(known.naive_bytes == now.naive_bytes);
    using V = qkv::value_type_t<E>;
    constexpr auto widest = qkv::kernels::blocking_of<qkv::kernels::widest_built_arch_t, V>();
    if (qkv::kernels::active_blocking(sizeof(V)) == widest) CHECK(known.fused_bytes == now.fused_bytes);
  }

  if constexpr (fusable) {
    const auto got_fused = eval_over_threads(e, qkv::fused);
    CHECK(same_result(got_best, got_fused));
    if constexpr (is_tensor<decltype(got_naive)>) {
      const qkv::batch_extents whole = got_naive.batch();
      for (std::size_t b = 0; b < whole[0]; ++b)
        for (std::size_t h = 0; h < whole[1]; ++h) {
          INFO("batch index (" << b << ", " << h << ")");
          const sliced_operands<Operands...> slices(slice(operands, {b, h}, whole)...);
          std::apply(
              [&](const auto&... s) {
                const auto one = c.make(s...);
                const auto naive_one = qkv::eval(one, qkv::naive), fused_one = qkv::eval(one, qkv::fused);
                CHECK(same_bits(got_naive.view().batch_matrix({b, h}), naive_one));
                CHECK(same_bits(got_fused.view().batch_matrix({b, h}), fused_one));
                check_against_reference<T>(naive_one, &fused_one, c.reference(reference_operand<T>(s)...), c.compare);
              },
              slices);
        }
    } else {
      check_against_reference<T>(got_naive, &got_fused, c.reference(reference_operand<T>(operands)...), c.compare);
    }
  } else {
    CHECK(same_result(got_best, got_naive));
    if constexpr (is_tensor<decltype(got_naive)>) {
      const qkv::batch_extents whole = got_naive.batch();
      for (std::size_t b = 0; b < whole[0]; ++b)
        for (std::size_t h = 0; h < whole[1]; ++h) {
          INFO("batch index (" << b << ", " << h << ")");
          const sliced_operands<Operands...> slices(slice(operands, {b, h}, whole)...);
          std::apply(
              [&](const auto&... s) {
                const auto one = c.make(s...);
                const auto naive_one = qkv::eval(one, qkv::naive);
                CHECK(same_bits(got_naive.view().batch_matrix({b, h}), naive_one));
                check_against_reference<T>(naive_one, static_cast<const decltype(naive_one)*>(nullptr),
                                           c.reference(reference_operand<T>(s)...), c.compare);
              },
              slices);
        }
    } else {
      check_against_reference<T>(got_naive, static_cast<const decltype(got_naive)*>(nullptr),
                                 c.reference(reference_operand<T>(operands)...), c.compare);
    }
  }
}

// Every case of a list (a tuple of law), on the same operands.
template <class T, class... Cases, class... Operands>
void check_laws(const std::tuple<Cases...>& cases, const Operands&... operands) {
  std::apply([&](const auto&... c) { (check_laws<T>(c, operands...), ...); }, cases);
}

}  // namespace test
