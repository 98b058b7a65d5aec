// Which keys a row sees: the one rule. Causal and windows bound each row's
// keys by its position among them; every place that asks (the fused kernels
// forward, decode and backward, the naive masks, the gradient rules, the cost
// model, parts of a sequence and qkv::mpi) asks these functions, so a new
// kind of bound is a change here and to the node that sets it.
#pragma once

#include <cstddef>
#include <limits>

namespace qkv::kernels {

// The bounds of a score chain, in integers alone. Over n rows and m keys,
// row i stands at position i' = i + (m − n) + shift among the keys (the last
// query at the last key, as causal aligns it, unless the rows and keys are
// parts of a longer sequence: parts/part.hpp), or at i' = i + shift where
// the chain says where its rows and keys stand (positioned: positions(S, q0,
// k0) gives shift = q0 − k0, whatever n and m), and sees the keys j with
//   i' − left ≤ j ≤ i' + right,   and j ≤ i' under causal,
// no_bound on a side meaning none there. Causal and windows intersect.
struct key_bounds {
  static constexpr std::size_t no_bound = std::numeric_limits<std::size_t>::max();
  bool causal = false;
  std::size_t left = no_bound, right = no_bound;
  std::ptrdiff_t shift = 0;
  bool positioned = false;

  // This bound and a window of left and right extents, both.
  constexpr key_bounds& narrow(std::size_t l, std::size_t r) {
    left = l < left ? l : left;
    right = r < right ? r : right;
    return *this;
  }
  // Whether every row sees every key.
  constexpr bool none() const { return !causal && left == no_bound && right == no_bound; }
  friend constexpr bool operator==(const key_bounds&, const key_bounds&) = default;
};

// Row i's position among m keys, of n rows.
constexpr std::ptrdiff_t key_position(const key_bounds& b, std::size_t n, std::size_t m, std::size_t i) {
  if (b.positioned) return static_cast<std::ptrdiff_t>(i) + b.shift;
  return static_cast<std::ptrdiff_t>(i + m) - static_cast<std::ptrdiff_t>(n) + b.shift;
}

namespace key_bounds_detail {
// A bound of x keys from i', clamped where it reaches past every key from
// any row (no_bound among them), so that the sums cannot overflow.
constexpr std::ptrdiff_t reach(const key_bounds& b, std::size_t n, std::size_t m, std::size_t x) {
  const std::size_t shift = static_cast<std::size_t>(b.shift < 0 ? -b.shift : b.shift);
  const std::size_t far = m + n + shift + 1;
  return static_cast<std::ptrdiff_t>(x < far ? x : far);
}
constexpr std::size_t clamp(std::size_t m, std::ptrdiff_t j) {
  if (j <= 0) return 0;
  return static_cast<std::size_t>(j) < m ? static_cast<std::size_t>(j) : m;
}
}  // namespace key_bounds_detail

// The keys row i sees are [key_begin, key_end) (empty when end ≤ begin).
constexpr std::size_t key_end(const key_bounds& b, std::size_t n, std::size_t m, std::size_t i) {
  const std::size_t right = b.causal ? 0 : b.right;  // (a window's right bound is at least 0)
  if (right == key_bounds::no_bound) return m;
  return key_bounds_detail::clamp(m, key_position(b, n, m, i) + key_bounds_detail::reach(b, n, m, right) + 1);
}
constexpr std::size_t key_begin(const key_bounds& b, std::size_t n, std::size_t m, std::size_t i) {
  if (b.left == key_bounds::no_bound) return 0;
  return key_bounds_detail::clamp(m, key_position(b, n, m, i) - key_bounds_detail::reach(b, n, m, b.left));
}

// Whether row i sees key j.
constexpr bool sees(const key_bounds& b, std::size_t n, std::size_t m, std::size_t i, std::size_t j) {
  return j >= key_begin(b, n, m, i) && j < key_end(b, n, m, i);
}

// Whether some row of [i0, i0 + rows) sees a key of [j0, j0 + cols) (both
// ends of a row's keys grow with the row).
constexpr bool sees_any(const key_bounds& b, std::size_t n, std::size_t m, std::size_t i0, std::size_t rows,
                        std::size_t j0, std::size_t cols) {
  return rows > 0 && key_end(b, n, m, i0 + rows - 1) > j0 && key_begin(b, n, m, i0) < j0 + cols;
}

// The keys of a block [j0, j0 + count) that each strip of `strip` rows of
// [i0, i0 + rows) sees, from j0: strip s sees [first[s], keys[s]), its first
// row's first key rounded down to a panel of `panel` keys, its last row's
// end key (rows of a strip that see fewer are masked where the scores are).
// On the causal diagonal keys[s] < count, above it 0; a window's later strips
// start past 0.
constexpr void strip_keys(const key_bounds& b, std::size_t n, std::size_t m, std::size_t i0, std::size_t rows,
                          std::size_t j0, std::size_t count, std::size_t strip, std::size_t panel, std::size_t* first,
                          std::size_t* keys) {
  for (std::size_t ir = 0; ir < rows; ir += strip) {
    const std::size_t end = key_end(b, n, m, i0 + (ir + strip < rows ? ir + strip : rows) - 1);
    const std::size_t begin = key_begin(b, n, m, i0 + ir);
    const std::size_t sees = end > j0 ? (count < end - j0 ? count : end - j0) : 0;
    const std::size_t from = begin > j0 ? (begin - j0) / panel * panel : 0;
    keys[ir / strip] = sees;
    first[ir / strip] = from < sees ? from : sees;
  }
}

// How many (row, key) pairs of n rows and m keys the bounds leave: the work
// of the pairs a fused kernel computes (eval/cost.hpp, parts, qkv::mpi).
constexpr std::size_t visible_pairs(const key_bounds& b, std::size_t n, std::size_t m) {
  if (n == 0 || m == 0) return 0;
  if (b.none()) return n * m;
  if (b.causal && b.left == key_bounds::no_bound && b.shift == 0 && !b.positioned) {
    // Row i sees min(m, i + m − n + 1) keys: the rows that see any see
    // first, first + 1, …, m.
    const std::size_t first = n > m ? 1 : m - n + 1;
    return (first + m) * (m - first + 1) / 2;
  }
  std::size_t pairs = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t a = key_begin(b, n, m, i), e = key_end(b, n, m, i);
    pairs += e > a ? e - a : 0;
  }
  return pairs;
}

}  // namespace qkv::kernels
