// A sequence computed in parts (parts/part.hpp): each block of query rows
// against each block of keys, with the whole's positions, merged by the
// rows' log-sum-exp, equals the whole (in long double for matrices) within
// the bound of part_forms.hpp;
// for every form that uses positions (causal, windows, a key_aligned
// modifier, a predicate of indices, a sink counted once), uneven blocks and
// an empty one, matrices and [B, H, T, D] tensors with grouped-query heads.
#include <catch2/catch.hpp>

#include "part_forms.hpp"

#include <qkv/parts/part.hpp>
#include <qkv/parts/rebind.hpp>

#include <cstddef>
#include <vector>

using namespace test::parts;

namespace {

// Cuts [0, t) at the given points.
std::vector<std::size_t> starts(std::size_t t, std::vector<std::size_t> cuts) {
  cuts.insert(cuts.begin(), 0);
  cuts.push_back(t);
  return cuts;
}

// O of form f over the whole: batches b0 × b1 query heads, b1 / g key heads.
template <class T>
std::vector<double> whole(int f, const std::vector<T>& q, const std::vector<T>& k, const std::vector<T>& v,
                          std::size_t b0, std::size_t b1, std::size_t g, std::size_t t, std::size_t d, std::size_t dv) {
  const auto run = [&](const auto& e) {
    const auto o = eval(e);
    return std::vector<double>(o.data(), o.data() + b0 * b1 * t * dv);
  };
  if (b0 * b1 == 1) return with_form(f, rows_matrix(q, d, 0, t), rows_matrix(k, d, 0, t), rows_matrix(v, dv, 0, t), run);
  return with_form(f, rows_tensor(q, b0, b1, t, d, 0, t), rows_tensor(k, b0, b1 / g, t, d, 0, t),
                   rows_tensor(v, b0, b1 / g, t, dv, 0, t), run);
}

// The same in parts: query block a against key block b, in key order.
std::vector<double> split(int f, const data& q, const data& k, const data& v, std::size_t b0, std::size_t b1,
                          std::size_t g, const std::vector<std::size_t>& at) {
  const std::size_t t = q.rows, d = q.cols, dv = v.cols;
  std::vector<double> o(b0 * b1 * t * dv);
  for (std::size_t a = 0; a + 1 < at.size(); ++a) {
    const std::size_t n = at[a + 1] - at[a];
    qkv::detail::part_accumulator<float> acc(n, dv, b0 * b1);
    for (std::size_t b = 0; b + 1 < at.size(); ++b) {
      const std::size_t m = at[b + 1] - at[b];
      const qkv::detail::sequence_part part{at[a], at[b], t, t, b == 0};
      const auto add = [&](const auto& e) {
        acc.add(e, part);
        return 0;
      };
      if (b0 * b1 == 1) {
        with_form(f, rows_matrix(q.f, d, at[a], n), rows_matrix(k.f, d, at[b], m), rows_matrix(v.f, dv, at[b], m), add);
      } else {
        with_form(f, rows_tensor(q.f, b0, b1, t, d, at[a], n), rows_tensor(k.f, b0, b1 / g, t, d, at[b], m),
                  rows_tensor(v.f, b0, b1 / g, t, dv, at[b], m), add);
      }
    }
    for (std::size_t x = 0; x < b0 * b1; ++x)
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t c = 0; c < dv; ++c)
          o[((x * t) + at[a] + i) * dv + c] = acc.out[(x * n + i) * dv + c];
  }
  return o;
}

void check(int f, std::size_t b0, std::size_t b1, std::size_t g, std::size_t t, std::size_t d, std::size_t dv,
           const std::vector<std::size_t>& cuts) {
  INFO("form " << form_name(f) << ", [" << b0 << ", " << b1 << "] heads on " << b1 / g << ", T = " << t << ", d = " << d
               << ", dv = " << dv);
  rng r(static_cast<std::uint32_t>(7 + f + 13 * t));
  const data q(b0 * b1, t, d, r), k(b0 * b1 / g, t, d, r), v(b0 * b1 / g, t, dv, r);
  // Matrices against the long-double reference, tensors against their heads in double.
  const auto ref = b0 * b1 == 1 ? long_double_form(f, q.d, k.d, v.d, t, d, dv) : whole(f, q.d, k.d, v.d, b0, b1, g, t, d, dv);
  const auto one = whole(f, q.f, k.f, v.f, b0, b1, g, t, d, dv);
  const auto at = starts(t, cuts);
  const auto got = split(f, q, k, v, b0, b1, g, at);
  const double w = max_diff(one, ref, ref.size());
  const double bound = split_bound(w, at.size() - 1, 16 * std::sqrt(double(d)) + 0.25 * double(t) + 2, t, 2);
  INFO("whole in float: " << w << ", in parts: " << max_diff(got, ref, ref.size()) << ", bound " << bound);
  CHECK(max_diff(got, ref, ref.size()) <= bound);
}

}  // namespace

TEST_CASE("a sequence in parts: matrices, every form, uneven blocks and an empty one", "[part]") {
  for (int f = 0; f < form_count; ++f) {
    check(f, 1, 1, 1, 77, 16, 24, {30, 30, 61});
    check(f, 1, 1, 1, 200, 64, 64, {67, 134});
  }
}

TEST_CASE("a sequence in parts: grouped-query tensors", "[part]") {
  for (int f = 0; f < form_count; ++f) check(f, 2, 4, 2, 45, 16, 8, {11, 33});
}

TEST_CASE("a part no bound leaves visible is skipped", "[part]") {
  rng r(3);
  const data q(1, 8, 4, r), k(1, 8, 4, r), v(1, 8, 4, r);
  const auto e = softmax(causal(rows_matrix(q.f, 4, 0, 4) * transpose(rows_matrix(k.f, 4, 4, 4)))) * rows_matrix(v.f, 4, 4, 4);
  // Queries 0..3 against keys 4..7 of an 8-long sequence: causal hides them all.
  CHECK_FALSE(qkv::detail::part_sees_any(e, {0, 4, 8, 8, true}));
  CHECK(qkv::detail::part_sees_any(e, {4, 0, 8, 8, true}));
  qkv::detail::part_accumulator<float> acc(4, 4, 1);
  acc.add(e, {0, 4, 8, 8, true});
  for (float x : acc.lse) CHECK(x == -std::numeric_limits<float>::infinity());
  for (float x : acc.out) CHECK(x == 0.0f);
}
