// score_mod(S, f): soft-capping, ALiBi and relative-position buckets, under
// causal, masks and biases, against the reference; where a modifier sits
// in the chain, and what it sees.
#include <catch2/catch.hpp>

#include "extension_support.hpp"

#include <qkv/qkv.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>

using namespace qkv;
using namespace test::ext;

namespace {

enum class modifier { softcap, alibi, bucket };

const char* name(modifier f) {
  const char* names[] = {"soft-capping", "ALiBi", "relative-position buckets"};
  return names[int(f)];
}

template <class T, class Body>
void with_modifier(modifier f, Body&& body) {
  switch (f) {
    case modifier::softcap: return body(softcap_t<T>{T(5)});
    case modifier::alibi: return body(alibi_t<T>{T(0.3)});
    case modifier::bucket: return body(bucket_t<T>{T(-0.7)});
  }
}

// softmax(causal(score_mod(S / root, f))) * V, S the dot product or a user
// similarity; then with a bias inside and a predicate mask outside.
template <class T>
void check_score_mod(modifier mf, std::size_t n, std::size_t m, std::size_t d, std::size_t dv, std::uint32_t seed) {
  if (test::emulation_skips(n, m, d, dv)) return;
  // Entries of size a give dot products of size a²√d / root ~ a²: 2.2² ≈ 5,
  // scores up to ~20, which the soft cap at 5 bends.
  inputs<T> in(n, m, d, d, dv, seed, 2.2);
  const T root = qkv::sqrt(T(d));
  const auto q = ref::from(in.Q), k = ref::from(in.K), v = ref::from(in.V), b = ref::from(in.B);
  const window_t win{std::ptrdiff_t(n), std::ptrdiff_t(m), 100};
  with_modifier<T>(mf, [&](const auto& f) {
    INFO(name(mf) << ", n = " << n << ", m = " << m << ", d = " << d << ", dv = " << dv << ", " << type_name(T())
                  << ", kernels " << active_arch());
    {
      INFO("causal(score_mod(Q Kᵀ / root, f))");
      scores sc = modified(scaled<T>(dot_scores<T>(q, k), 1 / static_cast<real>(root)), f);
      sc.s = ref::causal(sc.s);
      check_pair<T>(eval(softmax(causal(score_mod(in.Q * transpose(in.K) / root, f))) * in.V, naive),
                    eval(softmax(causal(score_mod(in.Q * transpose(in.K) / root, f))) * in.V, fused), sc, v);
    }
    {
      INFO("masked(score_mod(similarity(Q, K, -l1) / root + B, f), window)");
      scores sc = modified(scaled<T>(neg_l1_scores<T>(q, k), 1 / static_cast<real>(root), &b), f);
      sc.s = masked_by(sc.s, win);
      auto e = softmax(masked(score_mod(similarity(in.Q, in.K, neg_l1_t{}) / root + in.B, f), win)) * in.V;
      check_pair<T>(eval(e, naive), eval(e, fused), sc, v);
    }
    {
      INFO("causal(masked(score_mod(Q Kᵀ / root, f), M))");
      scores sc = modified(scaled<T>(dot_scores<T>(q, k), 1 / static_cast<real>(root)), f);
      sc.s = ref::causal(ref::masked(sc.s, in.M));
      auto e = softmax(causal(masked(score_mod(in.Q * transpose(in.K) / root, f), in.M))) * in.V;
      check_pair<T>(eval(e, naive), eval(e, fused), sc, v);
    }
  });
}

}  // namespace

TEST_CASE("score_mod: soft-capping and ALiBi and buckets under causal match the reference", "[extension][score_mod]") {
  const auto [n, m, d, dv] = GENERATE(extension_sizes());
  for (modifier f : {modifier::softcap, modifier::alibi, modifier::bucket}) {
    check_score_mod<float>(f, n, m, d, dv, std::uint32_t(n * 3 + m + d));
    check_score_mod<double>(f, n, m, d, dv, std::uint32_t(n * 5 + m + d));
  }
}

TEST_CASE("score_mod sees the scores before the masks and the row term", "[extension][score_mod]") {
  inputs<float> in(70, 300, 17, 17, 20, 31);
  const float root = qkv::sqrt(17.0f);
  const auto q = ref::from(in.Q), k = ref::from(in.K), v = ref::from(in.V);
  const softcap_t<float> cap{2.0f};
  const alibi_t<float> alibi{0.25f};

  // A modifier wrapping a mask has no fused form (it would see −∞); eval(e)
  // evaluates it node by node, the modifier seeing the masked scores: the
  // soft cap turns −∞ into −c, so masked keys get weight again.
  {
    auto e = softmax(score_mod(masked(in.Q * transpose(in.K) / root, in.M), cap)) * in.V;
    scores sc = scaled<float>(dot_scores<float>(q, k), 1 / static_cast<real>(root));
    sc.s = ref::masked(sc.s, in.M);
    sc = modified(sc, cap);
    check_pair<float>(eval(e, naive), eval(e), sc, v);
    CHECK(same_bits(eval(e), eval(e, naive)));
    // Rows of M that are all false are not zero here: every key weighs e^−c alike.
    CHECK(!zero_row(eval(e), 1));
  }
  // ALiBi keeps −∞ at −∞: score_mod(causal(S)) is causal(score_mod(S)).
  {
    auto inner = softmax(score_mod(causal(in.Q * transpose(in.K) / root), alibi)) * in.V;
    auto outer = softmax(causal(score_mod(in.Q * transpose(in.K) / root, alibi))) * in.V;
    CHECK(same_bits(eval(inner), eval(outer, naive)));
    scores sc = modified(scaled<float>(dot_scores<float>(q, k), 1 / static_cast<real>(root)), alibi);
    sc.s = ref::causal(sc.s);
    check_pair<float>(eval(inner, naive), eval(outer, fused), sc, v);
  }
  // Around neg_sq_l2 the modifier must see the whole −‖q − k‖²: the fused
  // kernel adds the row's −‖q‖², which softmax alone lets it leave out. Both
  // the whole loop in this unit (QKV_ARCH forced to this unit's instruction
  // set) and the rows path (the library on a wider one) read it.
  {
    // Scores near −3, capped at 2: leaving −‖q‖² out would change the result.
    auto e = softmax(causal(score_mod(similarity(in.Q, in.K, neg_sq_l2) / root, cap))) * in.V;
    STATIC_REQUIRE(fuses<decltype(e)>);
    scores sc = modified(scaled<float>(neg_sq_l2_scores<float>(q, k), 1 / static_cast<real>(root)), cap);
    sc.s = ref::causal(sc.s);
    check_pair<float>(eval(e, naive), eval(e, fused), sc, v);
    // The same in double, with a bias inside and a predicate outside.
    inputs<double> d(70, 300, 17, 17, 20, 32);
    const auto qd = ref::from(d.Q), kd = ref::from(d.K), vd = ref::from(d.V), bd = ref::from(d.B);
    const window_t win{70, 300, 40};
    auto ed = softmax(masked(score_mod(similarity(d.Q, d.K, neg_sq_l2) / std::sqrt(17.0) + d.B, softcap_t<double>{2.0}), win)) * d.V;
    scores sd = modified(scaled<double>(neg_sq_l2_scores<double>(qd, kd), 1 / std::sqrt(real(17)), &bd), softcap_t<double>{2.0});
    sd.s = masked_by(sd.s, win);
    check_pair<double>(eval(ed, naive), eval(ed, fused), sd, vd);
  }
  // A modifier inside a scaling, two modifiers, a predicate inside a
  // modifier: no fused form, the best strategy falls back, still right.
  {
    auto e = softmax(score_mod(in.Q * transpose(in.K), cap) / root) * in.V;
    scores raw = modified(scaled<float>(dot_scores<float>(q, k), 1), cap);
    // The division by root after the cap: u|s'| and the root's rounding.
    scores sc{ref::scale(raw.s, 1 / static_cast<real>(root)), ref::scale(raw.err, 1 / static_cast<real>(root))};
    for (std::size_t x = 0; x < sc.s.v.size(); ++x) sc.err.v[x] += 2 * ref::unit_roundoff<float> * std::fabs(sc.s.v[x]);
    check_pair<float>(eval(e, naive), eval(e), sc, v);
  }
  {
    auto e = softmax(score_mod(score_mod(in.Q * transpose(in.K) / root, alibi), cap)) * in.V;
    const scores sc = modified(modified(scaled<float>(dot_scores<float>(q, k), 1 / static_cast<real>(root)), alibi), cap);
    check_pair<float>(eval(e, naive), eval(e), sc, v);
  }
  {
    const window_t win{70, 300, 50};
    auto e = softmax(score_mod(masked(in.Q * transpose(in.K) / root, win), alibi)) * in.V;
    scores sc = modified(scaled<float>(dot_scores<float>(q, k), 1 / static_cast<real>(root)), alibi);
    sc.s = masked_by(sc.s, win);
    check_pair<float>(eval(e, naive), eval(e), sc, v);
  }
  // score_mod node by node equals the modifier applied to the evaluated scores.
  {
    const auto S = eval(in.Q * transpose(in.K) / root);
    const auto Sm = eval(score_mod(in.Q * transpose(in.K) / root, alibi));
    for (std::size_t i = 0; i < 70; ++i)
      for (std::size_t j = 0; j < 300; ++j) REQUIRE(Sm(i, j) == S(i, j) - 0.25f * (float(i) - float(j)));
  }
}

// ---------------------------------------------------------------------------
// masked(S, pred)
