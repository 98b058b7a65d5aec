// Attention on bf16 pairs (kernels/attention_prefill_bf16.hpp): the kernel
// that runs on AVX512-BF16, with the weights rounded to bf16 before their
// product with V. Its pair products are run here on this unit's instruction
// set by bf16_pairs_emulated (two float FMAs per pair, the instruction's
// definition), so the kernel's packing, tails, strips, masks and its
// non-finite path are tested on every CPU, against the long-double reference
// with the bound derived in tests/reference.hpp. Through the dispatch the
// same bound holds on whatever set runs: on AVX512-BF16 that is the
// instruction itself, elsewhere the float products (a tighter result).
#include "reference.hpp"
#include "support.hpp"

#include <qkv/kernels/api.hpp>
#include <qkv/kernels/attention_prefill_bf16.hpp>
#include <qkv/storage/aligned_buffer.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

using namespace qkv;

namespace {

using arch = xsimd::default_arch;
using pairs = kernels::bf16_pairs_emulated<arch>;
using kernels::blocking;

constexpr blocking tiny() {
  blocking b = kernels::blocking_of<arch, float>();
  b.query_rows = b.tile_rows;
  b.max_key_block = b.tile_cols();
  b.l2_elements = 1 << 20;
  b.sum_chunk = 4;
  return b;
}

template <blocking B>
using pair_kernel = kernels::attention_prefill_bf16<pairs, B>;

// The whole problem on one thread, as the scheduler runs it.
template <blocking B>
void run(const kernels::attention_problem<float, bf16>& p) {
  using K = pair_kernel<B>;
  using buffer = detail::aligned_buffer<float>;
  const std::size_t n = p.q.rows, m = p.k.rows, dk = p.q.cols, dv = p.v.cols;
  buffer shared(B.pack_size(m, dk, dv) + 1), scratch(B.block_scratch_size(dv) + 1);
  K::pack(p, shared.data());
  K::blocks(p.without_kv_data(), shared.data(), 0, (n + B.query_rows - 1) / B.query_rows, scratch.data());
}

enum class form { plain, causal, mask, bias };

struct inputs {
  std::size_t n, m, dk, dv, kcs;  // K: every kcs-th column of its rows used
  std::size_t k0;                 // K's first value: k[k0] (1: rows off 4-byte boundaries)
  std::vector<bf16> k, v;
  std::vector<float> q, bias;  // q: bf16 values
  std::vector<char> keep;      // the mask, row-major
  form f;

  inputs(std::size_t n_, std::size_t m_, std::size_t dk_, std::size_t dv_, form f_, std::uint32_t seed,
         std::size_t kcs_ = 1, std::size_t k0_ = 0)
      : n(n_), m(m_), dk(dk_), dv(dv_), kcs(kcs_), k0(k0_), k(k0_ + m_ * dk_ * kcs_), v(m_ * dv_), q(n_ * dk_), bias(n_ * m_), keep(n_ * m_, 1), f(f_) {
    ref::rng rng(seed);
    for (auto& x : k) x = bf16(static_cast<float>(rng.uniform(-2, 2)));
    for (auto& x : v) x = bf16(static_cast<float>(rng.uniform(-1, 1)));
    for (auto& x : q) x = static_cast<float>(bf16(static_cast<float>(rng.uniform(-2, 2))));
    for (auto& x : bias) x = static_cast<float>(rng.uniform(-1, 1));
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < m; ++j) keep[i * m + j] = (i * 7 + j * 3) % 5 != 0 && !(i == n / 2 && n > 2);
    // Under causal the last value row holds ∞ and NaN, which the rows that
    // may not see it must never read (0·∞ is NaN).
    if (poisoned()) {
      v[(m - 1) * dv] = bf16(std::numeric_limits<float>::infinity());
      if (dv > 1) v[(m - 1) * dv + 1] = bf16(std::numeric_limits<float>::quiet_NaN());
    }
  }

  kernels::attention_problem<float, bf16> problem(float* out, bool queries_bf16) const {
    kernels::attention_problem<float, bf16> p;
    p.q = {q.data(), n, dk, static_cast<std::ptrdiff_t>(dk), 1};
    p.k = {k.data() + k0, m, dk, static_cast<std::ptrdiff_t>(dk * kcs), static_cast<std::ptrdiff_t>(kcs)};
    p.v = {v.data(), m, dv, static_cast<std::ptrdiff_t>(dv), 1};
    p.out = {out, n, dv, static_cast<std::ptrdiff_t>(dv), 1};
    p.scale = 1.0f / std::sqrt(static_cast<float>(dk));
    p.bounds.causal = f == form::causal;
    if (f == form::mask) p.mask = {reinterpret_cast<const bool*>(keep.data()), n, m, static_cast<std::ptrdiff_t>(m), 1};
    if (f == form::bias) p.bias = {bias.data(), n, m, static_cast<std::ptrdiff_t>(m), 1};
    p.queries_in_storage_type = queries_bf16;
    return p;
  }

  // Under causal the last row sees the value row holding ∞ and NaN: its
  // output is not finite, and only the rows before it are compared.
  bool poisoned() const { return f == form::causal && m > n; }

  struct expected {
    ref::mat want, bound;
  };
  expected reference() const {
    ref::mat qr(n, dk), kr(m, dk), vr(m, dv);
    for (std::size_t x = 0; x < q.size(); ++x) qr.v[x] = q[x];
    for (std::size_t j = 0; j < m; ++j)
      for (std::size_t c = 0; c < dk; ++c) kr(j, c) = static_cast<float>(k[k0 + (j * dk + c) * kcs]);
    for (std::size_t x = 0; x < v.size(); ++x) vr.v[x] = static_cast<float>(v[x]);
    const ref::real scale = 1.0f / std::sqrt(static_cast<float>(dk));
    ref::mat s = ref::scale(ref::matmul(qr, ref::transpose(kr)), scale);
    if (f == form::causal) s = ref::causal(s);
    if (f == form::bias)
      for (std::size_t x = 0; x < s.v.size(); ++x) s.v[x] += bias[x];
    if (f == form::mask)
      for (std::size_t x = 0; x < s.v.size(); ++x)
        if (!keep[x]) s.v[x] = -std::numeric_limits<ref::real>::infinity();
    const ref::mat p = ref::softmax(s);
    // 0·∞ in the reference's own product: the hidden value row is left out.
    ref::mat want(n, dv);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < m; ++j)
        if (p(i, j) != 0)
          for (std::size_t c = 0; c < dv; ++c) want(i, c) += p(i, j) * vr(j, c);
    // The bias rides in the scores' fused multiply-add: 3u|s| covers it.
    return {want, ref::attention_bound_bf16_pairs(qr, kr, vr, scale, s, p)};
  }
};

// Largest error over the bound on the rows that must be finite; the last
// row of a poisoned case must hold NaN where the NaN value is.
template <class M>
ref::real worst(const inputs& in, const M& got, const inputs::expected& e) {
  ref::real r = 0;
  const std::size_t rows = in.poisoned() ? in.n - 1 : in.n;
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t c = 0; c < in.dv; ++c) {
      const ref::real err = std::fabs(static_cast<ref::real>(got(i, c)) - e.want(i, c));
      if (!(err <= e.bound(i, c))) r = std::fmax(r, std::isnan(err) ? ref::real(1e30) : err / e.bound(i, c));
    }
  if (in.poisoned() && in.dv > 1 && !std::isnan(got(in.n - 1, 1))) r = 1e30;
  return r;
}

const char* name(form f) {
  switch (f) {
    case form::plain: return "plain";
    case form::causal: return "causal";
    case form::mask: return "mask with an empty row";
    case form::bias: return "bias";
  }
  return "";
}

struct shape {
  std::size_t n, m, dk, dv;
};

template <blocking B>
void check_pairs(shape sh, form f, std::size_t kcs, std::size_t k0 = 0) {
  const auto [n, m, dk, dv] = sh;
  INFO("n = " << n << ", m = " << m << ", dk = " << dk << ", dv = " << dv << ", " << name(f) << ", key block "
              << B.max_key_block << ", sum chunk " << B.sum_chunk << ", K column stride " << kcs << ", K from " << k0);
  const inputs in(n, m, dk, dv, f, static_cast<std::uint32_t>(n * 31 + m * 7 + dk + dv), kcs, k0);
  matrix<float, dyn, dyn> got(n, dv);
  run<B>(in.problem(got.data(), true));
  CHECK(worst(in, got, in.reference()) <= 1);
  if (f == form::mask && n > 2)
    for (std::size_t c = 0; c < dv; ++c) CHECK(got(n / 2, c) == 0.0f);  // the empty row: zeros

  // The weights were rounded: the float kernel on the same inputs differs.
  matrix<float, dyn, dyn> wide(n, dv);
  run<B>(in.problem(wide.data(), false));
  if (m >= 64 && f == form::plain) CHECK_FALSE(test::same_bits(got, wide));
}

}  // namespace

TEST_CASE("bf16 pairs: weights rounded as qkv::bf16 rounds them", "[half][pairs]") {
  constexpr std::size_t W = pairs::batch::size;
  ref::rng rng(5);
  std::vector<float> x;
  for (int i = 0; i < 4000; ++i) x.push_back(static_cast<float>(rng.uniform(-1, 1) * std::exp2(rng.uniform(-140, 130))));
  // Halfway cases of both parities, the largest float (to ∞), NaN, ∞, subnormals.
  for (std::uint32_t hi : {0x3f80u, 0x3f81u, 0xbf80u, 0x0001u, 0x7f7fu})
    for (std::uint32_t lo : {0x8000u, 0x7fffu, 0x8001u, 0xffffu}) x.push_back(std::bit_cast<float>(hi << 16 | lo));
  for (float special : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min(), -0.0f})
    x.push_back(special);
  while (x.size() % (2 * W) != 0) x.push_back(0.5f);
  std::vector<std::uint32_t> words(x.size() / 2);
  for (std::size_t i = 0; i < x.size(); i += 2 * W) pairs::round_pairs(x.data() + i, words.data() + i / 2);
  bool all = true;
  for (std::size_t i = 0; i < words.size(); ++i) {
    const std::uint32_t want = bf16(x[2 * i]).bits() | std::uint32_t(bf16(x[2 * i + 1]).bits()) << 16;
    all = all && words[i] == want;
  }
  CHECK(all);
}

TEST_CASE("attention on bf16 pairs stays within its bound over every tail", "[half][pairs][attention]") {
  constexpr blocking lib = kernels::blocking_of<arch, float>();
  const std::size_t w = lib.lanes;
  // Odd dk packs K word by word; even dk (with rows on 4-byte boundaries)
  // by register transposes of whole words, with a tail of words past the
  // last W and keys past the last panel. dv = 2W fills whole value panels.
  const std::vector<shape> shapes = {
      {5, 9, 1, 1},          {7, 13, 5, 3},       {9, 70, 2 * w + 1, w + 3},  {33, 130, 17, 2 * w + 1},
      {lib.query_rows + 3, lib.max_key_block + 9, 4 * w + 3, 4 * w + 1},
      {6, 11, 2, 2 * w},     {9, 71, 2 * w, w + 3}, {33, 130, 2 * w + 6, 2 * w},
      {lib.query_rows + 3, lib.max_key_block + 9, 4 * w, 4 * w},
  };
  for (const shape& sh : shapes) {
    if (test::emulation_skips(sh.n, sh.m, sh.dk, sh.dv)) continue;
    for (form f : {form::plain, form::causal, form::mask, form::bias}) {
      check_pairs<lib>(sh, f, 1);
      check_pairs<tiny()>(sh, f, f == form::plain ? 2 : 1);
    }
    check_pairs<lib>(sh, form::plain, 1, 1);  // K's rows 2 bytes off: word by word
  }
}

TEST_CASE("bf16 pairs leave float queries to the float products, bit for bit", "[half][pairs]") {
  // queries_in_storage_type false (float Q over a bf16 cache), or a Q that
  // holds a value bf16 cannot: packed as floats, the float kernel's bits.
  const inputs in(37, 90, 20, 11, form::causal, 3);
  for (bool flag : {false, true}) {
    inputs q_float = in;
    if (flag) q_float.q[5] = 0.1f;  // not a bf16 value
    matrix<float, dyn, dyn> got(in.n, in.dv), want(in.n, in.dv);
    run<kernels::blocking_of<arch, float>()>(q_float.problem(got.data(), flag));
    std::vector<float> kf(in.k.begin(), in.k.end()), vf(in.v.begin(), in.v.end());  // kcs = 1
    kernels::attention_problem<float> p = q_float.problem(want.data(), flag).without_kv_data();
    p.k = {kf.data(), in.m, in.dk, static_cast<std::ptrdiff_t>(in.dk), 1};
    p.v = {vf.data(), in.m, in.dv, static_cast<std::ptrdiff_t>(in.dv), 1};
    using float_kernel = kernels::attention_kernel<arch, float>;
    detail::aligned_buffer<float> shared(float_kernel::pack_size(in.m, in.dk, in.dv)),
        scratch(float_kernel::block_scratch_size(in.dv));
    float_kernel::pack(p, shared.data());
    float_kernel::blocks(p, shared.data(), 0, (in.n + float_kernel::block_rows() - 1) / float_kernel::block_rows(),
                         scratch.data());
    CHECK(test::same_bits(got, want));
  }
}

TEST_CASE("bf16 attention through the dispatch stays within the pair bound", "[half][pairs][attention]") {
  // On AVX512-BF16 this runs vdpbf16ps; on any other set the float products.
  const kernels::blocking b = kernels::active_blocking(sizeof(float));
  const std::size_t w = b.lanes;
  for (const shape sh : {shape{b.decode_rows + 1, 40, 3, 5}, shape{70, 300, 2 * w - 1, 2 * w + 5},
                         shape{b.query_rows + 3, b.max_key_block + 9, 4 * w, 4 * w}, shape{33, 131, 2 * w + 2, 2 * w}}) {
    if (test::emulation_skips(sh.n, sh.m, sh.dk, sh.dv)) continue;
    for (form f : {form::plain, form::causal, form::mask}) {
      INFO("n = " << sh.n << ", m = " << sh.m << ", dk = " << sh.dk << ", dv = " << sh.dv << ", " << name(f)
                  << ", kernels " << kernels::active_arch());
      const inputs in(sh.n, sh.m, sh.dk, sh.dv, f, static_cast<std::uint32_t>(sh.n + sh.m));
      matrix<float, dyn, dyn> got(sh.n, sh.dv);
      const auto p = in.problem(got.data(), true);
      kernels::attention(&p, 1);
      CHECK(worst(in, got, in.reference()) <= 1);
    }
  }
}
