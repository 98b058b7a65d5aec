// The one rule for which keys a row sees (kernels/key_bounds.hpp), against
// its definition written out pair by pair: row i of n stands at
// i' = i + (m − n) + shift and sees key j when i' − left ≤ j ≤ i' + right,
// and j ≤ i' under causal. Every question asked of the rule (a row's keys,
// a pair, a block of pairs, the strips of a key block, the visible pairs of
// a whole problem) is checked against that sentence, on small shapes with
// n < m, n = m and n > m, shifts either way, and bounds past every key.
#include <catch2/catch.hpp>

#include <qkv/kernels/key_bounds.hpp>

#include <cstddef>
#include <vector>

namespace {

using qkv::kernels::key_bounds;

bool defined_sees(const key_bounds& b, std::size_t n, std::size_t m, std::size_t i, std::size_t j) {
  const long long ip = static_cast<long long>(i) + static_cast<long long>(m) - static_cast<long long>(n) + b.shift;
  const long long jj = static_cast<long long>(j);
  // An extent past 2³⁰ reaches past every key of these shapes (and would
  // overflow as a long long near no_bound).
  const auto extent = [](std::size_t x) { return static_cast<long long>(x < (1u << 30) ? x : (1u << 30)); };
  if (b.causal && jj > ip) return false;
  if (b.left != key_bounds::no_bound && jj < ip - extent(b.left)) return false;
  if (b.right != key_bounds::no_bound && jj > ip + extent(b.right)) return false;
  return true;
}

std::vector<key_bounds> all_bounds() {
  std::vector<key_bounds> all;
  const std::size_t extents[] = {0, 1, 3, 7, key_bounds::no_bound - 1, key_bounds::no_bound};
  for (bool causal : {false, true})
    for (std::size_t left : extents)
      for (std::size_t right : extents)
        for (std::ptrdiff_t shift : {-9, -2, 0, 3, 11}) {
          key_bounds b;
          b.causal = causal, b.left = left, b.right = right, b.shift = shift;
          all.push_back(b);
        }
  return all;
}

}  // namespace

TEST_CASE("key bounds: each question the rule answers agrees with its definition", "[bounds]") {
  using namespace qkv::kernels;
  for (const key_bounds& b : all_bounds())
    for (std::size_t n : {0u, 1u, 5u, 13u})
      for (std::size_t m : {0u, 1u, 6u, 13u, 20u}) {
        INFO("n " << n << " m " << m << " causal " << b.causal << " left " << b.left << " right " << b.right
                  << " shift " << b.shift);
        std::size_t pairs = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const std::size_t begin = key_begin(b, n, m, i), end = key_end(b, n, m, i);
          REQUIRE(end <= m);
          for (std::size_t j = 0; j < m; ++j) {
            const bool seen = defined_sees(b, n, m, i, j);
            REQUIRE(sees(b, n, m, i, j) == seen);
            REQUIRE((j >= begin && j < end) == seen);
            pairs += seen ? 1 : 0;
          }
        }
        REQUIRE(visible_pairs(b, n, m) == pairs);
        // Blocks of rows and keys: some pair seen exactly when sees_any says so.
        for (std::size_t i0 = 0; i0 < n; i0 += 2)
          for (std::size_t rows : {1u, 3u})
            for (std::size_t j0 = 0; j0 < m; j0 += 3)
              for (std::size_t cols : {1u, 4u}) {
                const std::size_t r = i0 + rows <= n ? rows : n - i0, c = j0 + cols <= m ? cols : m - j0;
                bool any = false;
                for (std::size_t i = i0; i < i0 + r; ++i)
                  for (std::size_t j = j0; j < j0 + c; ++j) any = any || defined_sees(b, n, m, i, j);
                REQUIRE(sees_any(b, n, m, i0, r, j0, c) == any);
              }
        // A key block's strips: every key a strip's rows see lies in
        // [first, keys), first on a panel boundary, and nothing past keys.
        constexpr std::size_t strip = 2, panel = 4;
        for (std::size_t j0 = 0; j0 < m; j0 += 8) {
          const std::size_t count = m - j0 < 8 ? m - j0 : 8;
          std::size_t first[8] = {}, keys[8] = {};
          strip_keys(b, n, m, 0, n, j0, count, strip, panel, first, keys);
          for (std::size_t ir = 0; ir < n; ir += strip) {
            const std::size_t s = ir / strip;
            REQUIRE(first[s] <= keys[s]);
            REQUIRE(keys[s] <= count);
            REQUIRE((first[s] % panel == 0 || first[s] == keys[s]));
            std::size_t last_seen = 0;
            bool seen_any = false;
            for (std::size_t i = ir; i < ir + strip && i < n; ++i)
              for (std::size_t j = 0; j < count; ++j)
                if (defined_sees(b, n, m, i, j0 + j)) {
                  REQUIRE(j >= first[s]);
                  REQUIRE(j < keys[s]);
                  last_seen = j, seen_any = true;
                }
            // keys is the strip's last row's end: tight where that row sees any key of the block.
            if (seen_any && ir + strip <= n && defined_sees(b, n, m, ir + strip - 1, j0 + last_seen))
              REQUIRE(keys[s] == last_seen + 1);
          }
        }
      }
}

TEST_CASE("key bounds: causal and windows intersect, and the causal count has its closed form", "[bounds]") {
  using namespace qkv::kernels;
  key_bounds b;
  REQUIRE(b.none());
  b.narrow(5, 2).narrow(3, 9);
  REQUIRE(b.left == 3);
  REQUIRE(b.right == 2);
  REQUIRE(!b.none());
  key_bounds c;
  c.causal = true;
  // Row i of n sees min(m, i + m − n + 1) keys (none where that is not positive).
  for (std::size_t n : {1u, 7u, 300u})
    for (std::size_t m : {1u, 7u, 301u}) {
      std::size_t expected = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const long long k = static_cast<long long>(i + m) - static_cast<long long>(n) + 1;
        expected += k <= 0 ? 0 : (static_cast<std::size_t>(k) < m ? static_cast<std::size_t>(k) : m);
      }
      REQUIRE(visible_pairs(c, n, m) == expected);
    }
  static_assert(visible_pairs(key_bounds{true}, 4, 4) == 10, "constexpr, for qkv::cost of static shapes");
}
