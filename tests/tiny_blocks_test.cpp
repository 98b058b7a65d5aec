// The attention kernel with block sizes far below the library's (a
// `blocking` is a template argument): one register tile of queries a block,
// two panels of the tile's keys a block (16 keys with 4 lanes), of which one
// a mask hides whole at either end is skipped, partial sums of 8 keys,
// decoding up to 2 queries in parts of 16 keys. Every tail, skipped block,
// rescaling and decode merge then shows on inputs of a few dozen rows,
// checked against the long-double reference.
#include <catch2/catch.hpp>

#include "support.hpp"

#include <qkv/kernels/attention.hpp>
#include <qkv/storage/aligned_buffer.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace {

using arch = xsimd::default_arch;
using qkv::kernels::blocking;

template <class T>
constexpr blocking tiny() {
  blocking b = qkv::kernels::blocking_of<arch, T>();
  b.query_rows = b.tile_rows;
  b.max_key_block = 2 * b.tile_cols();  // two panels a block, of which a masked one at either end is skipped
  b.mask_stretch = b.tile_cols();
  b.l2_elements = 1 << 20;
  b.sum_chunk = 8;
  b.decode_rows = 2;
  b.decode_split = 16;
  return b;
}

template <class T>
using tiny_kernel = qkv::kernels::attention_kernel<arch, T, qkv::kernels::no_extension, tiny<T>()>;

// The whole problem on one thread, as the scheduler would run it.
template <class T>
void run(const qkv::kernels::attention_problem<T>& p) {
  using K = tiny_kernel<T>;
  using buffer = qkv::detail::aligned_buffer<T>;
  const std::size_t n = p.q.rows, m = p.k.rows, dk = p.q.cols, dv = p.v.cols;
  buffer shared(K::shared_size(n, m, dk, dv) + 1), scratch(K::scratch_size(n, m, dv) + 1);
  const std::size_t parts = K::decode_parts(n, m);
  if (parts != 0) {
    buffer kept(parts * K::decode_part_size(n, dv) + 1);
    K::decode(p, scratch.data(), kept.data());
    return;
  }
  K::pack(p, shared.data());
  K::blocks(p, shared.data(), 0, (n + K::block_rows() - 1) / K::block_rows(), scratch.data());
}

}  // namespace

TEMPLATE_TEST_CASE("tiny blocks: every tail, skip and merge against the reference", "[attention][blocking]", float,
                   double) {
  using T = TestType;
  static_assert(tiny<T>().valid());
  ref::rng rng(11);
  const T nan = std::numeric_limits<T>::quiet_NaN();
  for (const std::size_t n : {1, 2, 3, 5, 9, 13})
    for (const std::size_t m : {1, 7, 8, 9, 17, 33})
      for (const std::size_t dk : {3, 8})
        for (const std::size_t dv : {1, 5, 17})
          for (const int form : {0, 1, 2}) {  // plain, causal, a mask hiding a stripe of keys
            qkv::matrix<T, qkv::dyn, qkv::dyn> Q(n, dk), K(m, dk), V(m, dv), O(n, dv);
            qkv::matrix<bool, qkv::dyn, qkv::dyn> M(n, m);
            rng.fill(Q, -2, 2), rng.fill(K, -2, 2), rng.fill(V);
            // The mask hides from every row the second key block (skipped
            // whole) and key 3 (inside a block that is computed), whose keys
            // and values hold NaN, which must never be read; and a
            // scattering of keys elsewhere (some rows then see none).
            for (std::size_t i = 0; i < n; ++i)
              for (std::size_t j = 0; j < m; ++j) M(i, j) = j / 8 != 1 && j != 3 && (i + j) % 5 != 0;
            if (form == 2)
              for (std::size_t j = 3; j < m && j < 16; ++j)
                if (j == 3 || j >= 8) K(j, 0) = V(j, 0) = nan;
            qkv::kernels::attention_problem<T> p;
            p.q = {Q.data(), n, dk, static_cast<std::ptrdiff_t>(dk), 1};
            p.k = {K.data(), m, dk, static_cast<std::ptrdiff_t>(dk), 1};
            p.v = {V.data(), m, dv, static_cast<std::ptrdiff_t>(dv), 1};
            p.out = {O.data(), n, dv, static_cast<std::ptrdiff_t>(dv), 1};
            p.scale = T(0.5);
            p.bounds.causal = form == 1;
            if (form == 2) p.mask = {M.data(), n, m, static_cast<std::ptrdiff_t>(m), 1};
            run(p);

            const ref::mat q = ref::from(Q), k = ref::from(K), v = ref::from(V);
            ref::mat scores = ref::scale(ref::matmul(q, ref::transpose(k)), 0.5L);
            if (form == 1) scores = ref::causal(scores);
            if (form == 2) scores = ref::masked(scores, M);
            const ref::mat weights = ref::softmax(scores);
            ref::mat want(n, dv);
            for (std::size_t i = 0; i < n; ++i)
              for (std::size_t j = 0; j < m; ++j)
                if (weights(i, j) != 0)
                  for (std::size_t c = 0; c < dv; ++c) want(i, c) += weights(i, j) * v(j, c);
            const ref::mat bound = ref::attention_bound<T>(q, k, v, 0.5L, scores, weights);
            INFO("n = " << n << ", m = " << m << ", dk = " << dk << ", dv = " << dv << ", form " << form);
            REQUIRE(ref::worst_ratio(O, want, bound) <= 1);
          }
}
